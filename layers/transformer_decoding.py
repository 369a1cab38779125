"""Decoding step functions for ``layers.beam_search``: one position per step with the stack's
key/value cache, or (the slow reference) the whole prefix again every step."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from layers.base_layer import FPropContext
from layers.beam_search import StepFn
from layers.transformer_input import TransformerInput
from layers.transformer_stack import TransformerStack

LogitsFn = Callable[[tf.Tensor], tf.Tensor]


def cached_step_fn(
    ctx: FPropContext,
    embed: TransformerInput,
    stack: TransformerStack,
    logits_fn: LogitsFn,
    source: tf.Tensor | None = None,
    source_paddings: tf.Tensor | None = None,
) -> StepFn:
    """A ``layers.beam_search`` step function that runs one position per step with the cache.

    Its state is ``{'cache': stack.init_cache(rows, max_length)}`` (see ``init_cached_state``).
    ``source`` (the encoder output, one row per decoded row) is projected to keys/values once, here.
    """
    source_kv = stack.project_source(source) if source is not None else None

    def step(ids: tf.Tensor, time_step: tf.Tensor, state: dict) -> tuple[tf.Tensor, dict]:
        x = embed(ctx, ids[:, None], positions=tf.reshape(time_step, [1, 1]))
        y, cache = stack.extend_step(ctx, x, state["cache"], time_step, source_kv, source_paddings)
        return tf.nn.log_softmax(tf.cast(logits_fn(y[:, 0]), tf.float32)), {"cache": cache}

    return step


def init_cached_state(stack: TransformerStack, rows: int, max_length: int) -> dict:
    return {"cache": stack.init_cache(rows, max_length)}


def full_prefix_step_fn(
    ctx: FPropContext,
    embed: TransformerInput,
    stack: TransformerStack,
    logits_fn: LogitsFn,
    source: tf.Tensor | None = None,
    source_paddings: tf.Tensor | None = None,
) -> StepFn:
    """The reference (slow) step function: re-runs the decoder over the whole prefix every step.

    Its state is ``{'ids': [rows, max_length]}``, the inputs so far (see ``init_full_prefix_state``).
    Decoding a step costs ``time_step + 1`` positions; the cached one costs one.
    """

    def step(ids: tf.Tensor, time_step: tf.Tensor, state: dict) -> tuple[tf.Tensor, dict]:
        buffer = tf.where(
            tf.equal(tf.range(tf.shape(state["ids"])[1]), time_step), ids[:, None], state["ids"]
        )
        prefix = buffer[:, : time_step + 1]
        y = stack(ctx, embed(ctx, prefix), source=source, source_paddings=source_paddings)
        return tf.nn.log_softmax(tf.cast(logits_fn(y[:, -1]), tf.float32)), {"ids": buffer}

    return step


def init_full_prefix_state(rows: int, max_length: int) -> dict:
    return {"ids": tf.zeros([rows, max_length], tf.int32)}
