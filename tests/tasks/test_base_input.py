"""BaseInput: take/shuffle/repeat/batch, validation, resuming an iterator from a checkpoint, and a
worker's shard read from arrays in memory."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from params.errors import ConfigError
from tasks.base_input import BaseInput


class RangeInput(BaseInput):
    """Examples {'x': i, 'y': 2i} for i in range(num_examples)."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("num_examples", 20, "Number of examples.")
        return p

    def examples(self) -> tf.data.Dataset:
        x = tf.range(self.params.num_examples, dtype=tf.int64)
        return tf.data.Dataset.from_tensor_slices({"x": x, "y": 2 * x})


def _batches(p, n: int) -> list[np.ndarray]:
    it = iter(p.instantiate().dataset())
    return [next(it)["x"].numpy() for _ in range(n)]


def test_single_pass_keeps_order_and_the_partial_batch() -> None:
    p = RangeInput.Params().set(batch_size=8, drop_remainder=False)
    batches = [b["x"].tolist() for b in p.instantiate().dataset().as_numpy_iterator()]
    assert batches == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    p.drop_remainder = True
    assert len(list(p.instantiate().dataset())) == 2


def test_num_samples_takes_the_first_examples() -> None:
    p = RangeInput.Params().set(batch_size=5, num_samples=10, repeat=True)
    assert np.concatenate(_batches(p, 4)).tolist() == list(range(10)) * 2


def test_shuffle_is_seeded_and_reshuffles_each_epoch() -> None:
    p = RangeInput.Params().set(batch_size=20, shuffle_seed=7, shuffle_buffer_size=100, repeat=True)
    first = _batches(p, 3)
    again = _batches(p, 3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)  # same seed, same order
    assert sorted(first[0].tolist()) == list(range(20))  # each epoch is a permutation
    assert first[0].tolist() != first[1].tolist()  # and a different one each epoch
    other = _batches(p.copy().set(shuffle_seed=8), 1)
    assert other[0].tolist() != first[0].tolist()


@pytest.mark.parametrize("seed", [None, 11])
def test_iterator_resumes_from_a_checkpoint(tmp_path, seed) -> None:
    """Save after k batches (mid-epoch, shuffled, repeated), restore into a fresh iterator: the next
    batches equal those of an uninterrupted run."""
    p = RangeInput.Params().set(batch_size=6, shuffle_seed=seed, shuffle_buffer_size=8, repeat=True)
    uninterrupted = _batches(p, 12)

    it = iter(p.instantiate().dataset())
    for _ in range(5):
        next(it)
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "input"))
    for _ in range(3):
        next(it)  # advancing the old iterator after saving must not matter

    fresh = iter(p.instantiate().dataset())
    tf.train.Checkpoint(iterator=fresh).restore(path).assert_consumed()
    resumed = [next(fresh)["x"].numpy() for _ in range(7)]
    for got, want in zip(resumed, uninterrupted[5:]):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"batch_size": 0}, "batch_size must be > 0"),
        ({"num_samples": -1}, "num_samples must be >= 0"),
        ({"shuffle_seed": 1, "shuffle_buffer_size": 0}, "shuffle_buffer_size must be > 0"),
    ],
)
def test_bad_settings_are_config_errors(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RangeInput.Params().set(name="train", **settings).instantiate()


class InMemoryRangeInput(RangeInput):
    """RangeInput that also offers its arrays: a sharded dataset shuffles row numbers and gathers."""

    def in_memory(self) -> dict[str, np.ndarray]:
        x = np.arange(self.params.num_examples, dtype=np.int64)
        return {"x": x, "y": 2 * x}


@pytest.mark.parametrize("num_samples", [0, 13])
def test_a_shard_gathered_from_memory_equals_the_element_pipeline(num_samples) -> None:
    """Shuffling never looks at the elements, so shuffling row numbers and gathering gives each worker
    the very batches (order included) of shuffling the examples, over several reshuffled epochs."""
    settings = dict(batch_size=8, shuffle_seed=5, repeat=True, num_samples=num_samples)

    def shard(cls, index: int) -> list[dict]:
        inp = cls.Params().set(**settings).instantiate()
        inp.shard(index, 2)
        return list(inp.dataset().take(12).as_numpy_iterator())

    for index in (0, 1):
        got, want = shard(InMemoryRangeInput, index), shard(RangeInput, index)
        assert len(got) == len(want) == 12
        for a, b in zip(got, want):
            assert a["x"].shape == (4,) and a["x"].dtype == b["x"].dtype
            np.testing.assert_array_equal(a["x"], b["x"])
            np.testing.assert_array_equal(a["y"], 2 * a["x"])


def test_one_process_reads_examples_not_the_arrays() -> None:
    """Its iterator position is checkpointed: the pipeline it restores into must stay the same."""

    class ArraysRefused(InMemoryRangeInput):
        def in_memory(self) -> dict[str, np.ndarray]:
            raise AssertionError("in_memory() called for one process")

    p = ArraysRefused.Params().set(batch_size=8, shuffle_seed=5, repeat=True)
    assert _batches(p, 2)[1].shape == (8,)


def test_arrays_of_different_lengths_are_a_config_error() -> None:
    class Ragged(RangeInput):
        def in_memory(self) -> dict[str, np.ndarray]:
            return {"x": np.arange(4), "y": np.arange(5)}

    inp = Ragged.Params().set(batch_size=8).instantiate()
    inp.shard(0, 2)
    with pytest.raises(ConfigError, match=r"in_memory\(\) arrays differ in rows: \[4, 5\]"):
        inp.dataset()
