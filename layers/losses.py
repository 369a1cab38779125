"""The output side of a sequence model: logits tied to the token embedding, and the per-token
(label-smoothed) cross-entropy."""

from __future__ import annotations

import tensorflow as tf


def label_smoothed_xent(logits: tf.Tensor, labels: tf.Tensor, label_smoothing: float = 0.0) -> tf.Tensor:
    """Per-token cross-entropy (float32) against ``(1 - eps) * onehot + eps / vocab``."""
    logits = tf.cast(logits, tf.float32)
    num_classes = tf.shape(logits)[-1]
    target = tf.one_hot(labels, num_classes, dtype=tf.float32)
    if label_smoothing:
        target = (1.0 - label_smoothing) * target + label_smoothing / tf.cast(num_classes, tf.float32)
    return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)


def tied_logits(x: tf.Tensor, emb_matrix: tf.Tensor) -> tf.Tensor:
    """Logits of a softmax tied to a ``[vocab, dim]`` embedding: ``x @ emb^T``."""
    return tf.tensordot(x, tf.transpose(tf.cast(emb_matrix, x.dtype)), 1)
