"""What the benchmarks that run each side of a ratio in its own process share (gpipe, local, mesh).

Not a benchmark itself (``tools.benchmark`` does not list it). A side is a worker process, ``python
-m tools.benchmarks.NAME --worker=JSON``, whose spec says how to set the process up before
TensorFlow starts, since none of it can change afterwards: ``cpus`` (CPU affinity),
``intra_op_threads`` / ``inter_op_threads`` (0 or absent: TensorFlow's default), ``logical_devices``
(that many logical CPU devices, when given), ``measure`` (``"memory"`` turns on the BFC allocator,
whose peak the figure reads; ``bfc_allocator``: that allocator on a timing side too) and
``system_allocator`` (true: tensors from malloc, as in the trainer binary's processes,
``trainer.tf_startup.use_system_allocator``).

The protocol, one JSON line at a time: a timing worker builds and compiles its step, warms up, prints
``{"ready": true, ...}``, then answers each ``step`` line on stdin with ``{"step_s": seconds}`` until
stdin closes; a memory worker prints one result and exits. The driver starts the sides of a figure
together and steps them in alternating rounds, so all see the same machine load; a side's best step
counts (load only ever adds time). Every figure is one JSON line with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.planning.trial import peak_rss_bytes  # noqa: F401 (the benchmarks read it here)

REPO_ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ worker
def prepare_process(spec: dict) -> None:
    """What must be set before TensorFlow starts: CPU affinity, the allocator (BFC for a memory side,
    malloc with ``system_allocator``), TensorFlow's log level."""
    if spec.get("cpus"):
        os.sched_setaffinity(0, set(spec["cpus"]))
    if spec.get("measure") == "memory" or spec.get("bfc_allocator"):
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    if spec.get("system_allocator"):
        from trainer import tf_startup

        tf_startup.use_system_allocator()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def configure(spec: dict) -> Any:
    """Sets the process up as ``spec`` says (CPUs, allocator, threads, logical devices), then imports
    and returns TensorFlow. Call it first in a worker, before anything imports TensorFlow."""
    prepare_process(spec)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(spec.get("intra_op_threads", 0))
    tf.config.threading.set_inter_op_parallelism_threads(spec.get("inter_op_threads", 0))
    devices = spec.get("logical_devices")
    if devices:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    return tf


def timed(step: Callable[[], Any]) -> float:
    """Seconds of one call of ``step`` (a compiled step returning a tensor), waiting for its result."""
    start = time.perf_counter()
    step().numpy()
    return time.perf_counter() - start


def allocator_peak(step: Callable[[], Any]) -> int:
    """The allocator's peak bytes over one call of ``step`` (logical CPU devices share one allocator,
    so this is the process's peak)."""
    import tensorflow as tf

    tf.config.experimental.reset_memory_stats("CPU:0")
    step().numpy()
    return int(tf.config.experimental.get_memory_info("CPU:0")["peak"])


