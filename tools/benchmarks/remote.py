"""GPipe stages in other processes, as JSON lines: ``python -m tools.benchmark remote [--quick]``.

The pipeline is the dense stack of ``tools.benchmark gpipe`` (``gpipe.py``'s model and step: a
GPipeLayer of dense layers, the squared error computed per micro-batch in the last stage, plain SGD).
A cross-process side is a client process (the trainer's role: it builds the model with stage k on
``/job:worker/task:k/device:CPU:0``, connected with ``tf.config.experimental_connect_to_cluster``) and
K stage processes (``tf.distribute.Server``, as ``python -m trainer --mode=stages`` runs); each stage
process is pinned to its own core with 1 intra-op and 2 inter-op threads. The batch and its targets
are made on the first and last stage's devices once (what the stages exchange is measured, not the
trainer's input pipeline); each SGD update runs on its variable's device.

- remote_speed_vs_local_k2: the step seconds of K=2 on logical devices in one process (gpipe.py's
  pipeline side: the same 2 cores, 1 intra-op and 2 inter-op threads) over the step seconds of K=2
  across processes. Higher is better; below 1 is the price of gRPC hand-offs and of stages bound to
  their processes.
- remote_speedup_k2: the plain stack (no GPipe layer, no remat) on one core, 1 intra-op thread, over
  the K=2 cross-process step. Speed model: 16 dense layers of width 1024, relu, global batch 4096,
  M=8, remat never (theory 2M/(M+K-1) = 1.78).
- remote_client_cpu_share_k2: the client process's CPU seconds over wall seconds in the timed steps
  of that K=2 run: near 0 when the stages' forward and backward run in the stage processes.
- remote_rss_ratio_k2, remote_rss_ratio_k4: the peak resident memory (VmHWM) of the largest process
  of the K-process pipeline (client or stage) over the peak of the same model trained in one process
  on K logical devices; same global batch, M and remat (always). Memory model: 16 dense layers of
  width 8192 (4 GiB of weights and 4 GiB of gradients per step; the one-process side peaks near
  9.4 GiB), batch 64, M=4: TensorFlow's own footprint (about 0.6 GiB resident per process here,
  measured with a tiny model) is then a sixteenth of the one-process peak, so the model decides the
  ratio. An ideal K-stage split is about (0.6 + 8/K) / (0.6 + 8) GiB: 0.54 for K=2, 0.30 for K=4.
  (At 8 layers, 2 GiB, TensorFlow's share made 0.35 the ideal at K=4 and 0.38 was measured.)

The speed sides run together and step in alternating rounds (the best step counts); the memory sides
run one after the other, a warm-up and ``--steps`` steps each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from tools.benchmarks import gpipe, harness

NAME = "remote"
FIGURES = ("speed", "rss")


# ------------------------------------------------------------------------------------------ workers
def run_stage(spec: dict) -> int:
    """A stage process: pinned and threaded as ``spec`` says, serves until its stdin closes."""
    if spec.get("cpus"):
        os.sched_setaffinity(0, set(spec["cpus"]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=spec["intra_op_threads"],
        inter_op_parallelism_threads=spec["inter_op_threads"],
    )
    cluster = tf.train.ClusterSpec({"worker": spec["addresses"]})
    server = tf.distribute.Server(cluster, job_name="worker", task_index=spec["task"], config=config)
    print(json.dumps({"ready": True, "target": server.target}), flush=True)
    sys.stdin.read()  # the driver closes it: then this process ends
    return 0


def _client_step(spec: dict) -> tuple[Any, Any]:
    """The client's compiled step over the stage processes (gpipe.py's model and head)."""
    tf = harness.configure(spec)
    from layers.base_layer import FPropContext

    cluster = tf.train.ClusterSpec({"worker": spec["addresses"]})
    tf.config.experimental_connect_to_cluster(cluster, make_master_device_default=False)
    devices = [f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(spec["stages"])]
    from layers.parallel import device_choice as pipeline_devices

    with pipeline_devices.parts_on(devices, "the benchmark's stage processes"):
        model = gpipe._model({**spec, "model": "gpipe"})
    shape = [spec["batch"], spec["width"]]
    with tf.device(devices[0]):
        x = tf.random.stateless_normal(shape, [1, 2])
    with tf.device(devices[-1]):
        target = tf.random.stateless_normal(shape, [3, 4])
    variables = model.trainable_variables

    def squared_errors(ctx: Any, y: Any, t: Any) -> Any:
        return tf.reduce_sum(tf.square(y - t), axis=-1)

    @tf.function(autograph=False)
    def step() -> Any:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            per_example = model(ctx, x, head=squared_errors, head_inputs=target)
            loss = tf.reduce_sum(per_example) / float(spec["batch"] * spec["width"])
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            with tf.device(v.device):
                v.assign_sub(0.01 * g)
        return loss

    return step, variables


def run_client(spec: dict) -> int:
    step, _ = _client_step(spec)
    return harness.serve(spec, step)


# ------------------------------------------------------------------------------------------ driver
class Pipeline:
    """K stage processes (one core each) and the client worker, on free loopback ports."""

    def __init__(self, spec: dict, cpus: list[int]) -> None:
        from tools.local_cluster import HOST, free_ports

        k = spec["stages"]
        addresses = [f"{HOST}:{p}" for p in free_ports(k)]
        self.stages: list[subprocess.Popen] = []
        try:
            for task in range(k):
                stage = {
                    "addresses": addresses,
                    "task": task,
                    "cpus": [cpus[task % len(cpus)]],
                    "intra_op_threads": 1,
                    "inter_op_threads": 2,
                }
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tools.benchmarks.remote", f"--stage={json.dumps(stage)}"],
                    cwd=harness.REPO_ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                self.stages.append(proc)
            for proc in self.stages:
                line = proc.stdout.readline()
                if not line.startswith("{"):
                    raise RuntimeError(f"a stage process failed to start ({proc.poll()})")
            self.client = harness.Worker(NAME, {**spec, "addresses": addresses, "client": True})
        except BaseException:
            self.close()
            raise

    def peak_rss(self) -> dict[str, int]:
        peaks = {f"stage_{k}": harness.peak_rss_bytes(p.pid) for k, p in enumerate(self.stages)}
        return {"client": self.client.peak_rss_bytes(), **peaks}

    def close(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        for proc in self.stages:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _speed(args: argparse.Namespace, cpus: list[int]) -> None:
    dense = dict(width=args.width, depth=args.depth, batch=args.batch, activation="relu", warmup=args.warmup)
    dense["measure"] = "time"
    pipeline = dict(dense, stages=2, micro_batches=args.micro_batches, remat="never")
    local_spec = dict(pipeline, model="gpipe_head", logical_devices=2, cpus=cpus[:2])
    local_spec.update(intra_op_threads=1, inter_op_threads=2)
    plain_spec = dict(dense, model="plain", cpus=cpus[:1], intra_op_threads=1, inter_op_threads=1)
    client_spec = dict(pipeline, cpus=cpus[:2], intra_op_threads=1, inter_op_threads=2)
    remote = Pipeline(client_spec, cpus)
    workers = {"remote": remote.client}
    try:
        workers["local"] = harness.Worker("gpipe", local_spec)
        workers["plain"] = harness.Worker("gpipe", plain_spec)
        for worker in workers.values():
            worker.read()  # ready
        times: dict[str, list[float]] = {side: [] for side in workers}
        cpu_share: list[float] = []
        for _ in range(args.steps):
            for side, worker in workers.items():
                result = worker.step_result()
                times[side].append(result["step_s"])
                if side == "remote":
                    cpu_share.append(result["cpu_s"] / result["step_s"])
    finally:
        for side, worker in workers.items():
            if side != "remote":
                worker.close()
        remote.close()
    best = {side: min(t) for side, t in times.items()}
    sizes = dict(width=args.width, depth=args.depth, batch=args.batch, micro_batches=args.micro_batches)
    steps = {f"{side}_step_s": round(s, 4) for side, s in best.items()}
    harness.emit("remote_speed_vs_local_k2", best["local"] / best["remote"], **steps, **sizes)
    harness.emit("remote_speedup_k2", best["plain"] / best["remote"], **steps, **sizes)
    harness.emit(
        "remote_client_cpu_share_k2",
        statistics.median(cpu_share),
        per_step=[round(c, 3) for c in cpu_share],
        **sizes,
    )


def _rss(args: argparse.Namespace, cpus: list[int]) -> None:
    for k in (2, 4):
        spec = dict(
            width=args.memory_width,
            depth=args.memory_depth,
            batch=args.memory_batch,
            activation="relu",
            stages=k,
            micro_batches=args.memory_micro_batches,
            remat="always",
            warmup=args.warmup,
            measure="time",
        )
        one = harness.Worker("gpipe", dict(spec, model="gpipe_head", logical_devices=k, cpus=cpus))
        try:
            one.read()
            for _ in range(args.steps):
                one.step()
            one_peak = one.peak_rss_bytes()
        finally:
            one.close()
        remote = Pipeline(dict(spec, cpus=cpus, intra_op_threads=1, inter_op_threads=2), cpus)
        try:
            remote.client.read()
            for _ in range(args.steps):
                remote.client.step()
            peaks = remote.peak_rss()
        finally:
            remote.close()
        mib = {name: round(b / 2**20, 1) for name, b in peaks.items()}
        harness.emit(
            f"remote_rss_ratio_k{k}",
            max(peaks.values()) / one_peak,
            one_process_peak_mib=round(one_peak / 2**20, 1),
            pipeline_peak_mib=mib,
            width=args.memory_width,
            depth=args.memory_depth,
            batch=args.memory_batch,
            weight_mib=round(args.memory_depth * args.memory_width**2 * 4 / 2**20, 1),
        )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark remote", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"Comma-separated subset of {FIGURES}.")
    parser.add_argument("--width", type=int, default=1024, help="Dense width (speed figures).")
    parser.add_argument("--depth", type=int, default=16, help="Dense layers (speed figures).")
    parser.add_argument("--batch", type=int, default=4096, help="Global batch (speed figures).")
    parser.add_argument("--micro_batches", type=int, default=8, help="M (speed figures).")
    parser.add_argument("--memory_width", type=int, default=8192, help="Dense width (memory figures).")
    parser.add_argument("--memory_depth", type=int, default=16, help="Dense layers (memory figures).")
    parser.add_argument("--memory_batch", type=int, default=64, help="Global batch (memory figures).")
    parser.add_argument("--memory_micro_batches", type=int, default=4, help="M (memory figures).")
    harness.add_run_flags(parser, steps=4, warmup=1)
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.depth, args.batch = 64, 8, 64
        args.memory_width, args.memory_depth, args.memory_batch = 256, 8, 16
        args.steps, args.warmup = 2, 1
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.stage:
        return run_stage(json.loads(args.stage))
    if args.worker:
        spec = json.loads(args.worker)
        return run_client(spec) if spec.get("client") else 1
    figures = harness.chosen_figures(NAME, args.figures, FIGURES)
    if figures is None:
        return 2
    cpus = harness.usable_cpus(NAME)
    started = time.monotonic()
    if "speed" in figures:
        _speed(args, cpus)
    if "rss" in figures:
        _rss(args, cpus)
    print(f"remote benchmark: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
