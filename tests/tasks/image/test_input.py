"""DigitsInput: split sizes, disjointness, determinism, value ranges, single-pass evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from params.errors import ConfigError
from tasks.image import input as input_lib
from tasks.image.input import DigitsInput


def _load(split: str, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    return DigitsInput.Params().set(split=split, **kwargs).instantiate().load()


def test_splits_have_the_documented_sizes_and_cover_every_image() -> None:
    sizes = {s: len(_load(s)[1]) for s in ("train", "dev", "test")}
    assert sizes == {"train": 1257, "dev": 270, "test": 270}
    assert sum(sizes.values()) == 1797


def test_the_bundled_file_reads_as_scikit_learn_loads_it() -> None:
    from sklearn.datasets import load_digits

    images, labels = input_lib.load_digits_file()
    digits = load_digits()
    np.testing.assert_array_equal(images, digits.images)
    np.testing.assert_array_equal(labels, digits.target)


def test_splits_are_disjoint() -> None:
    # Identify each image by its pixels (a few digits are exact duplicates, so compare multisets).
    from sklearn.datasets import load_digits

    all_images = sorted(map(bytes, (load_digits().images / 16.0).astype(np.float32).reshape(-1, 64)))
    split_images = []
    for split in ("train", "dev", "test"):
        split_images += list(map(bytes, _load(split)[0].reshape(-1, 64)))
    assert sorted(split_images) == all_images


def test_split_is_deterministic_and_follows_the_seed() -> None:
    first, second = _load("dev"), _load("dev")
    np.testing.assert_array_equal(first[0], second[0])
    np.testing.assert_array_equal(first[1], second[1])
    other = _load("dev", split_seed=1)
    assert not np.array_equal(first[1], other[1])


def test_examples_are_scaled_images_and_int_labels() -> None:
    images, labels = _load("train")
    assert images.shape == (1257, 8, 8, 1) and images.dtype == np.float32
    assert labels.dtype == np.int32
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(labels.tolist()) == set(range(10))  # every class appears
    assert np.bincount(labels).min() > 90  # and none is nearly missing


def test_eval_dataset_is_one_pass_over_every_dev_example_with_a_partial_batch() -> None:
    p = DigitsInput.Params().set(split="dev", batch_size=64, drop_remainder=False)
    batches = list(p.instantiate().dataset().as_numpy_iterator())
    assert [len(b["label"]) for b in batches] == [64, 64, 64, 64, 14]
    np.testing.assert_array_equal(np.concatenate([b["label"] for b in batches]), _load("dev")[1])


def test_unknown_split_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="split must be one of train, dev, test, got 'validation'"):
        DigitsInput.Params().set(split="validation").instantiate()


def test_training_input_resumes_from_a_checkpoint(tmp_path) -> None:
    p = DigitsInput.Params().set(split="train", batch_size=64, shuffle_seed=3, repeat=True)
    uninterrupted = iter(p.instantiate().dataset())
    want = [next(uninterrupted)["label"].numpy() for _ in range(24)]  # crosses an epoch (19.6 batches)

    it = iter(p.instantiate().dataset())
    for _ in range(18):
        next(it)
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "input"))
    fresh = iter(p.instantiate().dataset())
    tf.train.Checkpoint(iterator=fresh).restore(path).assert_consumed()
    for expected in want[18:]:
        np.testing.assert_array_equal(next(fresh)["label"].numpy(), expected)
