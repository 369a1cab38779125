"""Token-level metrics of sequence models: loss, log-perplexity and accuracy over real tokens."""

from __future__ import annotations

import tensorflow as tf

from layers import transformer as tfm
from tasks.base_task import Metrics


def token_metrics(
    logits: tf.Tensor, labels: tf.Tensor, paddings: tf.Tensor, label_smoothing: float = 0.0
) -> tuple[Metrics, tf.Tensor]:
    """``loss`` (label-smoothed cross-entropy), ``log_pplx`` (plain cross-entropy, nats) and
    ``token_accuracy``, each a mean over real tokens weighted by their number; also the weights."""
    weights = 1.0 - tf.cast(paddings, tf.float32)
    num_tokens = tf.reduce_sum(weights)
    nll = tfm.label_smoothed_xent(logits, labels, 0.0)
    loss = nll if not label_smoothing else tfm.label_smoothed_xent(logits, labels, label_smoothing)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)

    def mean(x: tf.Tensor) -> tf.Tensor:
        return tf.math.divide_no_nan(tf.reduce_sum(x * weights), num_tokens)

    metrics = {
        "loss": (mean(loss), num_tokens),
        "log_pplx": (mean(nll), num_tokens),
        "token_accuracy": (mean(correct), num_tokens),
    }
    return metrics, weights
