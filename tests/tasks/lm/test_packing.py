"""Packed rows: several sequences per row with segment ids and positions compute exactly what the
sequences compute one by one, and attention never crosses from one segment into another."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from layers.base_layer import FPropContext
from tasks import packing
from tasks.lm.model import transformer_lm_params
from tasks.lm.vocabulary import vocab_params

LENGTH = 16
SEQS = [[5, 9, 12, 7, 6], [8, 8, 15, 4], [11, 13, 10]]


def _task():
    p = transformer_lm_params(vocab_params(size=20), model_dim=16, num_heads=2, hidden_dim=32, num_layers=2)
    p.emb.max_length = LENGTH
    p.random_seed = 3
    return p.instantiate()


def _example(tokens):
    return {"ids": [1] + tokens[:-1], "labels": tokens}


def _packed_row(seqs):
    ds = tf.data.Dataset.from_generator(
        lambda: (_example(s) for s in seqs),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in ("ids", "labels")},
    )
    rows = list(packing.pack(ds, ("ids", "labels"), LENGTH, open_rows=1))
    assert len(rows) == 1
    return {k: v[None] for k, v in rows[0].items()}


def _alone(tokens):
    n = len(tokens)
    ex = _example(tokens)
    pad = LENGTH - n
    return {
        "ids": tf.constant([ex["ids"] + [0] * pad]),
        "labels": tf.constant([ex["labels"] + [0] * pad]),
        "paddings": tf.constant([[0.0] * n + [1.0] * pad]),
    }


def _token_log_probs(task, batch):
    logits = task.compute_predictions(FPropContext(), batch)["logits"]
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    return tf.gather(log_probs, batch["labels"], batch_dims=2).numpy()[0]


def test_pack_fills_rows_first_fit_with_segments_and_positions():
    row = _packed_row(SEQS)
    np.testing.assert_array_equal(row["segment_ids"][0], [1] * 5 + [2] * 4 + [3] * 3 + [0] * 4)
    np.testing.assert_array_equal(row["segment_pos"][0][:12], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2])
    np.testing.assert_array_equal(row["paddings"][0], [0.0] * 12 + [1.0] * 4)
    np.testing.assert_array_equal(row["labels"][0][:12], sum(SEQS, []))


def test_packed_loss_equals_the_examples_one_by_one():
    task = _task()
    packed = task.fprop(FPropContext(), _packed_row(SEQS))
    losses = [float(task.fprop(FPropContext(), _alone(s))["loss"][0]) for s in SEQS]
    weights = [len(s) for s in SEQS]
    one_by_one = float(np.dot(losses, weights) / np.sum(weights))
    assert abs(float(packed["loss"][0]) - one_by_one) < 1e-5
    assert float(packed["loss"][1]) == sum(weights)  # every real token counted once, no padding
    # Token for token too: each segment's log-probs are its own example's.
    row_lp = _token_log_probs(task, _packed_row(SEQS))
    start = 0
    for s in SEQS:
        alone_lp = _token_log_probs(task, _alone(s))[: len(s)]
        np.testing.assert_allclose(row_lp[start : start + len(s)], alone_lp, atol=1e-5)
        start += len(s)


def test_attention_never_crosses_a_segment():
    task = _task()
    row = _packed_row(SEQS)
    other = _packed_row([[14, 3, 16, 17, 18], *SEQS[1:]])  # the first segment's tokens changed
    later = slice(5, 12)  # the second and third segments
    base, changed = _token_log_probs(task, row), _token_log_probs(task, other)
    np.testing.assert_allclose(changed[later], base[later], atol=1e-6)
    assert np.max(np.abs(changed[:5] - base[:5])) > 1e-3  # the changed segment itself does change
    # Without segment ids the later segments would see the first one: the check above can fail.
    leaky = {k: v for k, v in row.items() if k != "segment_ids"}
    leaky_other = {k: v for k, v in other.items() if k != "segment_ids"}
    assert (
        np.max(np.abs(_token_log_probs(task, leaky_other)[later] - _token_log_probs(task, leaky)[later]))
        > 1e-3
    )


def test_flush_emits_every_open_row_and_cuts_long_sequences():
    seqs = [[4] * 10, [5] * 9, [6] * 20, [7] * 3]
    ds = tf.data.Dataset.from_generator(
        lambda: ({"ids": s} for s in seqs), output_signature={"ids": tf.TensorSpec([None], tf.int32)}
    )
    rows = [r["ids"].numpy().tolist() for r in packing.pack(ds, ("ids",), LENGTH, open_rows=2)]
    tokens = sorted(t for r in rows for t in r if t)
    assert tokens == sorted([4] * 10 + [5] * 9 + [6] * LENGTH + [7] * 3)
    assert len(rows) == 3


def _first_fit(lengths, length, open_rows):
    """First fit one example at a time, in plain Python: (rows, starts, segment numbers, rows used)."""
    fill, count, out = [], [], ([], [], [])
    for size in lengths:
        open_ = range(max(0, len(fill) - open_rows), len(fill))
        r = next((j for j in open_ if fill[j] + size <= length), len(fill))
        if r == len(fill):
            fill.append(0)
            count.append(0)
        for values, value in zip(out, (r, fill[r], count[r] + 1)):
            values.append(value)
        fill[r] += size
        count[r] += 1
    return (*out, len(fill))


def _packed_places(windows: list[list[int]], length: int, open_rows: int) -> list[tuple]:
    """``pack_windows`` on windows of examples of these lengths (each window's longest non-empty), read
    back from the packed rows: per window, each non-empty example's (row, start, segment number) and
    the window's rows. Example i of window t has every token ``100 t + i + 1``."""

    def padded():
        for t, lengths in enumerate(windows):
            ids = np.zeros([len(lengths), length], np.int32)
            for i, size in enumerate(lengths):
                ids[i, :size] = 100 * t + i + 1
            yield {"ids": ids}, np.asarray(lengths, np.int32)

    spec = ({"ids": tf.TensorSpec([None, length], tf.int32)}, tf.TensorSpec([None], tf.int32))
    rows = packing.pack_windows(
        tf.data.Dataset.from_generator(padded, output_signature=spec), ("ids",), length, open_rows
    )
    places = [{} for _ in windows]
    first_row = [None] * len(windows)
    for r, packed in enumerate(rows):
        for pos, (token, seg) in enumerate(zip(packed["ids"].numpy(), packed["segment_ids"].numpy())):
            if seg:
                t, i = divmod(int(token) - 1, 100)
                first_row[t] = r if first_row[t] is None else first_row[t]
                places[t].setdefault(i, (r - first_row[t], pos, int(seg)))
    out = []
    for found in places:
        row, start, seg = zip(*(found[i] for i in sorted(found)))
        out.append((list(row), list(start), list(seg), max(row) + 1))
    return out


def test_a_window_packs_as_first_fit_decreasing_one_example_at_a_time():
    """The packer places equal lengths together; the rows are those of plain first fit."""
    rng = np.random.default_rng(0)
    length = 16
    for open_rows in (1, 2, 3, 1024):
        windows = []
        for trial in range(10):
            low = 0 if trial % 3 == 0 else 1  # empty examples too
            n = np.sort(rng.integers(low, length + 1, int(rng.integers(1, 60))))[::-1].tolist()
            n[0] = max(n[0], 1)
            windows.append(n)
        expected = []
        for n in windows:
            row, start, seg, rows = _first_fit(n, length, open_rows)
            real = [i for i, size in enumerate(n) if size]
            expected.append(([row[i] for i in real], [start[i] for i in real], [seg[i] for i in real], rows))
        assert _packed_places(windows, length, open_rows) == expected, (windows, open_rows)
