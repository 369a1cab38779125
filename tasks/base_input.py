"""Input generators: ``tf.data`` pipelines built from Params.

A subclass implements ``examples()`` (one dict of tensors per example, in a fixed order); this base
class takes ``num_samples``, shuffles with a fixed seed, repeats, batches and prefetches. Every stage is
a native ``tf.data`` op, so the iterator's position can be saved in a checkpoint
(``tf.train.Checkpoint(iterator=iter(ds))``) and a resumed run sees exactly the batches an
uninterrupted run would. Data-parallel training on several workers calls ``shard(index, count)``
first: worker ``index`` then reads examples ``index, index + count, ...`` of the same shuffled stream in
batches of ``batch_size / count``, so the workers' batches at each step together hold exactly the
examples of the one-process global batch. Each worker walks the whole shuffled stream to keep its
share; an input whose data set fits in memory (``in_memory()``) lets it walk example *indices* instead
and gather its rows a batch at a time (the same batches, for less than half the tf.data work, which
on a worker with one core is compute taken from the step). File readers (TFRecord, text lines) are in
``tasks.readers``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params


class BaseInput:
    """Base of input generators."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802 (Lingvo's name)
        p = InstantiableParams(cls)
        p.define("name", "input", "Name of the data set (train, dev, test, ...).")
        p.define("batch_size", 32, "Examples per batch (the global batch).")
        p.define("num_samples", 0, "Use only the first N examples (0: all).")
        p.define(
            "shuffle_seed", None, "Shuffle with this seed each epoch (None: keep the order).", value_type=int
        )
        p.define("shuffle_buffer_size", 10000, "Examples held by the shuffle buffer.")
        p.define("repeat", False, "Cycle forever (training) or make one pass (evaluation).")
        p.define("drop_remainder", True, "Drop a last partial batch (keeps batch shapes static).")
        return p

    def __init__(self, params: Params) -> None:
        self._params = params.copy().freeze()
        p = self._params
        if p.batch_size <= 0:
            raise ConfigError(f"input {p.name!r}: batch_size must be > 0, got {p.batch_size!r}")
        if p.num_samples < 0:
            raise ConfigError(f"input {p.name!r}: num_samples must be >= 0 (0: all), got {p.num_samples!r}")
        if p.shuffle_seed is not None and p.shuffle_buffer_size <= 0:
            raise ConfigError(
                f"input {p.name!r}: shuffle_buffer_size must be > 0 to shuffle, got {p.shuffle_buffer_size!r}"
            )
        self._shard = (0, 1)

    def shard(self, index: int, count: int) -> None:
        """Makes ``dataset()`` yield worker ``index`` of ``count``'s share of every global batch."""
        p = self.params
        if type(self).dataset is not BaseInput.dataset and count > 1:
            raise ConfigError(
                f"input {p.name!r}: {type(self).__name__} builds its own batches; it cannot be sharded"
            )
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"input {p.name!r}: shard {index} of {count} does not exist")
        if p.batch_size % count:
            raise ConfigError(
                f"input {p.name!r}: batch_size {p.batch_size} (the global batch) must be a multiple of the "
                f"{count} workers"
            )
        self._shard = (index, count)

    @property
    def params(self) -> Params:
        return self._params

    def shuffle_buffer(self) -> int:
        """Elements of ``examples()`` the shuffle holds (default: ``shuffle_buffer_size``)."""
        return self.params.shuffle_buffer_size

    def inspect(self) -> str:
        """What ``--mode=inspect_datasets`` shows of the data beside the Params (default: nothing)."""
        return ""

    def notes(self) -> list[str]:
        """Lines the trainer prints at its start about what it read of the data (default: none)."""
        return []

    def files_to_keep(self) -> list[str]:
        """Files the run needs that its checkpoints do not hold; the trainer copies them into the logdir
        beside params.txt (``tools.export`` uses the copy when the original has moved). Default: the
        model file of a ``vocab`` whose type is sentencepiece."""
        p = self.params
        vocab = p.get("vocab") if "vocab" in p else None
        if isinstance(vocab, Params) and "type" in vocab and vocab.type == "sentencepiece" and vocab.file:
            return [vocab.file]
        return []

    def examples(self) -> tf.data.Dataset:
        """One example (a dict of tensors) per element, in a deterministic order (by default the rows
        of ``in_memory()``)."""
        arrays = self.in_memory()
        if arrays is None:
            raise NotImplementedError(f"{type(self).__name__}.examples")
        return tf.data.Dataset.from_tensor_slices(arrays)

    def in_memory(self) -> dict[str, np.ndarray] | None:
        """The whole data set as arrays, one row per example in ``examples()``' order (None: not held in
        memory). Used by a sharded ``dataset()`` only: a single process keeps reading ``examples()``,
        whose iterator position its checkpoints hold (a data-parallel worker's is not checkpointed)."""
        return None

    def dataset(self, by_row: bool = True) -> tf.data.Dataset:
        """Batches ready for the task: take, shuffle, repeat, batch, prefetch.

        Examples whose tensors have a dimension of unknown size (variable-length features) are
        padded with zeros (empty strings) to the longest in their batch. ``by_row=False`` makes a
        sharded in-memory input walk every example too (``tools.benchmark input`` compares both).
        """
        p = self.params
        index, count = self._shard
        arrays = self.in_memory() if count > 1 and by_row else None
        if not arrays:
            ds = self.examples()
        else:  # shuffle and shard row numbers: shuffling does not look at the elements
            rows = {len(value) for value in arrays.values()}
            if len(rows) != 1:
                raise ConfigError(f"input {p.name!r}: in_memory() arrays differ in rows: {sorted(rows)}")
            ds = tf.data.Dataset.range(rows.pop())
        if p.num_samples:
            ds = ds.take(p.num_samples)
        if p.shuffle_seed is not None:
            ds = ds.shuffle(self.shuffle_buffer(), seed=p.shuffle_seed, reshuffle_each_iteration=True)
        if p.repeat:
            ds = ds.repeat()
        if count > 1:
            ds = ds.shard(count, index)
        ds = self.batch(ds, p.batch_size // count)
        if arrays:
            tensors = {name: tf.constant(value) for name, value in arrays.items()}
            ds = ds.map(lambda rows: {name: tf.gather(t, rows) for name, t in tensors.items()})
        return ds.prefetch(2)

    def batch(self, ds: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
        """Examples -> batches of ``batch_size`` (this worker's share): padded to the longest in the
        batch where a dimension's size is unknown. A subclass may batch otherwise (by length buckets)."""
        if _has_unknown_dims(ds.element_spec):
            return ds.padded_batch(batch_size, drop_remainder=self.params.drop_remainder)
        return ds.batch(batch_size, drop_remainder=self.params.drop_remainder)


def _has_unknown_dims(element_spec: object) -> bool:
    specs = tf.nest.flatten(element_spec)
    return any(isinstance(s, tf.TensorSpec) and not s.shape.is_fully_defined() for s in specs)


def set_split_mode(p: Params, split: str, shuffle_seed: int) -> Params:
    """The usual reading of a data set: ``train`` shuffled with a fixed seed, repeated, in full batches;
    any other split in one ordered pass over every example (a last partial batch kept). Returns p."""
    if split == "train":
        return p.set(shuffle_seed=shuffle_seed, repeat=True, drop_remainder=True)
    return p.set(shuffle_seed=None, repeat=False, drop_remainder=False)
