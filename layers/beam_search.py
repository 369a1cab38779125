"""Greedy and beam search over a step function, batched and ``tf.function``-friendly.

A step function maps ``(ids [N], time_step, state) -> (log_probs [N, vocab], new_state)``: ``ids`` is
each row's last token (BOS at time 0), ``time_step`` a scalar int32 (the position being predicted,
which a Transformer needs for its position embedding and cache slot) and ``state`` any nest of
``[N, ...]`` tensors (the decoder caches). Beam search tiles the state to ``N = batch * beam`` rows and
reorders it as beams are selected, so the step function never sees the beam structure. Every shape
is static: sequences live in ``[.., max_length]`` buffers filled with ``pad_id``.

Beam scores use GNMT's length normalization (Wu et al. 2016):
``log P(y) / ((5 + |y|) / 6) ** alpha`` where ``|y|`` counts the EOS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

StepFn = Callable[[tf.Tensor, tf.Tensor, Any], tuple[tf.Tensor, Any]]

NEG_INF = -1.0e9


def length_penalty(length: tf.Tensor | int, alpha: float) -> tf.Tensor:
    """GNMT's ``((5 + length) / 6) ** alpha``."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _write(buffer: tf.Tensor, time_step: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
    """``buffer[..., time_step] = values`` with static shapes."""
    at = tf.equal(tf.range(tf.shape(buffer)[-1]), time_step)
    return tf.where(at, values[..., None], buffer)


def _lengths(ids: tf.Tensor, eos_id: int) -> tf.Tensor:
    """Tokens up to and including the first EOS (the full length when there is none)."""
    is_eos = tf.equal(ids, eos_id)
    max_length = tf.shape(ids)[-1]
    first = tf.cast(tf.argmax(tf.cast(is_eos, tf.int32), axis=-1), tf.int32) + 1
    return tf.where(tf.reduce_any(is_eos, axis=-1), first, max_length)


def greedy_search(
    step_fn: StepFn,
    initial_state: Any,
    batch_size: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    pad_id: int = 0,
) -> dict[str, tf.Tensor]:
    """Picks the most likely token at each step until every row emitted EOS or max_length.

    Returns ``ids [B, max_length]`` (pad after EOS), ``lengths [B]`` (EOS included) and
    ``scores [B]`` (sum of the chosen tokens' log-probabilities).
    """
    ids = tf.fill([batch_size, max_length], tf.constant(pad_id, tf.int32))
    finished = tf.zeros([batch_size], tf.bool)
    scores = tf.zeros([batch_size], tf.float32)
    bos = tf.fill([batch_size], tf.constant(bos_id, tf.int32))

    def cond(t, ids, finished, scores, state):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    def body(t, ids, finished, scores, state):
        last = tf.where(t > 0, tf.gather(ids, tf.maximum(t - 1, 0), axis=1), bos)
        log_probs, state = step_fn(last, t, state)
        log_probs = tf.cast(log_probs, tf.float32)
        token = tf.cast(tf.argmax(log_probs, axis=-1), tf.int32)
        token_logp = tf.gather(log_probs, token, batch_dims=1)
        token = tf.where(finished, pad_id, token)
        scores += tf.where(finished, 0.0, token_logp)
        ids = _write(ids, t, token)
        return t + 1, ids, tf.logical_or(finished, tf.equal(token, eos_id)), scores, state

    _, ids, _, scores, _ = tf.while_loop(
        cond, body, (tf.constant(0), ids, finished, scores, initial_state), maximum_iterations=max_length
    )
    return {"ids": ids, "lengths": _lengths(ids, eos_id), "scores": scores}


def _flatten_beams(x: tf.Tensor) -> tf.Tensor:
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[shape[0] * shape[1]], shape[2:]], 0))


