"""GPipe figures as JSON lines: ``python -m tools.benchmark gpipe [--quick] [--figures=a,b]``.

A stack of balanced, compute-bound dense layers is trained with plain SGD at a fixed global batch.
Each side of a ratio runs in its own subprocess (``python -m tools.benchmarks.gpipe --worker=JSON``),
which pins its CPUs and sets its thread counts, allocator and logical devices before TensorFlow
starts. The sides of a figure are started together, warmed up, then step in alternating rounds, so
both see the same machine load; the best step of each side counts (load only ever adds time).

- speedup: the layers unpipelined (K=1, M=1) on one core (affinity + 1 intra-op thread) over the
  pipeline (K=2 stages on 2 logical devices, M=8) on two cores (1 intra-op thread per op, 2 inter-op
  threads), same remat policy. Theory 2M/(M+K-1) = 1.78. Also, for information, the ratio against an
  unconfined one-device baseline (TF's pools let one device use more than a core).
- bubble: idle fraction of the K=2 pipeline for each M: 1 - T1(M) / (K * T2(M)), with T1(M) the same
  micro-batched work on one core (the stages' total busy time) and T2(M) the pipeline's step; theory
  (K-1)/(M+K-1), which assumes a stage never uses more than its own core.
- overhead: the GPipe layer with K=1, M=1, no remat over the plain sequential stack (one core).
- memory: peak allocator bytes of the K=2, M=8, remat=always training step over those of the same
  layers trained unpipelined without remat (BFC allocator; logical CPU devices share it, so this is the
  process peak), sized so activations outweigh the weights. The targets travel with the micro-batches
  and a per-example squared error is the last layer, so the loss runs inside the last stage, one
  micro-batch at a time (as pipeline schedules that take a loss function do); the unpipelined side
  runs the same layers on the whole batch. For information, ``live_tensor_ratio`` compares the peaks
  of the tensors' own bytes in another, traced step (``tools/memory_trace.py``; ``*_traced_peak_bytes``
  is the allocator's peak in that step): the allocator's peak also counts the unused part of chunks
  it did not split. The two steps need not peak alike: the two devices' ops interleave differently.
- memory_loss_outside: the same, with the loss computed after the pipeline on its concatenated
  output (what the speed figures do): the full batch's output, loss temporaries and gradient add to
  the pipeline's peak.
- remat_memory, remat_time: remat=always over remat=never at K=2, M=8.
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
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
FIGURES = ("speedup", "bubble", "overhead", "memory", "memory_loss_outside", "remat_memory", "remat_time")
BUBBLE_MICRO_BATCHES = (1, 2, 4, 8, 16)


# ------------------------------------------------------------------------------------------ worker
def _dense_params(name: str, width: int, activation: str) -> Any:
    from layers import core

    return core.ProjectionLayer.Params().set(
        name=name, input_dim=width, output_dim=width, activation=activation
    )


def _squared_error_params() -> Any:
    from layers.base_layer import BaseLayer  # here: the worker sets up TensorFlow's process first

    class SquaredErrorLayer(BaseLayer):
        """Per-example squared error of a {'x', 'target'} state, averaged over the features."""

        def fprop(self, ctx: Any, state: dict) -> Any:
            import tensorflow as tf

            return tf.reduce_mean(tf.square(state["x"] - state["target"]), axis=-1)

    return SquaredErrorLayer.Params()


def _model(spec: dict) -> Any:
    """The dense stack, plain or as a GPipeLayer; with ``loss_in_pipeline`` each layer works on the
    'x' entry of a {'x', 'target'} state and a per-example squared error follows the last one."""
    from layers import core, gpipe, partition

    depth, stages = spec["depth"], spec["stages"]
    layers = [_dense_params(f"fc{i}", spec["width"], spec["activation"]) for i in range(depth)]
    if spec.get("loss_in_pipeline"):
        layers = [core.OnKeyLayer.Params().set(name=lp.name, body=lp) for lp in layers]
        layers.append(_squared_error_params().set(name="loss"))
    if spec["model"] == "plain":
        return core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()
    p = gpipe.GPipeLayer.Params().set(
        name="net",
        layers=layers,
        split_points=partition.uniform_bounds(depth, stages)[1:-1],  # the loss joins the last stage
        num_micro_batches=spec["micro_batches"],
    )
    return p.set(remat=spec["remat"]).instantiate()


def _setup(spec: dict) -> Any:
    """Process settings, then TensorFlow, then the model's compiled training step."""
    if spec.get("cpus"):
        os.sched_setaffinity(0, set(spec["cpus"]))
    if spec["measure"] == "memory":
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from layers.base_layer import FPropContext

    tf.config.threading.set_intra_op_parallelism_threads(spec.get("intra_op_threads", 0))
    tf.config.threading.set_inter_op_parallelism_threads(spec.get("inter_op_threads", 0))
    devices = spec.get("logical_devices", 1)
    if devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
    model = _model(spec)
    shape = [spec["batch"], spec["width"]]
    x = tf.random.stateless_normal(shape, [1, 2])
    target = tf.random.stateless_normal(shape, [3, 4])
    variables = model.trainable_variables

    @tf.function
    def step() -> tf.Tensor:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            if spec.get("loss_in_pipeline"):
                loss = tf.reduce_mean(model(ctx, {"x": x, "target": target}))
            else:
                loss = tf.reduce_mean(tf.square(model(ctx, x) - target))
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.01 * g)
        return loss

    return step, variables


