"""What one hand-off between two TensorFlow processes costs on this host: the fixed time of a tensor
crossing from one task's device to another's through TensorFlow's runtime (gRPC's RecvTensor, the
rendezvous, the executors on both sides), and the bytes per second of a large one.

A stage-process plan hands every micro-batch's activations forward and its gradients back through
that runtime, so a hand-off costs far more than a raw TCP round trip: on loopback a tiny tensor's
crossing takes a few hundred microseconds, and a large one is copied and serialized on both sides.
``measure`` starts a TensorFlow server in a child process, connects a second process to it (as a
trainer connects to its stage tasks) and times graph functions that bounce a tensor between the
two devices (Grappler off, so each crossing's op stays): ``HOPS`` crossings of a one-float tensor
and of a ``LARGE_BYTES`` one, less a function that stays on the local device. Both processes run
one intra-op thread, as a plan's processes do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from params.errors import UserError
from trainer.planning import trial

HOPS = 20
LARGE_BYTES = 4 * 2**20
TIMEOUT_S = 180

# The client: connects to the server task (argv[1]) and prints {"hop_s": ..., "bytes_per_s": ...}.
CLIENT_CODE = """
import json, statistics, sys, time
from trainer import tf_startup
tf = tf_startup.import_tensorflow()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})  # keep every x * 1
server, client, hops, large = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tf.config.experimental_connect_to_cluster(
    tf.train.ClusterSpec({"stage": [server], "client": [client]}), job_name="client",
    make_master_device_default=False,
)
there, here = "/job:stage/replica:0/task:0/device:CPU:0", "/job:client/replica:0/task:0/device:CPU:0"

def bounce(crossings):
    @tf.function
    def run(x):
        for i in range(crossings):
            with tf.device(there if i % 2 == 0 else here):
                x = x * 1.0
        with tf.device(here):
            return tf.reduce_sum(x[:1])
    return run

def seconds(fn, x):
    for _ in range(3):
        fn(x).numpy()
    times = []
    for _ in range(9):
        start = time.perf_counter()
        fn(x).numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)

with tf.device(here):
    small, big = tf.ones([1]), tf.ones([large // 4])
base_small, base_big = seconds(bounce(0), small), seconds(bounce(0), big)
hop = (seconds(bounce(hops), small) - base_small) / hops
big_hop = (seconds(bounce(hops), big) - base_big) / hops
print(json.dumps({"hop_s": max(hop, 0.0), "bytes_per_s": large / max(big_hop - hop, 1e-9)}))
"""

SERVER_CODE = """
import sys, time
from trainer import tf_startup
tf = tf_startup.import_tensorflow()
config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
spec = tf.train.ClusterSpec({"stage": [sys.argv[1]], "client": [sys.argv[2]]})
tf.distribute.Server(spec, job_name="stage", task_index=0, config=config, start=True)
while True:
    time.sleep(1.0)
"""


def measure() -> tuple[float, float]:
    """(seconds of one crossing of a tiny tensor, bytes per second of a large one's crossing)."""
    root_dir = Path(__file__).resolve().parents[2]
    addresses = [f"127.0.0.1:{port}" for port in trial.free_ports(2)]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_CODE, *addresses],
        cwd=root_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", CLIENT_CODE, *addresses, str(HOPS), str(LARGE_BYTES)],
            cwd=root_dir,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    finally:
        server.kill()
        server.wait()
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise UserError(f"the gRPC hand-off measurement failed: {out.stderr.strip()[-300:]}")
    figures = json.loads(lines[-1])
    return float(figures["hop_s"]), float(figures["bytes_per_s"])