def _unflatten_beams(x: tf.Tensor, batch_size: int) -> tf.Tensor:
    shape = tf.shape(x)
    return tf.reshape(x, tf.concat([[batch_size, shape[0] // batch_size], shape[1:]], 0))


def tile_beams(state: Any, beam_size: int) -> Any:
    """Repeats each row of every ``[B, ...]`` tensor ``beam_size`` times -> ``[B * beam_size, ...]``."""

    def tile(x):
        x = tf.convert_to_tensor(x)
        return _flatten_beams(tf.repeat(x[:, None], beam_size, axis=1))

    return tf.nest.map_structure(tile, state)


def _gather_beams(state: Any, indices: tf.Tensor, batch_size: int) -> Any:
    """Rows ``[B * K, ...]`` -> ``[B * K, ...]`` picking beams ``indices [B, K]`` of each example."""

    def gather(x):
        y = _flatten_beams(tf.gather(_unflatten_beams(x, batch_size), indices, batch_dims=1))
        return tf.ensure_shape(y, x.shape)  # keeps the static shape the while loop needs

    return tf.nest.map_structure(gather, state)


def beam_search(
    step_fn: StepFn,
    initial_state: Any,
    batch_size: int,
    beam_size: int,
    max_length: int,
    bos_id: int,
    eos_id: int,
    length_alpha: float = 0.6,
    pad_id: int = 0,
) -> dict[str, tf.Tensor]:
    """Beam search with GNMT length normalization; ``initial_state`` has ``batch_size`` rows.

    Each step extends the ``beam_size`` live hypotheses by every token, keeps the best
    ``2 * beam_size`` extensions, moves those ending in EOS to the finished set (scored with the length
    penalty) and keeps the best ``beam_size`` others alive. The search stops early once no live
    hypothesis can beat the worst finished one. Slots an example could not fill with finished
    hypotheses get its best live ones (scored at max_length), after the finished ones.

    Returns ``ids [B, beam, max_length]``, ``scores [B, beam]`` (normalized, best first),
    ``lengths [B, beam]`` and ``log_probs [B, beam]`` (unnormalized).
    """
    k = beam_size
    state = tile_beams(initial_state, k)
    alive_ids = tf.fill([batch_size, k, max_length], tf.constant(pad_id, tf.int32))
    alive_logp = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)]), [batch_size, 1])
    fin_ids = alive_ids
    fin_scores = tf.fill([batch_size, k], NEG_INF)
    fin_logp = tf.fill([batch_size, k], NEG_INF)
    fin_flags = tf.zeros([batch_size, k], tf.bool)
    bos = tf.fill([batch_size * k], tf.constant(bos_id, tf.int32))
    best_possible_penalty = length_penalty(max_length, length_alpha)

    def cond(t, alive_ids, alive_logp, fin_ids, fin_scores, fin_logp, fin_flags, state):
        best_alive = tf.reduce_max(alive_logp, axis=1) / best_possible_penalty
        worst_finished = tf.where(
            tf.reduce_all(fin_flags, axis=1), tf.reduce_min(fin_scores, axis=1), NEG_INF
        )
        done = tf.reduce_all(worst_finished >= best_alive)
        return tf.logical_and(t < max_length, tf.logical_not(done))

    def body(t, alive_ids, alive_logp, fin_ids, fin_scores, fin_logp, fin_flags, state):
        last = tf.reshape(tf.gather(alive_ids, tf.maximum(t - 1, 0), axis=2), [-1])
        last = tf.where(t > 0, last, bos)
        log_probs, state = step_fn(last, t, state)
        log_probs = tf.cast(log_probs, tf.float32)
        vocab = tf.shape(log_probs)[-1]
        candidates = alive_logp[:, :, None] + tf.reshape(log_probs, [batch_size, k, vocab])
        top_logp, top_index = tf.math.top_k(tf.reshape(candidates, [batch_size, k * vocab]), 2 * k)
        top_beam = top_index // vocab
        top_token = top_index % vocab
        top_ids = _write(tf.gather(alive_ids, top_beam, batch_dims=1), t, top_token)
        # Extensions of the placeholder beams of step 0 (log-prob ~NEG_INF) never count as finished.
        ends = tf.logical_and(tf.equal(top_token, eos_id), top_logp > NEG_INF / 2)

        # Live: the best k candidates not ending in EOS.
        live_logp, live_index = tf.math.top_k(tf.where(ends, NEG_INF, top_logp), k)
        new_alive_ids = tf.gather(top_ids, live_index, batch_dims=1)
        state = _gather_beams(state, tf.gather(top_beam, live_index, batch_dims=1), batch_size)

        # Finished: merge those ending in EOS with the finished set, keep the best k.
        new_scores = tf.where(ends, top_logp / length_penalty(t + 1, length_alpha), NEG_INF)
        all_scores = tf.concat([fin_scores, new_scores], axis=1)
        all_ids = tf.concat([fin_ids, top_ids], axis=1)
        all_logp = tf.concat([fin_logp, tf.where(ends, top_logp, NEG_INF)], axis=1)
        all_flags = tf.concat([fin_flags, ends], axis=1)
        fin_scores, keep = tf.math.top_k(all_scores, k)
        fin_ids = tf.gather(all_ids, keep, batch_dims=1)
        fin_logp = tf.gather(all_logp, keep, batch_dims=1)
        fin_flags = tf.gather(all_flags, keep, batch_dims=1)
        return t + 1, new_alive_ids, live_logp, fin_ids, fin_scores, fin_logp, fin_flags, state

    loop_vars = (tf.constant(0), alive_ids, alive_logp, fin_ids, fin_scores, fin_logp, fin_flags, state)
    _, alive_ids, alive_logp, fin_ids, fin_scores, fin_logp, fin_flags, _ = tf.while_loop(
        cond, body, loop_vars, maximum_iterations=max_length
    )
    # Finished hypotheses first (best first), then live ones fill the slots still empty.
    num_finished = tf.reduce_sum(tf.cast(fin_flags, tf.int32), axis=1, keepdims=True)
    slot = tf.range(k)[None, :]
    from_finished = slot < num_finished
    alive_slot = tf.clip_by_value(slot - num_finished, 0, k - 1)

    def pick(finished: tf.Tensor, alive: tf.Tensor) -> tf.Tensor:
        alive = tf.gather(alive, alive_slot, batch_dims=1)
        cond = from_finished if finished.shape.rank == 2 else from_finished[:, :, None]
        return tf.where(cond, finished, alive)

    ids = pick(fin_ids, alive_ids)
    return {
        "ids": ids,
        "scores": pick(fin_scores, alive_logp / best_possible_penalty),
        "lengths": _lengths(ids, eos_id),
        "log_probs": pick(fin_logp, alive_logp),
    }
