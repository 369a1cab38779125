"""``python -m tools.benchmark precision [--quick]``: mixed_bfloat16 against float32, one JSON line each.

- precision_step_ratio (dense): a training step of the dense stack of ``tools.benchmark gpipe`` (four
  ReLU projections of width 1024 on a batch of 4096, squared error, SGD) under ``task.precision =
  mixed_bfloat16`` over the same step under float32 (target <= 0.7).
- precision_step_ratio (lm): ``lm.synthetic.TransformerLM``'s trainer step (``TrainStep``, its
  while loop of steps) the same way, for information.
- precision_activation_peak_ratio: the gpipe benchmark's dense stack as a K=2, M=8 pipeline
  (fill-drain, remat never, the squared error per micro-batch in the last stage; 8 layers of width
  512, batch 8192, so activations outweigh the weights) on two logical devices, each side in a
  ``tools.benchmarks.gpipe`` memory worker: the peak of the tensors alive during a step, replayed
  from the allocator's events (``tools.memory_trace``), less what was in use before it (weights,
  batch, targets), as ``tools.benchmark schedules`` measures a device's activation peak; bfloat16
  over float32 (target <= 0.6). ``allocator_peak_ratio``: the BFC allocator's process peaks.
- precision_bytes_ratio, precision_remote_speedup_k2: ``tools.benchmark remote``'s speed figures
  (its code: the same stack as a K=2 pipeline, M=8, fill-drain, stages in two processes) run with
  ``--precision=float32,mixed_bfloat16`` in the same rounds; the bytes its processes sent per step
  (``bytes_per_step``), bfloat16 over float32 (target <= 0.55), and ``remote_speedup_k2`` under
  mixed_bfloat16 on both sides (the plain stack on one core over the cross-process pipeline),
  beside float32's. The remote lines themselves are printed too.

The step ratios' sides are built in this process, pinned to one core with one intra-op thread, and
timed in alternating rounds (a side's best round counts: load only adds time); the other figures'
sides run in worker processes first. ``--quick``: smoke-test sizes, and the remote figures' client
serves stage 0 itself (one TensorFlow start less per precision).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from layers import core
from layers.base_layer import BaseLayer, FPropContext
from params import experiment
from params.hyperparams import InstantiableParams
from tasks.base_task import BaseTask
from tools.benchmarks import harness, remote

POLICIES = remote.PRECISIONS  # float32 and mixed_bfloat16


class DenseStack(BaseTask):
    """The gpipe benchmark's dense stack as a task: ReLU projections and a squared error."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("width", 1024, "Width of every layer.")
        p.define("depth", 4, "Number of layers.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        layer = core.ProjectionLayer.Params().set(input_dim=p.width, output_dim=p.width, activation="relu")
        self.create_children("fc", [layer.copy() for _ in range(p.depth)])

    def fprop(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict:
        y = batch["x"]
        for layer in self.fc:
            y = layer(ctx, y)
        loss = tf.reduce_mean(tf.square(tf.cast(y, tf.float32) - batch["y"]))
        return {"loss": (loss, tf.constant(1.0))}


def _dense_step(policy: str, batch: int, width: int) -> Callable[[], Any]:
    task = DenseStack.Params().set(name="task", width=width, precision=policy).instantiate()
    data = {
        "x": tf.random.stateless_normal([batch, width], [1, 2]),
        "y": tf.random.stateless_normal([batch, width], [3, 4]),
    }
    variables = task.trainable_variables

    @tf.function(autograph=False)
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = task.fprop(FPropContext(training=True), data)["loss"][0]
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.01 * g)
        return loss

    return lambda: step().numpy()


def _lm_step(policy: str, steps: int) -> Callable[[], Any]:
    from trainer.train_step import TrainStep

    root = experiment.resolve("lm.synthetic.TransformerLM", params_override=f"task.precision : '{policy}'")
    train = TrainStep(root.task, root.input.train)
    return lambda: train.run(steps)[0].numpy()


def _best_times(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    for step in steps.values():  # trace and warm up
        step()
        step()
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _activation_peaks(args: argparse.Namespace, cpus: list[int]) -> None:
    width, depth, batch = (64, 4, 256) if args.quick else (512, 8, 8192)
    spec = {
        "model": "gpipe_head", "width": width, "depth": depth, "batch": batch, "activation": "relu",
        "stages": 2, "micro_batches": 8, "remat": "never", "schedule": "fill_drain", "measure": "memory",
        "warmup": 0 if args.quick else 1, "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2,
        "logical_devices": 2,
    }  # fmt: skip
    peaks = {p: harness.run_once("gpipe", remote._with_precision(spec, p)) for p in POLICIES}
    held = {p: x["live_peak_bytes"] - x["resting_bytes"] for p, x in peaks.items()}
    f32, bf16 = peaks["float32"], peaks["mixed_bfloat16"]
    harness.emit(
        "precision_activation_peak_ratio", held["mixed_bfloat16"] / held["float32"], target=0.6,
        activation_peak_bytes=held, allocator_peak_ratio=round(bf16["peak_bytes"] / f32["peak_bytes"], 4),
        allocator_peak_bytes={p: x["peak_bytes"] for p, x in peaks.items()}, weight_bytes=f32["weight_bytes"],
        width=width, depth=depth, batch=batch, stages=2, micro_batches=8, remat="never",
        schedule="fill_drain",
    )  # fmt: skip


def _remote_figures(args: argparse.Namespace, cpus: list[int]) -> None:
    flags = ["--figures=speed", f"--precision={','.join(POLICIES)}", f"--steps={args.rounds}"]
    run = remote._parse([*flags, "--quick"] if args.quick else flags)
    results = remote._speed(run, cpus, hosted=args.quick)
    f32, bf16 = (results[("fill_drain", "own", p)] for p in POLICIES)
    sizes = dict(width=run.width, depth=run.depth, batch=run.batch, micro_batches=run.micro_batches)
    harness.emit(
        "precision_bytes_ratio", bf16["bytes_per_step"] / f32["bytes_per_step"], target=0.55,
        bytes_per_step={p: r["bytes_per_step"] for p, r in zip(POLICIES, (f32, bf16))},
        handoff_bytes_float32=2 * run.batch * run.width * 4, **sizes,
    )  # fmt: skip
    harness.emit(
        "precision_remote_speedup_k2", bf16["speedup"], float32_remote_speedup_k2=round(f32["speedup"], 4),
        plain_step_s={p: round(r["plain_step_s"], 4) for p, r in zip(POLICIES, (f32, bf16))},
        remote_step_s={p: round(r["remote_step_s"], 4) for p, r in zip(POLICIES, (f32, bf16))},
        schedule="fill_drain", stage_cpus="own", **sizes,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark precision")
    parser.add_argument("--quick", action="store_true", help="Smoke-test sizes.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds per figure.")
    args = parser.parse_args(argv[1:])
    cpus = harness.usable_cpus("precision")
    _activation_peaks(args, cpus)
    _remote_figures(args, cpus)
    os.sched_setaffinity(0, {cpus[0]})
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    batch, width = (256, 128) if args.quick else (4096, 1024)
    rounds = 2 if args.quick else args.rounds
    dense = _best_times({p: _dense_step(p, batch, width) for p in POLICIES}, rounds)
    harness.emit(
        "precision_step_ratio",
        round(dense["mixed_bfloat16"] / dense["float32"], 3),
        model="dense",
        target=0.7,
        batch=batch,
        width=width,
        step_s={p: round(t, 6) for p, t in dense.items()},
    )
    lm_steps = 2 if args.quick else 10
    lm = _best_times({p: _lm_step(p, lm_steps) for p in POLICIES}, rounds)
    harness.emit(
        "precision_step_ratio",
        round(lm["mixed_bfloat16"] / lm["float32"], 3),
        model="lm.synthetic.TransformerLM",
        steps_per_round=lm_steps,
        step_s={p: round(t / lm_steps, 6) for p, t in lm.items()},
    )
    return 0
