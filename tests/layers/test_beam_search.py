"""Greedy and beam search on hand-made scoring functions whose best sequences are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from layers import beam_search

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4
VOCAB = 5
LOW = -30.0  # score of tokens a scorer rules out


def _log(probs: dict[int, float]) -> list[float]:
    return [math.log(probs[i]) if i in probs else LOW for i in range(VOCAB)]


# After BOS: a (0.6) or b (0.4). A hypothesis that started with b then ends (EOS 0.99); one that
# started with a goes on: a 0.36, b 0.34, EOS 0.3. Greedy takes a, then a, a, ...; the best
# sequence is "b EOS" (0.396) against "a EOS" (0.18).
FIRST = _log({A: 0.6, B: 0.4})
AFTER_B = _log({EOS: 0.99, A: 0.005, B: 0.005})
AFTER_A = _log({A: 0.36, B: 0.34, EOS: 0.3})


def _trap_step(ids, time_step, state):
    """The scorer keys on the first token, which it keeps in its state: a search that reorders
    beams without reordering the state would score the wrong table."""
    first = tf.where(tf.equal(time_step, 1), ids, state["first"])
    after = tf.where(tf.equal(first, B)[:, None], tf.constant([AFTER_B]), tf.constant([AFTER_A]))
    rows = tf.shape(ids)[0]
    log_probs = tf.where(tf.equal(time_step, 0), tf.tile(tf.constant([FIRST]), [rows, 1]), after)
    return log_probs, {"first": first}


def _state(batch: int) -> dict:
    return {"first": tf.zeros([batch], tf.int32)}


def test_greedy_misses_the_best_sequence_beam_search_finds_it():
    greedy = beam_search.greedy_search(_trap_step, _state(2), 2, 4, BOS, EOS)
    np.testing.assert_array_equal(greedy["ids"].numpy(), [[A, A, A, A]] * 2)
    np.testing.assert_array_equal(greedy["lengths"].numpy(), [4, 4])
    np.testing.assert_allclose(greedy["scores"].numpy(), [math.log(0.6 * 0.36**3)] * 2, rtol=1e-5)

    beam = beam_search.beam_search(_trap_step, _state(2), 2, 2, 4, BOS, EOS, length_alpha=0.0)
    np.testing.assert_array_equal(beam["ids"].numpy()[:, 0], [[B, EOS, PAD, PAD]] * 2)
    np.testing.assert_array_equal(beam["lengths"].numpy()[:, 0], [2, 2])
    np.testing.assert_allclose(beam["scores"].numpy()[:, 0], [math.log(0.4 * 0.99)] * 2, rtol=1e-5)
    # The runner-up is "a EOS" (0.18), ahead of every longer sequence.
    np.testing.assert_array_equal(beam["ids"].numpy()[:, 1], [[A, EOS, PAD, PAD]] * 2)
    np.testing.assert_allclose(beam["log_probs"].numpy()[:, 1], [math.log(0.6 * 0.3)] * 2, rtol=1e-5)


def _lengthy_step(ids, time_step, state):
    """Unnormalized scores: 'a EOS' totals -1.0; 'b b b EOS' totals -1.2 (-0.4 per b)."""
    del state
    t = time_step
    first = tf.constant([_scores({A: -0.5, B: -0.4})])
    after_a = tf.constant([_scores({EOS: -0.5})])
    after_b = tf.where(t < 3, tf.constant([_scores({B: -0.4})]), tf.constant([_scores({EOS: 0.0})]))
    table = tf.where(tf.equal(ids, A)[:, None], after_a, after_b)
    return tf.where(tf.equal(t, 0), tf.tile(first, [tf.shape(ids)[0], 1]), table), {}


def _scores(values: dict[int, float]) -> list[float]:
    return [values.get(i, LOW) for i in range(VOCAB)]


@pytest.mark.parametrize(
    "alpha, best",
    [(0.0, [A, EOS, PAD, PAD, PAD]), (1.0, [B, B, B, EOS, PAD])],
)
def test_length_normalization_changes_the_winner(alpha, best):
    out = beam_search.beam_search(_lengthy_step, {}, 1, 3, 5, BOS, EOS, length_alpha=alpha)
    np.testing.assert_array_equal(out["ids"].numpy()[0, 0], best)
    # GNMT: score = log P / ((5 + |y|) / 6) ** alpha.
    want = {2: -1.0 / (7 / 6) ** alpha, 4: -1.2 / (9 / 6) ** alpha}
    length = int(out["lengths"].numpy()[0, 0])
    np.testing.assert_allclose(out["scores"].numpy()[0, 0], want[length], rtol=1e-5)
    assert out["scores"].numpy()[0, 0] >= out["scores"].numpy()[0, 1]


def _per_example_step(ids, time_step, state):
    """Example 0 prefers 'a a EOS', example 1 'b EOS': rows must keep their example's state."""
    example = state["example"]
    a_path = tf.constant([_scores({A: -0.1, B: -2.0, EOS: -3.0})])
    a_end = tf.constant([_scores({EOS: -0.1, A: -3.0})])
    b_path = tf.constant([_scores({B: -0.1, A: -2.0, EOS: -3.0})])
    b_end = tf.constant([_scores({EOS: -0.1, B: -3.0})])
    ex0 = tf.where(time_step < 2, a_path, a_end)
    ex1 = tf.where(time_step < 1, b_path, b_end)
    return tf.where(tf.equal(example, 0)[:, None], ex0, ex1), state


