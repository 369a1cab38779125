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
    zeros = tf.zeros([open_rows, length], tf.int32)
    initial = {
        "rows": {k: zeros for k in keys},
        "segment_ids": zeros,
        "segment_pos": zeros,
        "fill": tf.zeros([open_rows], tf.int32),
        "count": tf.zeros([open_rows], tf.int32),
    }

    def step(state, element):
        example, is_flush = element
        n = tf.shape(example[keys[0]])[0]
        fits = state["fill"] + n <= length
        any_fits = tf.reduce_any(fits)
        row = tf.cast(tf.argmax(tf.where(any_fits, tf.cast(fits, tf.int32), state["fill"])), tf.int32)
        emit_one = tf.logical_and(tf.logical_not(is_flush), tf.logical_not(any_fits))
        out_rows = tf.cond(
            is_flush,
            lambda: tf.range(open_rows),
            lambda: tf.cond(emit_one, lambda: tf.reshape(row, [1]), lambda: tf.zeros([0], tf.int32)),
        )
        out_rows = tf.boolean_mask(out_rows, tf.gather(state["fill"], out_rows) > 0)
        emitted = {name: tf.gather(state[name], out_rows) for name in ("segment_ids", "segment_pos")}
        emitted["rows"] = {k: tf.gather(v, out_rows) for k, v in state["rows"].items()}
        # The example goes into ``row`` after position ``start`` (0 if the row was just emitted).
        start = tf.where(emit_one, 0, state["fill"][row])
        count = tf.where(emit_one, 0, state["count"][row]) + 1
        slot = tf.range(length)
        kept = slot < start  # what the row keeps of its old content
        new_part = tf.logical_and(slot >= start, slot < start + n)
        src = tf.clip_by_value(slot - start, 0, tf.maximum(n - 1, 0))
        update = tf.logical_and(
            tf.logical_not(is_flush), tf.one_hot(row, open_rows, on_value=True, off_value=False)
        )

        def write(matrix, values):
            old = matrix[row]
            new_row = tf.where(kept, old, tf.where(new_part, tf.gather(values, src), tf.zeros_like(old)))
            return tf.where(update[:, None], new_row[None, :], matrix)

        new_state = {
            "rows": {k: write(state["rows"][k], example[k]) for k in keys},
            "segment_ids": write(state["segment_ids"], tf.fill([n], count)),
            "segment_pos": write(state["segment_pos"], tf.range(n)),
            "fill": tf.where(update, start + n, state["fill"]),
            "count": tf.where(update, count, state["count"]),
        }
        return new_state, emitted

    def to_rows(emitted):
        out = dict(emitted["rows"])
        out["segment_ids"] = emitted["segment_ids"]
        out["segment_pos"] = emitted["segment_pos"]
        out["paddings"] = tf.cast(tf.equal(emitted["segment_ids"], 0), tf.float32)
        return tf.data.Dataset.from_tensor_slices(out)

    return marked.scan(initial, step).flat_map(to_rows)


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
