"""``evaler_<ds>``: evaluates each checkpoint once over a data set.

Metrics are the task's ``{name: (value, weight)}`` averaged over batches by weight, written to
``logdir/eval_<ds>/`` (TensorBoard, at the checkpoint's step) and to its ``scores.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from layers.base_layer import FPropContext
from params.errors import UserError
from tasks.base_task import BaseTask
from trainer import tracing
from trainer.checkpoint_job import CheckpointJob


def compiled_batch_metrics(task: BaseTask) -> Callable[[dict, tf.Tensor], dict]:
    """``(batch, step) -> {name: (value * weight, weight)}``, compiled: one batch's task metrics,
    ready to be averaged by weight."""

    def weighted(batch: dict[str, tf.Tensor], step: tf.Tensor) -> dict:
        ctx = FPropContext(training=False, step=step, seed=task.params.random_seed)
        out = {}
        for name, (value, weight) in task.fprop(ctx, batch).items():
            weight = tf.cast(tf.reshape(weight, []), tf.float64)
            out[name] = (tf.cast(tf.reshape(value, []), tf.float64) * weight, weight)
        return out

    return tracing.graph_function(weighted)


def weighted_means(batch_metrics: Callable, batches: Iterable[dict], step: int) -> dict[str, float]:
    """Each metric averaged over ``batches`` by its weight ({} when there was no batch)."""
    totals: dict[str, list[float]] = {}
    step_t = tf.constant(step, tf.int64)
    for batch in batches:
        with tracing.user_errors():
            metrics = batch_metrics(batch, step_t)
        for name, (weighted, weight) in metrics.items():
            acc = totals.setdefault(name, [0.0, 0.0])
            acc[0] += float(weighted.numpy())
            acc[1] += float(weight.numpy())
    return {name: (s / w if w else float(np.nan)) for name, (s, w) in totals.items()}


class Evaler(CheckpointJob):
    kind = "eval"
    settings = "eval"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._eval_batch = self.shared.function(self.task, "eval", compiled_batch_metrics)

    def process(self, step: int) -> dict[str, float]:
        means = weighted_means(self._eval_batch, self.batches(), step)
        if not means:
            raise UserError(
                f"{self.name}: input.{self.dataset} gave no batch (fewer examples than batch_size "
                "with drop_remainder?)"
            )
        return means