def _timed(step: Any) -> float:
    start = time.perf_counter()
    step().numpy()
    return time.perf_counter() - start


def run_worker(spec: dict) -> int:
    """The worker: builds the step, then answers ``step`` lines on stdin with one JSON line each
    (``memory`` specs print their peak once and exit)."""
    step, variables = _setup(spec)
    first = _timed(step)
    for _ in range(spec["warmup"]):
        step().numpy()
    if spec["measure"] == "memory":
        import tensorflow as tf

        from tools.memory_trace import live_tensor_peak

        tf.config.experimental.reset_memory_stats("CPU:0")
        step().numpy()
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        weights = sum(v.numpy().nbytes for v in variables)
        traced = live_tensor_peak(lambda: step().numpy())
        print(
            json.dumps(
                {
                    "peak_bytes": int(peak),
                    "weight_bytes": int(weights),
                    "live_peak_bytes": traced["live_peak_bytes"],
                    "traced_peak_bytes": traced["chunk_peak_bytes"],
                }
            ),
            flush=True,
        )
        return 0
    print(json.dumps({"ready": True, "first_step_s": first}), flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps({"step_s": _timed(step)}), flush=True)
    return 0


# ------------------------------------------------------------------------------------------ driver
class _Worker:
    """A worker subprocess, talked to one JSON line at a time."""

    def __init__(self, spec: dict) -> None:
        self._key = json.dumps(spec, sort_keys=True)
        self._log = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tools.benchmarks.gpipe", f"--worker={self._key}"],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def read(self) -> dict:
        for line in self._proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        self._proc.wait()
        self._log.seek(0)
        tail = (self._log.read().strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"benchmark worker failed ({self._proc.returncode}) for {self._key}: {tail}")

    def step(self) -> float:
        self._proc.stdin.write("step\n")
        self._proc.stdin.flush()
        return self.read()["step_s"]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            self._proc.wait()
        self._log.close()


def _interleaved(specs: dict[str, dict], rounds: int, verbose: bool) -> dict[str, dict]:
    """Starts one worker per spec, then runs ``rounds`` rounds of one step each, in turn.
    Returns each side's best and median step time."""
    if verbose:
        print(f"gpipe benchmark: {json.dumps(specs, sort_keys=True)}", file=sys.stderr, flush=True)
    workers = {name: _Worker(spec) for name, spec in specs.items()}
    try:
        for worker in workers.values():
            worker.read()  # ready
        times: dict[str, list[float]] = {name: [] for name in workers}
        for _ in range(rounds):
            for name, worker in workers.items():
                times[name].append(worker.step())
    finally:
        for worker in workers.values():
            worker.close()
    return {name: {"best": min(t), "median": statistics.median(t)} for name, t in times.items()}


