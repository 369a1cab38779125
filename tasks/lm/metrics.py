"""Token-level metrics of sequence models: loss, log-perplexity and accuracy over real tokens."""

from __future__ import annotations

import tensorflow as tf

from layers.losses import label_smoothed_xent
from tasks.base_task import Metrics


def token_metrics(
    logits: tf.Tensor, labels: tf.Tensor, paddings: tf.Tensor, label_smoothing: float = 0.0
) -> tuple[Metrics, tf.Tensor]:
    """``loss`` (label-smoothed cross-entropy), ``log_pplx`` (plain cross-entropy, nats) and
    ``token_accuracy``, each a mean over real tokens weighted by their number; also the weights."""
    weights = 1.0 - tf.cast(paddings, tf.float32)
    num_tokens = tf.reduce_sum(weights)
    nll = label_smoothed_xent(logits, labels, 0.0)
    loss = nll if not label_smoothing else label_smoothed_xent(logits, labels, label_smoothing)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)

    def mean(x: tf.Tensor) -> tf.Tensor:
        return tf.math.divide_no_nan(tf.reduce_sum(x * weights), num_tokens)

    metrics = {
        "loss": (mean(loss), num_tokens),
        "log_pplx": (mean(nll), num_tokens),
        "token_accuracy": (mean(correct), num_tokens),
    }
    return metrics, weights


def token_sums(
    logits: tf.Tensor,
    labels: tf.Tensor,
    paddings: tf.Tensor,
    label_smoothing: float = 0.0,
    label_entropy: tf.Tensor | None = None,
) -> dict[str, tf.Tensor]:
    """Per-example sums over real tokens (``[batch]`` each): ``loss``, ``log_pplx``,
    ``token_accuracy`` (and ``achievable_log_pplx`` from a ``label_entropy``), and ``num_tokens``.
    Summed over micro-batches, ``metrics_from_sums`` turns them into ``token_metrics``' metrics."""
    weights = 1.0 - tf.cast(paddings, tf.float32)
    nll = label_smoothed_xent(logits, labels, 0.0)
    loss = nll if not label_smoothing else label_smoothed_xent(logits, labels, label_smoothing)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=labels.dtype), labels), tf.float32)
    sums = {
        "loss": tf.reduce_sum(loss * weights, axis=-1),
        "log_pplx": tf.reduce_sum(nll * weights, axis=-1),
        "token_accuracy": tf.reduce_sum(correct * weights, axis=-1),
        "num_tokens": tf.reduce_sum(weights, axis=-1),
    }
    if label_entropy is not None:
        sums["achievable_log_pplx"] = tf.reduce_sum(tf.cast(label_entropy, tf.float32) * weights, axis=-1)
    return sums


def metrics_from_sums(sums: dict[str, tf.Tensor], paddings: tf.Tensor | None = None) -> Metrics:
    """The batch's metrics from ``token_sums``' per-example sums: each a mean over real tokens,
    weighted by their number (and ``log_pplx_gap`` when ``achievable_log_pplx`` is there).

    With ``paddings`` the number of real tokens is counted from them rather than from the sums: a
    pipeline's sums come out of its last stage, and a loss normalized by them would make each
    micro-batch's gradient wait for every micro-batch's forward (which 1F1B cannot run)."""
    if paddings is not None:
        num_tokens = tf.reduce_sum(1.0 - tf.cast(paddings, sums["num_tokens"].dtype))
    else:
        num_tokens = tf.reduce_sum(sums["num_tokens"])
    metrics = {
        name: (tf.math.divide_no_nan(tf.reduce_sum(value), num_tokens), num_tokens)
        for name, value in sums.items()
        if name != "num_tokens"
    }
    if "achievable_log_pplx" in metrics:
        metrics["log_pplx_gap"] = (metrics["log_pplx"][0] - metrics["achievable_log_pplx"][0], num_tokens)
    return metrics
