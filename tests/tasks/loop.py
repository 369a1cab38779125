"""A plain training loop and evaluation for tests (the trainer job owns the real one)."""

from __future__ import annotations

from collections.abc import Iterator

import tensorflow as tf

from layers.base_layer import FPropContext
from tasks.base_task import BaseTask
from tasks.learner import Learner


def train_steps(
    task: BaseTask, learner: Learner, batches: Iterator, num_steps: int, start_step: int = 0
) -> list[dict[str, float]]:
    """Runs ``num_steps`` compiled train steps; returns each step's loss and learner scalars."""
    variables = list(task.trainable_variables)
    learner.build(variables)

    @tf.function(autograph=False)
    def step_fn(step: tf.Tensor, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        ctx = FPropContext(training=True, step=step)
        with tf.GradientTape() as tape:
            metrics = task.fprop(ctx, batch)
            loss = metrics["loss"][0]
        grads = tape.gradient(loss, variables)
        out = learner.apply_gradients(zip(grads, variables), step)
        ctx.apply_updates()
        out["loss"] = loss
        return out

    history = []
    for step in range(start_step, start_step + num_steps):
        out = step_fn(tf.constant(step, tf.int64), next(batches))
        history.append({k: float(v) for k, v in out.items()})
    return history


def evaluate(task: BaseTask, dataset: tf.data.Dataset) -> dict[str, float]:
    """Every metric averaged over the data set by its weight, as an evaler job does."""
    eval_fn = tf.function(
        lambda batch: task.fprop(FPropContext(training=False), batch), reduce_retracing=True, autograph=False
    )
    totals: dict[str, list[float]] = {}
    for batch in dataset:
        for name, (value, weight) in eval_fn(batch).items():
            total = totals.setdefault(name, [0.0, 0.0])
            total[0] += float(value) * float(weight)
            total[1] += float(weight)
    return {name: value / weight for name, (value, weight) in totals.items()}
