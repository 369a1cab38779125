"""Packing variable-length sequences into fixed-length rows, as Lingvo's packed inputs do.

``pack`` turns a stream of examples ``{key: [n] int32}`` (the same n for every key of one example) into
rows ``{key: [length]}`` holding several examples each, plus ``segment_ids`` (1, 2, ... per example in
the row, 0 on padding), ``segment_pos`` (each example's positions from 0) and ``paddings`` (1.0 where no
example is). Attention masked by segment ids (``layers.attention.segment_mask``) and positions taken
from ``segment_pos`` make a packed row compute exactly what its examples would one by one.

The packer is first-fit over ``open_rows`` rows being filled: an example goes into the first open row
with room; when none has room, the fullest row is emitted and the example starts it afresh. At the end
of the stream the open rows are emitted. Every stage is a native ``tf.data`` op (``scan``), so an
iterator over packed rows is saved in a checkpoint like any other. Examples longer than ``length`` are
cut to ``length``.
"""

from __future__ import annotations

import tensorflow as tf

PACKED_KEYS = ("segment_ids", "segment_pos", "paddings")


def pack(ds: tf.data.Dataset, keys: tuple[str, ...], length: int, open_rows: int = 8) -> tf.data.Dataset:
    """Rows of ``length`` positions packed first-fit from ``ds``'s examples (see the module doc)."""
    flush = {key: tf.constant([-1], tf.int32) for key in keys}  # one marker element: emit every open row
    marked = ds.map(lambda ex: ({k: tf.cast(ex[k], tf.int32)[:length] for k in keys}, False))
    marked = marked.concatenate(tf.data.Dataset.from_tensors((flush, True)))
    planes = len(keys) + 2  # the keys, then segment_ids and segment_pos: one tensor, written at once
    initial = {
        "planes": tf.zeros([planes, open_rows, length], tf.int32),
        "fill": tf.zeros([open_rows], tf.int32),
        "count": tf.zeros([open_rows], tf.int32),
    }
    slot = tf.range(length)
    row_ids = tf.range(open_rows)

    def step(state, element):
        example, is_flush = element
        n = tf.shape(example[keys[0]])[0]
        fill = state["fill"]
        fits = fill + n <= length
        any_fits = tf.reduce_any(fits)
        row = tf.cast(tf.argmax(tf.where(any_fits, tf.cast(fits, tf.int32), fill)), tf.int32)
        emit_one = tf.logical_and(tf.logical_not(is_flush), tf.logical_not(any_fits))
        chosen = tf.equal(row_ids, row)
        emit = tf.logical_and(fill > 0, tf.logical_or(is_flush, tf.logical_and(emit_one, chosen)))
        emitted = tf.gather(state["planes"], tf.boolean_mask(row_ids, emit), axis=1)
        # The example goes into ``row`` after position ``start`` (0 if the row was just emitted).
        start = tf.where(emit_one, 0, tf.gather(fill, row))
        count = tf.where(emit_one, 0, tf.gather(state["count"], row)) + 1
        values = tf.stack([example[k] for k in keys] + [tf.fill([n], count), tf.range(n)])  # [planes, n]
        src = tf.clip_by_value(slot - start, 0, tf.maximum(n - 1, 0))
        new_part = tf.logical_and(slot >= start, slot < start + n)
        old_row = tf.gather(state["planes"], row, axis=1)  # [planes, length]
        new_row = tf.where(
            slot < start, old_row, tf.where(new_part, tf.gather(values, src, axis=1), tf.zeros_like(old_row))
        )
        update = tf.logical_and(tf.logical_not(is_flush), chosen)
        new_state = {
            "planes": tf.where(update[None, :, None], new_row[:, None, :], state["planes"]),
            "fill": tf.where(update, start + n, fill),
            "count": tf.where(update, count, state["count"]),
        }
        return new_state, emitted

    def to_rows(emitted):  # [planes, m, length] -> {name: [m, length]}; m is 0, 1 or (flush) more
        out = {k: emitted[i] for i, k in enumerate(keys)}
        out["segment_ids"], out["segment_pos"] = emitted[len(keys)], emitted[len(keys) + 1]
        out["paddings"] = tf.cast(tf.equal(out["segment_ids"], 0), tf.float32)
        return out

    # unbatch, not flat_map: no dataset made per example (several times faster).
    return marked.scan(initial, step).map(to_rows).unbatch()


def bucket(
    ds: tf.data.Dataset, key: str, boundaries: list[int], batch_size: int, drop_remainder: bool = False
) -> tf.data.Dataset:
    """Batches of examples of similar ``len(example[key])`` (padded to the longest of their bucket's
    batch): ``tf.data``'s bucket_by_sequence_length, one batch size for every bucket."""
    return ds.bucket_by_sequence_length(
        lambda ex: tf.shape(ex[key])[0],
        bucket_boundaries=list(boundaries),
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        pad_to_bucket_boundary=False,
        drop_remainder=drop_remainder,
    )


def efficiency(paddings: tf.Tensor) -> float:
    """Real tokens / slots of a batch (or many): the share of positions that are not padding."""
    return float(1.0 - tf.reduce_mean(tf.cast(paddings, tf.float32)))
