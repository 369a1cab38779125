"""Packing variable-length sequences into fixed-length rows, as Lingvo's packed inputs do.

``pack`` turns a stream of examples ``{key: [n] int32}`` (the same n for every key of one example) into
rows ``{key: [length]}`` holding several examples each, plus ``segment_ids`` (1, 2, ... per example in
the row, 0 on padding), ``segment_pos`` (each example's positions from 0) and ``paddings`` (1.0 where no
example is). Attention masked by segment ids (``layers.attention.segment_mask``) and positions taken
from ``segment_pos`` make a packed row compute exactly what its examples would one by one.

The packer works on a window of ``window`` examples at a time (one ``tf.data`` element: the examples
padded into one [window, length] batch), first-fit decreasing: the window's examples, longest first,
each go into the first of the ``open_rows`` most recently opened rows with room (default: every row
of the window), else start a new row. Only the examples' lengths walk a loop (a ``tf.while_loop``
of [rows] vector ops, one step per distinct length: every example of a length placed at once); the
tokens are then written into every row of the window by one scatter. A window's rows are all emitted
(the last ones partly filled), so windows are independent: every stage is a native ``tf.data`` op
(batch, map, unbatch) and an iterator over packed rows is saved in a checkpoint like any other, each
example in exactly one row. Examples longer than ``length`` are cut to ``length``.
"""

from __future__ import annotations

import collections

import tensorflow as tf

WINDOW = 1024  # examples packed per step: more packs tighter (fewer part-filled rows per example)


def pack(
    ds: tf.data.Dataset, keys: tuple[str, ...], length: int, open_rows: int = WINDOW, window: int = WINDOW
) -> tf.data.Dataset:
    """Rows of ``length`` positions packed from ``ds``'s examples (see the module doc)."""
    cut = ds.map(lambda ex: {k: tf.cast(ex[k], tf.int32)[:length] for k in keys})
    lengths = cut.map(lambda ex: (ex, tf.shape(ex[keys[0]])[0]))
    padded = lengths.padded_batch(window, padded_shapes=({k: [length] for k in keys}, []))
    return pack_windows(padded, keys, length, open_rows)


def padded_window(
    examples: dict[str, tf.RaggedTensor], keys: tuple[str, ...], length: int
) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """A window of ragged examples ``{key: [w, None]}`` as ``pack_windows`` takes it: each key padded
    to [w, length] (cut there), and the examples' lengths [w]."""
    n = tf.cast(tf.minimum(examples[keys[0]].row_lengths(), length), tf.int32)
    dense = {k: tf.cast(examples[k][:, :length].to_tensor(shape=[None, length]), tf.int32) for k in keys}
    return dense, n


def pack_windows(
    windows: tf.data.Dataset, keys: tuple[str, ...], length: int, open_rows: int
) -> tf.data.Dataset:
    """Rows packed from windows ``({key: [w, length]}, lengths [w])``, each window on its own."""
    # unbatch, not flat_map: no dataset made per window.
    return windows.map(lambda ex, n: _pack_window(ex, n, keys, length, open_rows)).unbatch()