def _memory(spec: dict, verbose: bool) -> dict:
    if verbose:
        print(f"gpipe benchmark: {json.dumps(spec, sort_keys=True)}", file=sys.stderr, flush=True)
    worker = _Worker(spec)
    try:
        return worker.read()
    finally:
        worker.close()


def _emit(name: str, value: float, **details: Any) -> None:
    # The 1-minute load average says how busy the machine was (2 cores: above ~2.5, trust nothing).
    load = round(os.getloadavg()[0], 2)
    print(json.dumps({"name": name, "value": round(value, 4), **details, "loadavg_1m": load}), flush=True)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark gpipe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"Comma-separated subset of {FIGURES}.")
    parser.add_argument("--quick", action="store_true", help="Tiny sizes and few steps (a smoke test).")
    parser.add_argument("--width", type=int, default=1024, help="Width of each dense layer (speed figures).")
    parser.add_argument("--depth", type=int, default=16, help="Number of dense layers.")
    parser.add_argument(
        "--batch",
        type=int,
        default=4096,
        help="Global batch (speed figures); micro-batches of 512 rows keep "
        "oneDNN matmuls efficient (at 256 rows they lose ~15%%, which the speedup would pay for).",
    )
    parser.add_argument("--activation", default="relu", help="Activation of the dense layers.")
    parser.add_argument("--memory_width", type=int, default=128, help="Layer width of the memory figures.")
    parser.add_argument("--memory_batch", type=int, default=8192, help="Global batch of the memory figures.")
    parser.add_argument(
        "--memory_activation", default="relu", help="Activation of the memory figures' layers."
    )
    parser.add_argument("--remat", default="always", help="Remat policy of the speedup and bubble figures.")
    parser.add_argument("--steps", type=int, default=4, help="Alternating rounds: timed steps per side.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed steps after the first.")
    parser.add_argument("--verbose", action="store_true", help="Log each worker run to stderr.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.depth, args.batch = 64, 4, 32
        args.memory_width, args.memory_batch = 32, 2048
        args.steps, args.warmup = 2, 1
    return args


def _speed_figures(args: argparse.Namespace, figures: list[str], cpus: list[int]) -> None:
    k, m = 2, 8
    base = {
        "model": "gpipe", "width": args.width, "depth": args.depth, "batch": args.batch,
        "activation": args.activation, "stages": 1, "micro_batches": 1, "remat": args.remat,
        "measure": "time", "warmup": args.warmup,
    }  # fmt: skip
    one_core = {**base, "cpus": cpus[:1], "intra_op_threads": 1, "inter_op_threads": 1}
    two_cores = {**base, "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2}
    pipeline = {**two_cores, "stages": k, "logical_devices": k}
    sizes = {
        "width": args.width,
        "depth": args.depth,
        "global_batch": args.batch,
        "activation": args.activation,
    }

    def measure(**specs: dict) -> dict[str, dict]:
        return _interleaved(specs, args.steps, args.verbose)

    if "speedup" in figures:
        t = measure(
            baseline=one_core, pipeline={**pipeline, "micro_batches": m}, unconfined={**base, "cpus": cpus}
        )
        base_s, pipe_s, free_s = t["baseline"]["best"], t["pipeline"]["best"], t["unconfined"]["best"]
        _emit(
            "speedup", base_s / pipe_s, theory=round(2 * m / (m + k - 1), 4), target=1.6,
            baseline_step_s=base_s, pipeline_step_s=pipe_s, stages=k, micro_batches=m, remat=args.remat,
            vs_unconfined_baseline=round(free_s / pipe_s, 4), unconfined_baseline_step_s=free_s,
            median_ratio=round(t["baseline"]["median"] / t["pipeline"]["median"], 4), **sizes,
        )  # fmt: skip
    if "bubble" in figures:
        for micro in BUBBLE_MICRO_BATCHES:
            t = measure(
                one_core={**one_core, "micro_batches": micro}, pipeline={**pipeline, "micro_batches": micro}
            )
            busy, step = t["one_core"]["best"], t["pipeline"]["best"]
            _emit(
                "bubble", 1.0 - busy / (k * step), theory=round((k - 1) / (micro + k - 1), 4), stages=k,
                micro_batches=micro, one_core_step_s=busy, pipeline_step_s=step, remat=args.remat, **sizes,
            )  # fmt: skip
    if "overhead" in figures:
        t = measure(gpipe={**one_core, "remat": "never"}, plain={**one_core, "model": "plain"})
        layer, plain = t["gpipe"]["best"], t["plain"]["best"]
        _emit("overhead", layer / plain, target=1.05, gpipe_step_s=layer, plain_step_s=plain, **sizes)
    if "remat_time" in figures:
        t = measure(
            always={**pipeline, "micro_batches": m, "remat": "always"},
            never={**pipeline, "micro_batches": m, "remat": "never"},
        )
        always, never = t["always"]["best"], t["never"]["best"]
        _emit(
            "remat_time", always / never, target=1.35, always_step_s=always, never_step_s=never, stages=k,
            micro_batches=m, **sizes,
        )  # fmt: skip


def _memory_figures(args: argparse.Namespace, figures: list[str], cpus: list[int]) -> None:
    k, m = 2, 8
    spec = {
        "model": "gpipe", "width": args.memory_width, "depth": args.depth, "batch": args.memory_batch,
        "activation": args.memory_activation, "stages": k, "micro_batches": m, "measure": "memory",
        "warmup": args.warmup, "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2,
        "logical_devices": k, "remat": "always", "loss_in_pipeline": True,
    }  # fmt: skip
    plain = {"model": "plain", "stages": 1, "micro_batches": 1, "remat": "never"}
    sizes = {
        "width": args.memory_width, "depth": args.depth, "global_batch": args.memory_batch,
        "activation": args.memory_activation, "stages": k, "micro_batches": m,
    }  # fmt: skip
    peaks: dict[str, dict] = {}

    def peak(name: str, **changes: Any) -> dict:
        if name not in peaks:
            peaks[name] = _memory({**spec, **changes}, args.verbose)
        return peaks[name]

    def emit(figure: str, sides: tuple[str, str], a: dict, b: dict, **details: Any) -> None:
        _emit(
            figure, a["peak_bytes"] / b["peak_bytes"],
            live_tensor_ratio=round(a["live_peak_bytes"] / b["live_peak_bytes"], 4),
            **{f"{side}_peak_bytes": x["peak_bytes"] for side, x in zip(sides, (a, b))},
            **{f"{side}_live_peak_bytes": x["live_peak_bytes"] for side, x in zip(sides, (a, b))},
            **{f"{side}_traced_peak_bytes": x["traced_peak_bytes"] for side, x in zip(sides, (a, b))},
            weight_bytes=a["weight_bytes"], **details, **sizes,
        )  # fmt: skip

    layer_bytes = args.memory_batch * args.memory_width * 4 * args.depth
    if "memory" in figures:
        emit(
            "memory", ("pipeline", "plain"), peak("always"), peak("plain", **plain), target=0.35,
            remat="always", loss="in the last stage", layer_output_bytes=layer_bytes,
        )  # fmt: skip
    if "memory_loss_outside" in figures:
        emit(
            "memory_loss_outside", ("pipeline", "plain"), peak("always_outside", loss_in_pipeline=False),
            peak("plain_outside", **plain, loss_in_pipeline=False), remat="always",
            loss="after the pipeline", layer_output_bytes=layer_bytes,
        )  # fmt: skip
    if "remat_memory" in figures:
        emit("remat_memory", ("always", "never"), peak("always"), peak("never", remat="never"))


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.worker is not None:
        return run_worker(json.loads(args.worker))
    figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = sorted(set(figures) - set(FIGURES))
    if unknown:
        print(
            f"gpipe benchmark: error: unknown figures {unknown}; choose from {', '.join(FIGURES)}",
            file=sys.stderr,
        )
        return 2
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        print(
            "gpipe benchmark: warning: fewer than 2 CPUs; the pipeline figures mean nothing", file=sys.stderr
        )
    _speed_figures(args, figures, cpus)
    if {"memory", "memory_loss_outside", "remat_memory"} & set(figures):
        _memory_figures(args, figures, cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