def test_batched_beam_search_in_tf_function_keeps_examples_apart():
    state = {"example": tf.constant([0, 1], tf.int32)}
    run = tf.function(
        lambda: beam_search.beam_search(_per_example_step, state, 2, 3, 5, BOS, EOS, length_alpha=0.6)
    )
    out = run()
    np.testing.assert_array_equal(out["ids"].numpy()[:, 0], [[A, A, EOS, PAD, PAD], [B, EOS, PAD, PAD, PAD]])
    np.testing.assert_array_equal(out["lengths"].numpy()[:, 0], [3, 2])
    eager = beam_search.beam_search(_per_example_step, state, 2, 3, 5, BOS, EOS, length_alpha=0.6)
    np.testing.assert_array_equal(out["ids"].numpy(), eager["ids"].numpy())


def test_beam_of_one_is_greedy_and_search_stops_early():
    calls = tf.Variable(0)

    def counting_step(ids, t, state):
        calls.assign_add(1)
        return _per_example_step(ids, t, state)

    state = {"example": tf.constant([0, 1], tf.int32)}
    greedy = tf.function(lambda: beam_search.greedy_search(counting_step, state, 2, 10, BOS, EOS))()
    assert int(calls.numpy()) == 3  # every row emitted EOS by step 3 of 10
    beam = beam_search.beam_search(_per_example_step, state, 2, 1, 10, BOS, EOS, length_alpha=0.0)
    np.testing.assert_array_equal(beam["ids"].numpy()[:, 0], greedy["ids"].numpy())
    np.testing.assert_allclose(beam["scores"].numpy()[:, 0], greedy["scores"].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(greedy["ids"].numpy()[:, 3:], 0)  # pad after EOS

    calls.assign(0)
    tf.function(lambda: beam_search.beam_search(counting_step, state, 2, 2, 10, BOS, EOS))()
    assert int(calls.numpy()) < 10  # stopped once no live hypothesis could win


def test_unfinished_hypotheses_fill_the_beam():
    def never_ends(ids, t, state):
        scores = [beam_search.NEG_INF if i == EOS else s for i, s in enumerate(_scores({A: -0.1, B: -0.2}))]
        return tf.tile(tf.constant([scores]), [tf.shape(ids)[0], 1]), state

    out = beam_search.beam_search(never_ends, {}, 1, 2, 3, BOS, EOS, length_alpha=0.0)
    np.testing.assert_array_equal(out["ids"].numpy()[0], [[A, A, A], [A, A, B]])
    np.testing.assert_array_equal(out["lengths"].numpy()[0], [3, 3])
    np.testing.assert_allclose(out["scores"].numpy()[0], [-0.3, -0.4], rtol=1e-5)


def test_tile_beams_repeats_each_row():
    tiled = beam_search.tile_beams({"x": tf.constant([[1, 2], [3, 4]])}, 3)
    np.testing.assert_array_equal(tiled["x"].numpy(), [[1, 2]] * 3 + [[3, 4]] * 3)