def _assign_rows(
    n: tf.Tensor, length: int, open_rows: int
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """First fit of lengths ``n`` [w] (sorted longest first, each at most ``length``) into rows of
    ``length``, among the ``open_rows`` newest rows: each example's row, its start in the row and its
    segment number; and the rows used.

    Examples of one length are placed together, one loop step per distinct length (about 105 a
    window of the bundled corpus, against 1024 examples; a tf.while_loop costs ~1 us an op a step,
    which made the per-example loop most of the input's CPU time): first fit puts equal
    examples into the open rows in row order, each row taking as many as fit, so row ``j`` takes
    ``clip(k - before_j, 0, cap_j)`` of ``k``, ``cap`` the examples that fit in each open row and
    ``before`` its exclusive cumulative sum. Rows not yet used are empty, so a new row is the first
    with room once the open rows are full; a row that closes while a length is placed has no room
    for it (first fit would have filled it before opening a new one). The loop keeps only how many
    of each length each row takes; rows, starts and segment numbers follow from it afterwards."""
    w = tf.shape(n)[0]
    rows = tf.range(w)
    sizes, _, counts = tf.unique_with_counts(n, out_idx=tf.int32)
    # Per length: its size, its count, and the room a row needs (empty examples fit any open row).
    table = tf.stack([sizes, counts, tf.maximum(sizes, 1), tf.where(sizes > 0, length, length + w)], axis=1)

    def body(g, fill, count, takes):
        size, k, divisor, limit = tf.unstack(table[g])
        used = tf.reduce_sum(tf.cast(count > 0, tf.int32))
        cap = tf.where(rows >= used - open_rows, (limit - fill) // divisor, 0)
        take = tf.minimum(tf.maximum(k - tf.cumsum(cap, exclusive=True), 0), cap)
        return g + 1, fill + take * size, count + take, takes.write(g, take)

    zeros = tf.zeros([w], tf.int32)
    takes = tf.TensorArray(tf.int32, size=tf.size(sizes), element_shape=[None])
    _, _, count, takes = tf.while_loop(
        lambda g, *_: g < tf.size(sizes), body, (0, zeros, zeros, takes), parallel_iterations=1
    )
    # The (length, row) blocks that took examples, in order (the examples' sorted order): each
    # example's row. A row's examples come in sorted order too, so its starts and segment numbers
    # are running sums over the examples grouped by row.
    flat = tf.reshape(takes.stack(), [-1])
    blocks = tf.cast(tf.where(flat > 0)[:, 0], tf.int32)
    ends = tf.cumsum(tf.gather(flat, blocks))
    row = tf.gather(blocks, tf.searchsorted(ends, rows, side="right", out_type=tf.int32)) % w
    by_row = tf.argsort(row, stable=True)
    grouped = tf.gather(row, by_row)
    first = tf.searchsorted(grouped, grouped, side="left", out_type=tf.int32)  # each row's first example
    filled = tf.cumsum(tf.gather(n, by_row), exclusive=True)
    back = tf.math.invert_permutation(by_row)
    start = tf.gather(filled - tf.gather(filled, first), back)
    seg = tf.gather(rows - first + 1, back)
    return row, start, seg, tf.reduce_sum(tf.cast(count > 0, tf.int32))


def _pack_window(
    examples: dict[str, tf.Tensor], n: tf.Tensor, keys: tuple[str, ...], length: int, open_rows: int
) -> dict[str, tf.Tensor]:
    """One window ``{key: [w, length]}`` with lengths ``n`` [w] -> its packed rows ``{name: [r, length]}``."""
    order = tf.argsort(n, direction="DESCENDING", stable=True)  # first fit decreasing
    placed = _assign_rows(tf.gather(n, order), length, open_rows)
    back = tf.math.invert_permutation(order)  # each example's place in that order
    row, start, seg = (tf.gather(x, back) for x in placed[:3])
    pos = tf.range(length)[None, :]
    real = pos < n[:, None]  # [w, length]: the examples' tokens
    grid = tf.shape(real)
    planes = [examples[k] for k in keys] + [tf.broadcast_to(seg[:, None], grid), tf.broadcast_to(pos, grid)]
    tokens = tf.boolean_mask(tf.stack(planes, axis=-1), real)  # [tokens, planes]
    target = tf.boolean_mask((row * length + start)[:, None] + pos, real)  # each token's flat slot
    flat = tf.scatter_nd(target[:, None], tokens, tf.stack([placed[3] * length, len(planes)]))
    out = tf.unstack(
        tf.ensure_shape(tf.reshape(flat, [-1, length, len(planes)]), [None, length, len(planes)]), axis=-1
    )
    rows = dict(zip(keys, out))
    rows["segment_ids"], rows["segment_pos"] = out[len(keys)], out[len(keys) + 1]
    rows["paddings"] = tf.cast(tf.equal(rows["segment_ids"], 0), tf.float32)
    return rows


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


def histogram(values: list[int], bins: int = 8, width: int = 40) -> list[str]:
    """Text bars of ``values`` in ``bins`` equal ranges (what ``--mode=inspect_datasets`` prints of
    sequence lengths)."""
    if not values:
        return ["(none)"]
    low, high = min(values), max(values)
    step = max(1, -(-(high - low + 1) // bins))
    counts = collections.Counter((v - low) // step for v in values)
    top = max(counts.values())
    out = []
    for b in range(-(-(high - low + 1) // step)):
        lo, n = low + b * step, counts.get(b, 0)
        out.append(f"{lo:5d}-{lo + step - 1:<5d} {n:7d} {'#' * round(width * n / top)}")
    return out
