"""Local parallelism figures as JSON lines: ``python -m tools.benchmark local [--quick]``.

A stack of dense relu layers with a softmax classifier on top is trained with plain SGD at a fixed
batch, three ways, each in its own subprocess (``python -m tools.benchmarks.local --worker=JSON``)
that pins its CPUs and sets its thread counts and logical devices before TensorFlow starts:

- local: a LocalParallelLayer, K=2 blocks on 2 logical devices (greedy, pipelined; block 0 ends in a
  softmax aux head), on two cores: 1 intra-op thread per op, 2 inter-op threads (one core per device);
- backprop: the same layers and classifier, trained with backprop on one core (affinity + 1 thread);
- gpipe: the same layers as a GPipeLayer, K=2, M=8, remat never, on the same two cores and threads.

The workers are started together, warmed up, then step in alternating rounds so that all see the same
machine load; the best step of each counts (load only ever adds time); under ``--quick`` (a smoke test)
the sides with the same process settings share one worker. Figures:

- speedup_vs_backprop: backprop step / local step (target 1.7);
- speedup_vs_gpipe: gpipe step / local step (target 1.1);
- overlap: the local step on one core (both devices, one thread) over the local step on two cores: how
  much of the ideal 2 the two blocks' overlap gets on this machine (for information; with
  ``local_work_ratio``, the local step over the backprop step, both on one core: the aux head's and
  hand-off's extra work);
- memory_vs_gpipe: peak allocator bytes (BFC; the logical devices share it, so the process peak) of
  the local training step over the GPipe one, at the memory sizes (report). The local peak counts
  its hand-off state (kept between steps), which the figure also gives.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tools.benchmarks import harness

FIGURES = ("speed", "memory")
NUM_CLASSES = 16


# ------------------------------------------------------------------------------------------ worker
def _layers(spec: dict) -> list:
    from layers import core

    return [
        core.ProjectionLayer.Params().set(
            name=f"fc{i}", input_dim=spec["width"], output_dim=spec["width"], activation="relu"
        )
        for i in range(spec["depth"])
    ]


def _setup(spec: dict) -> tuple[Any, int]:
    """Process settings, then TensorFlow, then the model's compiled training step; also the bytes
    of the state the model keeps between steps (weights, hand-off)."""
    tf = harness.configure(spec)
    from layers import core
    from layers.base_layer import FPropContext
    from layers.parallel import local as local_parallel
    from layers.parallel import partition
    from layers.parallel.pipeline import gpipe

    width, kind = spec["width"], spec["model"]
    layers = _layers(spec)
    bounds = partition.uniform_bounds(spec["depth"], 2)
    if kind == "local":
        head = local_parallel.PooledSoftmaxHead.Params().set(input_dim=width, num_classes=NUM_CLASSES)
        model = local_parallel.LocalParallelLayer.Params().set(
            name="net", layers=layers, split_points=bounds[1:-1], aux_heads=[head]
        )
    elif kind == "gpipe":
        model = gpipe.GPipeLayer.Params().set(
            name="net", layers=layers, split_points=bounds[1:-1], num_micro_batches=spec["micro_batches"]
        )
        model.remat = "never"
    else:
        model = core.SequentialLayer.Params().set(name="net", sub=layers)
    model = model.instantiate()
    softmax = core.SoftmaxLayer.Params().set(name="softmax", input_dim=width, num_classes=NUM_CLASSES)
    softmax = softmax.instantiate()
    x = tf.random.stateless_normal([spec["batch"], width], [1, 2])
    labels = tf.random.stateless_uniform([spec["batch"]], [3, 4], 0, NUM_CLASSES, tf.int32)
    variables = list(model.trainable_variables) + list(softmax.trainable_variables)

    @tf.function(autograph=False)
    def step() -> tf.Tensor:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            if kind == "local":
                out = model(ctx, x, {"label": labels})
                task = softmax(ctx, out.output, out.targets["label"])["avg_xent"]
                loss = local_parallel.loss_with_local_gradient(task, out)
            else:
                loss = softmax(ctx, model(ctx, x), labels)["avg_xent"]
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.01 * g)
        ctx.apply_updates()
        return loss

    step.get_concrete_function()  # creates the local model's hand-off state
    kept = sum(v.numpy().nbytes for v in list(model.variables) + list(softmax.variables))
    return step, kept


def run_worker(spec: dict) -> int:
    """Builds the step, then serves it (``harness.serve``); a memory side also reports the state kept
    between steps; a worker of several sides (``--quick``: ``harness.interleaved``'s ``shared``) serves
    each side's step by name."""
    if "sides" in spec:
        return harness.serve_sides(spec, lambda side: _setup(side)[0])
    step, kept = _setup(spec)
    return harness.serve(spec, step, lambda: {"state_bytes": int(kept)})


# ------------------------------------------------------------------------------------------ driver
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark local", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"Comma-separated subset of {FIGURES}.")
    parser.add_argument("--width", type=int, default=512, help="Width of each dense layer (speed).")
    parser.add_argument("--depth", type=int, default=8, help="Number of dense layers (2 blocks).")
    parser.add_argument(
        "--batch", type=int, default=2048, help="Batch (speed); GPipe's micro-batches are 1/8."
    )
    parser.add_argument("--memory_width", type=int, default=128, help="Layer width of the memory figure.")
    parser.add_argument("--memory_batch", type=int, default=8192, help="Batch of the memory figure.")
    harness.add_run_flags(parser, steps=5, warmup=2, quick_help=harness.SHARED_QUICK_HELP)
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.depth, args.batch = 64, 4, 64
        args.memory_width, args.memory_batch = 32, 512
        args.steps, args.warmup = 2, 0  # the first (compiling) step still runs before the timed ones
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.worker is not None:
        return run_worker(json.loads(args.worker))
    figures = harness.chosen_figures("local", args.figures, FIGURES)
    if figures is None:
        return 2
    cpus = harness.usable_cpus("local")
    two_cores = {"cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2, "logical_devices": 2}
    one_core = {"cpus": cpus[:1], "intra_op_threads": 1, "inter_op_threads": 1}
    if "speed" in figures:
        base = {"width": args.width, "depth": args.depth, "batch": args.batch, "measure": "time"}
        base["warmup"], base["micro_batches"] = args.warmup, 8
        t = harness.interleaved(
            "local",
            {
                "local": {**base, **two_cores, "model": "local"},
                "backprop": {**base, **one_core, "model": "plain"},
                "gpipe": {**base, **two_cores, "model": "gpipe"},
                "local_one_core": {**base, **one_core, "logical_devices": 2, "model": "local"},
            },
            args.steps,
            shared=args.quick,
        )
        local_s, backprop_s, gpipe_s, local_1_s = (
            t[name]["best"] for name in ("local", "backprop", "gpipe", "local_one_core")
        )
        sizes = {"width": args.width, "depth": args.depth, "batch": args.batch, "blocks": 2}
        harness.emit(
            "speedup_vs_backprop", backprop_s / local_s, target=1.7, local_step_s=local_s,
            backprop_step_s=backprop_s, median_ratio=round(t["backprop"]["median"] / t["local"]["median"], 4),
            **sizes,
        )  # fmt: skip
        harness.emit(
            "speedup_vs_gpipe", gpipe_s / local_s, target=1.1, local_step_s=local_s, gpipe_step_s=gpipe_s,
            gpipe_micro_batches=8, gpipe_remat="never",
            median_ratio=round(t["gpipe"]["median"] / t["local"]["median"], 4), **sizes,
        )  # fmt: skip
        harness.emit(
            "overlap", local_1_s / local_s, ideal=2.0, local_step_s=local_s, local_one_core_step_s=local_1_s,
            local_work_ratio=round(local_1_s / backprop_s, 4), **sizes,
        )  # fmt: skip
    if "memory" in figures:
        base = {"width": args.memory_width, "depth": args.depth, "batch": args.memory_batch}
        base.update(measure="memory", warmup=args.warmup, micro_batches=8, **two_cores)
        local = harness.run_once("local", {**base, "model": "local"})
        gp = harness.run_once("local", {**base, "model": "gpipe"})
        harness.emit(
            "memory_vs_gpipe", local["peak_bytes"] / gp["peak_bytes"], local_peak_bytes=local["peak_bytes"],
            gpipe_peak_bytes=gp["peak_bytes"], local_state_bytes=local["state_bytes"],
            gpipe_state_bytes=gp["state_bytes"], gpipe_micro_batches=8, gpipe_remat="never",
            width=args.memory_width, depth=args.depth, batch=args.memory_batch, blocks=2,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
