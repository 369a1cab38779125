"""tools.memory_trace: the tensors' own peak over a traced step, in a process with the BFC allocator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json
import tensorflow as tf
from tools.memory_trace import live_tensor_peak
from tools.benchmarks.remote import MemoryProbe

resident = tf.ones([256, 1024])  # 1 MiB in use before the step

@tf.function
def step(seed):  # a seed argument, so that grappler cannot fold the samples into constants
    a = tf.random.stateless_normal([1024, 1024], seed)  # 4 MiB
    b = tf.random.stateless_normal([1024, 1024], seed + 1)  # 4 MiB, alive together with a
    return tf.reduce_sum(a * b + resident[0, 0])

seed = tf.constant([1, 2])
step(seed)
figures = live_tensor_peak(lambda: step(seed).numpy())
# A stage process's probe: the same trace between its reset and peak lines.
probe, plain = MemoryProbe(trace=True), MemoryProbe()
before = probe.answer("reset")
step(seed).numpy()
figures["probe_step_bytes"] = probe.answer("peak")["live_peak_bytes"] - before["current_bytes"]
plain.answer("reset")
step(seed).numpy()
figures["plain_keys"] = sorted(plain.answer("peak"))
print(json.dumps(figures))
"""


@pytest.mark.slow
def test_live_peak_counts_the_step_tensors_and_what_was_resident():
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="true", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    mib = 1 << 20
    assert figures["resting_bytes"] >= 1 * mib
    # The two samples (4 MiB each) are alive at once on top of what was resident.
    step_bytes = figures["live_peak_bytes"] - figures["resting_bytes"]
    assert 8 * mib <= step_bytes <= 9 * mib
    assert figures["live_peak_bytes"] <= figures["chunk_peak_bytes"]
    assert 8 * mib <= figures["probe_step_bytes"] <= 9 * mib
    assert figures["plain_keys"] == ["current_bytes", "peak_bytes"]  # no trace: the allocator's only
