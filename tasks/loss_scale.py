"""Dynamic loss scaling for ``task.precision = mixed_float16``.

float16's smallest normal number is about 6e-5, so small gradients of a float16 computation round to
zero. The trainer multiplies the loss by ``scale`` before the backward pass and divides the gradients
by it before clipping and the update. A step whose unscaled gradients hold an Inf or NaN changes no
weight or slot: the scale halves (never below 1) and ``skipped_steps`` counts it. After
``GROWTH_INTERVAL`` good steps in a row the scale doubles. ``scale``, the run of good steps and
``skipped_steps`` are variables of this module, which the learner holds: the checkpoint has them,
and train summaries show ``loss_scale`` and ``skipped_steps``.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

INITIAL_SCALE = 2.0**15
GROWTH_INTERVAL = 2000
FACTOR = 2.0
SUMMARY_NAMES = ("loss_scale", "skipped_steps")


class LossScale(tf.Module):
    """The dynamic loss scale and its counters (see the module doc)."""

    def __init__(self, initial_scale: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL) -> None:
        super().__init__(name="loss_scale")
        self.growth_interval = int(growth_interval)
        self.scale = tf.Variable(float(initial_scale), trainable=False, dtype=tf.float32, name="scale")
        self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64, name="good_steps")
        self.skipped_steps = tf.Variable(0, trainable=False, dtype=tf.int64, name="skipped_steps")

    def scaled(self, loss: tf.Tensor) -> tf.Tensor:
        """``loss * scale`` in float32."""
        return tf.cast(loss, tf.float32) * self.scale

    def unscaled(self, grads: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> list:
        """Each gradient divided by the scale, on its own device (None stays None)."""
        out = []
        for grad in grads:
            if grad is None:
                out.append(None)
                continue
            with tf.device(grad.device):
                inverse = tf.cast(1.0 / self.scale, grad.dtype)
                if isinstance(grad, tf.IndexedSlices):
                    out.append(tf.IndexedSlices(grad.values * inverse, grad.indices, grad.dense_shape))
                else:
                    out.append(grad * inverse)
        return out

    @staticmethod
    def all_finite(grads: Sequence[tf.Tensor | tf.IndexedSlices | None]) -> tf.Tensor:
        """Whether every gradient is finite (a bool scalar)."""
        checks = []
        for grad in grads:
            if grad is None:
                continue
            values = grad.values if isinstance(grad, tf.IndexedSlices) else grad
            checks.append(tf.reduce_all(tf.math.is_finite(values)))
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)

    def update(self, finite: tf.Tensor) -> dict[str, tf.Tensor]:
        """After a step whose gradients were ``finite`` or not: the new scale and counters, returned
        as float32 summary scalars (the scale the next step uses)."""
        good = tf.where(finite, self.good_steps + 1, tf.zeros([], tf.int64))
        grow = tf.logical_and(finite, good >= self.growth_interval)
        scale = tf.where(
            finite,
            tf.where(grow, self.scale * FACTOR, self.scale),
            tf.maximum(self.scale / FACTOR, 1.0),
        )
        self.scale.assign(scale)
        self.good_steps.assign(tf.where(grow, tf.zeros([], tf.int64), good))
        self.skipped_steps.assign_add(1 - tf.cast(finite, tf.int64))
        return {
            "loss_scale": tf.identity(scale),
            "skipped_steps": tf.cast(self.skipped_steps.read_value(), tf.float32),
        }