def serve(spec: dict, step: Callable[[], Any], memory: Callable[[], dict] | None = None) -> int:
    """The worker's side of the protocol for its compiled ``step``: the first (compiling) call and
    ``spec["warmup"]`` more, then either one memory line (``peak_bytes`` from ``allocator_peak``, then
    whatever ``memory()`` adds) or a timed step per ``step`` line on stdin."""
    first = timed(step)
    for _ in range(spec["warmup"]):
        step().numpy()
    if spec["measure"] == "memory":
        result = {"peak_bytes": allocator_peak(step)}
        result.update(memory() if memory is not None else {})
        print(json.dumps({**result, "first_step_s": first}), flush=True)
        return 0
    print(json.dumps({"ready": True, "first_step_s": first}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps(_timed_result(step)), flush=True)
    return 0


def serve_sides(spec: dict, build: Callable[[dict], Callable[[], Any]]) -> int:
    """A timing worker of several sides (``spec["sides"]``, see ``interleaved``): sets the process up
    by ``spec`` (a side may name fewer settings), builds each side's step (``build(side_spec)``),
    compiles and warms it up, prints ``{"ready": true}``, then answers each ``step SIDE`` line on
    stdin with ``{"step_s": seconds, "cpu_s": seconds}`` until stdin closes."""
    configure(spec)
    steps = {side: build(side_spec) for side, side_spec in spec["sides"].items()}
    for step in steps.values():
        for _ in range(1 + spec["warmup"]):
            step().numpy()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        word, _, side = line.strip().partition(" ")
        if word != "step" or side not in steps:
            break
        print(json.dumps(_timed_result(steps[side])), flush=True)
    return 0


def _timed_result(step: Callable[[], Any]) -> dict:
    cpu = time.process_time()
    step_s = timed(step)
    return {"step_s": step_s, "cpu_s": time.process_time() - cpu}


# ------------------------------------------------------------------------------------------ driver
class Worker:
    """A worker subprocess of benchmark ``name`` (``tools.benchmarks.<name>``), talked to one JSON line
    at a time."""

    def __init__(self, name: str, spec: dict) -> None:
        self._key = json.dumps(spec, sort_keys=True)
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", f"tools.benchmarks.{name}", f"--worker={self._key}"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def read(self) -> dict:
        """The worker's next JSON line; a worker that exits first is an error with its last stderr line."""
        for line in self._proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self._proc.wait()
        self._log.seek(0)
        tail = (self._log.read().strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"benchmark worker failed ({self._proc.returncode}) for {self._key}: {tail}")

    def ask(self, line: str) -> dict:
        """Sends ``line`` to the worker; returns its answer (the next JSON line)."""
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        return self.read()

    def step(self) -> float:
        return self.step_result()["step_s"]

    def step_result(self) -> dict:
        """One timed step: ``step_s`` and the worker's own CPU seconds in it, ``cpu_s``."""
        return self.ask("step")

    @property
    def pid(self) -> int:
        """The worker process's id."""
        return self._proc.pid

    def peak_rss_bytes(self) -> int:
        """The worker process's peak resident memory so far (Linux's VmHWM)."""
        return peak_rss_bytes(self._proc.pid)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def _log(name: str, verbose: bool, spec: dict) -> None:
    if verbose:
        print(f"{name} benchmark: {json.dumps(spec, sort_keys=True)}", file=sys.stderr, flush=True)


# What a worker sets up before TensorFlow starts (``configure``): sides that agree on it can share a
# process (``interleaved(..., shared=True)``).
PROCESS_SETTINGS = ("cpus", "intra_op_threads", "inter_op_threads", "logical_devices", "measure", "warmup")


def _fits(group: dict, settings: dict) -> bool:
    """Whether a side with these process settings can run in ``group``'s worker: the same settings,
    but that a side naming no logical devices runs on the first of the group's (its ops' default
    device), and a group without them takes a side's."""
    devices = {settings.get("logical_devices"), group.get("logical_devices")} - {None, 0}

    def rest(d: dict) -> dict:
        return {k: v for k, v in d.items() if k in PROCESS_SETTINGS and k != "logical_devices"}

    return rest(group) == rest(settings) and len(devices) <= 1


def interleaved(
    name: str, specs: dict[str, dict], rounds: int, verbose: bool = False, shared: bool = False
) -> dict[str, dict]:
    """Starts one worker per side (``{side: spec}``), waits until all are warmed up, then runs
    ``rounds`` rounds of one step per side, in turn. Returns each side's ``best`` and ``median`` step
    seconds.

    With ``shared`` (``--quick``: a smoke test, where each process's TensorFlow start costs more than
    its steps), sides whose ``PROCESS_SETTINGS`` fit (``_fits``) run in one worker, whose spec is
    those settings and ``sides`` (``{side: spec}``); it serves each side's step by name
    (``serve_sides``)."""
    _log(name, verbose, specs)
    groups: list[dict] = []
    for side, spec in specs.items():
        settings = {key: spec[key] for key in PROCESS_SETTINGS if spec.get(key) is not None}
        group = next((g for g in groups if shared and _fits(g, settings)), None)
        if group is None:
            group = {**settings, "sides": {}}
            groups.append(group)
        if settings.get("logical_devices"):  # a group takes a side's logical devices
            group["logical_devices"] = settings["logical_devices"]
        group["sides"][side] = spec
    workers: list[Worker] = []
    try:
        for group in groups:
            (spec, *others) = group["sides"].values()
            workers.append(Worker(name, group if others else spec))
        for worker in workers:
            worker.read()  # ready
        times: dict[str, list[float]] = {side: [] for side in specs}
        for _ in range(rounds):
            for worker, group in zip(workers, groups):
                alone = len(group["sides"]) == 1
                for side in group["sides"]:
                    step = worker.step() if alone else worker.ask(f"step {side}")["step_s"]
                    times[side].append(step)
    finally:
        for worker in workers:
            worker.close()
    return {side: {"best": min(t), "median": statistics.median(t)} for side, t in times.items()}


def run_once(name: str, spec: dict, verbose: bool = False) -> dict:
    """One worker's one result line (a memory side, or any worker that prints one result and exits)."""
    _log(name, verbose, spec)
    worker = Worker(name, spec)
    try:
        return worker.read()
    finally:
        worker.close()


def emit(name: str, value: float | None, **details: Any) -> None:
    """Prints one figure as a JSON line: its name, value (4 decimals; None for a skipped one), details
    and the 1-minute load average (2 cores: above ~2.5 the machine was busy; trust nothing)."""
    load = round(os.getloadavg()[0], 2)
    value = None if value is None else round(value, 4)
    print(json.dumps({"name": name, "value": value, **details, "loadavg_1m": load}), flush=True)


# ------------------------------------------------------------------------------------------ command line
QUICK_HELP = "Tiny sizes and few steps (a smoke test)."
SHARED_QUICK_HELP = (
    "Tiny sizes and few steps (a smoke test); timed sides with the same cores and threads share one "
    "worker process (a side without logical devices runs on the first of another's), so the figures "
    "mean nothing."
)


def add_run_flags(
    parser: argparse.ArgumentParser, steps: int, warmup: int, quick_help: str = QUICK_HELP
) -> None:
    """The flags every such benchmark takes: --quick, --steps, --warmup and the workers' --worker."""
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--steps", type=int, default=steps, help="Alternating rounds: timed steps per side.")
    parser.add_argument("--warmup", type=int, default=warmup, help="Untimed steps after the first.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)


def chosen_figures(name: str, text: str, known: tuple[str, ...]) -> list[str] | None:
    """The figures a comma-separated --figures names, or None after one error line on stderr."""
    figures = [f.strip() for f in text.split(",") if f.strip()]
    unknown = sorted(set(figures) - set(known))
    if unknown:
        print(
            f"{name} benchmark: error: unknown figures {unknown}; choose from {', '.join(known)}",
            file=sys.stderr,
        )
        return None
    return figures


def usable_cpus(name: str) -> list[int]:
    """This process's CPUs, sorted; warns on stderr when there are fewer than the two the figures need."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print(f"{name} benchmark: warning: fewer than 2 CPUs; the figures mean nothing", file=sys.stderr)
    return cpus
