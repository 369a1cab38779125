"""Helpers of the multi-worker tests: trainer processes on 127.0.0.1, always ended by the test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from tests.trainer.runner import REPO, _env
from tools import local_cluster

# SGD at a constant rate: stable, so 20 steps of two replicas and of one process agree to float
# rounding (Adam divides by sqrt(v), which turns rounding differences in near-zero gradients into
# differences of the size of a step).
SMALL_RUN = (
    "task.train.optimizer : 'sgd'; task.train.lr_schedule : 'constant'; task.train.learning_rate : 0.03; "
    "cluster.intra_op_threads : 1; cluster.inter_op_threads : 1"
)


def override(max_steps: int, save_every: int, extra: str = "") -> str:
    text = f"{SMALL_RUN}; task.train.max_steps : {max_steps}; task.train.save_interval_steps : {save_every}"
    text += (
        f"; task.train.log_interval_steps : {save_every}; task.train.summary_interval_steps : {save_every}"
    )
    return text + (f"; {extra}" if extra else "")


class Procs:
    """Started processes; ``close()`` kills whatever still runs (use as a context manager)."""

    def __init__(self, tmp_path: Path) -> None:
        self._tmp = tmp_path
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = self._tmp / f"{name}-{time.monotonic_ns()}.log"
        out = open(log, "w")  # noqa: SIM115 (closed in close())
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=REPO, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True
        )
        proc.log_path, proc.log_file, proc.name = log, out, name
        self.procs.append(proc)
        return proc

    def trainer(self, name: str, *flags: str) -> subprocess.Popen:
        return self.start(name, ["-m", "trainer", *flags])

    def wait(self, proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(
                f"{proc.name} still running after {timeout} s:\n{output(proc)[-3000:]}"
            ) from None
        return code, output(proc)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.log_file.close()

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def output(proc: subprocess.Popen) -> str:
    if not proc.log_file.closed:  # closed by Procs.close, as after a timeout: the file is complete
        proc.log_file.flush()
    return Path(proc.log_path).read_text()


def sync_workers(procs: Procs, workers: int, flags: list[str], prefix: str = "w") -> list[subprocess.Popen]:
    """``workers`` sync trainer processes of one cluster on free ports."""
    spec = local_cluster.cluster_spec(workers, 0, local_cluster.free_ports(workers))
    return [
        procs.trainer(f"{prefix}{i}", "--mode=sync", f"--cluster_spec={spec}", f"--task_index={i}", *flags)
        for i in range(workers)
    ]


def async_cluster(
    procs: Procs, workers: int, ps: int, flags: list[str], prefix: str = ""
) -> list[subprocess.Popen]:
    """A controller, ``workers`` trainers and ``ps`` parameter servers of one async cluster on free
    ports; the controller first."""
    return [procs.start(f"{prefix}{t.name}", t.command[1:]) for t in local_cluster.tasks(workers, ps, flags)]


def wait_for(path: Path, timeout: float, procs: list[subprocess.Popen]) -> None:
    wait_until(path.exists, timeout, procs, str(path))


def wait_until(
    ready: Callable[[], bool], timeout: float, procs: list[subprocess.Popen], what: str = "the condition"
) -> None:
    """Returns once ``ready()``; fails if one of ``procs`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise AssertionError(f"{dead[0].name} exited ({dead[0].returncode}):\n{output(dead[0])[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.2)


def max_weight_diff(ckpt_a: str, ckpt_b: str, skip: tuple[str, ...] = ()) -> tuple[float, int]:
    """Max |a - b| over the float values (task, learner) two checkpoints share, but names holding a
    string of ``skip``; and how many compared."""
    a, b = tf.train.load_checkpoint(ckpt_a), tf.train.load_checkpoint(ckpt_b)
    names = [
        n
        for n in a.get_variable_to_shape_map()
        if n.startswith(("task/", "learner/")) and not any(part in n for part in skip)
    ]
    worst, count = 0.0, 0
    for name in names:
        x, y = a.get_tensor(name), b.get_tensor(name)
        if x.dtype.kind == "f":
            worst = max(worst, float(np.max(np.abs(x - y))) if x.size else 0.0)
            count += 1
    return worst, count
