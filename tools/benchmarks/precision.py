"""``python -m tools.benchmark precision [--quick]``: mixed_bfloat16 against float32, one JSON line each.

- precision_step_ratio (dense): a training step of the dense stack of ``tools.benchmark gpipe`` (four
  ReLU projections of width 1024 on a batch of 4096, squared error, SGD) under ``task.precision =
  mixed_bfloat16`` over the same step under float32 (target <= 0.7).
- precision_step_ratio (lm): ``lm.synthetic.TransformerLM``'s trainer step (``TrainStep``, its
  while loop of steps) the same way, for information.

Both sides are built in this process, pinned to one core with one intra-op thread, and timed in
alternating rounds (a side's best round counts: load only adds time). ``--quick``: smoke-test sizes.
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
from tools.benchmarks import harness

POLICIES = ("float32", "mixed_bfloat16")


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark precision")
    parser.add_argument("--quick", action="store_true", help="Smoke-test sizes.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds per figure.")
    args = parser.parse_args(argv[1:])
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
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
