"""``evaler_<ds>``: evaluates each checkpoint once over a data set.

Metrics are the task's ``{name: (value, weight)}`` averaged over batches by weight, written to
``logdir/eval_<ds>/`` (TensorBoard, at the checkpoint's step) and to its ``scores.jsonl``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from layers.base_layer import FPropContext
from params.errors import UserError
from trainer import tracing
from trainer.checkpoint_job import CheckpointJob


class Evaler(CheckpointJob):
    kind = "eval"
    settings = "eval"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._eval_batch = tf.function(self._weighted_metrics)

    def _weighted_metrics(self, batch: dict[str, tf.Tensor], step: tf.Tensor) -> dict:
        ctx = FPropContext(training=False, step=step, seed=self.task.params.random_seed)
        metrics = self.task.fprop(ctx, batch)
        out = {}
        for name, (value, weight) in metrics.items():
            weight = tf.cast(tf.reshape(weight, []), tf.float64)
            out[name] = (tf.cast(tf.reshape(value, []), tf.float64) * weight, weight)
        return out

    def process(self, step: int) -> dict[str, float]:
        totals: dict[str, list[float]] = {}
        step_t = tf.constant(step, tf.int64)
        for batch in self.batches():
            with tracing.user_errors():
                metrics = self._eval_batch(batch, step_t)
            for name, (weighted, weight) in metrics.items():
                acc = totals.setdefault(name, [0.0, 0.0])
                acc[0] += float(weighted.numpy())
                acc[1] += float(weight.numpy())
        if not totals:
            raise UserError(
                f"{self.name}: input.{self.dataset} gave no batch (fewer examples than batch_size "
                "with drop_remainder?)"
            )
        return {name: (s / w if w else float(np.nan)) for name, (s, w) in totals.items()}
