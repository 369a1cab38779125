"""Image inputs: ``DigitsInput``, scikit-learn's bundled 8x8 handwritten digits (no download)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from params.errors import ConfigError
from params.hyperparams import InstantiableParams
from tasks.base_input import BaseInput

SPLITS = ("train", "dev", "test")
DEV_FRACTION = 0.15
TEST_FRACTION = 0.15


def split_indices(num_examples: int, split: str, seed: int) -> np.ndarray:
    """Indices of ``split`` in a fixed permutation of ``range(num_examples)``: the first 15% (rounded)
    are dev, the next 15% test and the rest (~70%) train. The same seed always gives the same split."""
    order = np.random.RandomState(seed).permutation(num_examples)
    num_dev = int(round(DEV_FRACTION * num_examples))
    num_test = int(round(TEST_FRACTION * num_examples))
    bounds = {
        "dev": (0, num_dev),
        "test": (num_dev, num_dev + num_test),
        "train": (num_dev + num_test, num_examples),
    }
    start, end = bounds[split]
    return order[start:end]


def load_digits_file() -> tuple[np.ndarray, np.ndarray]:
    """(images [1797, 8, 8] float64 in 0..16, labels [1797] int): what ``sklearn.datasets.load_digits``
    returns, read from the file scikit-learn bundles (datasets/data/digits.csv.gz) without importing
    scikit-learn, whose import (SciPy included) was a second of CPU in every trainer's start."""
    spec = importlib.util.find_spec("sklearn")
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / "datasets" / "data" / "digits.csv.gz" if locations else None
    if path is None or not path.is_file():
        raise ConfigError(
            "the digits data set needs scikit-learn's bundled digits.csv.gz; pip install scikit-learn"
        )
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


class DigitsInput(BaseInput):
    """The 1797 8x8 grayscale digits of ``sklearn.datasets.load_digits``, split train/dev/test.

    Each example is ``{'image': float32 [8, 8, 1] in [0, 1], 'label': int32 in [0, 10)}``.
    """

    NUM_CLASSES = 10
    IMAGE_SHAPE = (8, 8, 1)

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("split", "train", "train (~70%), dev (~15%) or test (~15%).")
        p.define("split_seed", 20240601, "Seed of the fixed permutation that assigns examples to splits.")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        if p.split not in SPLITS:
            raise ConfigError(f"input {p.name!r}: split must be one of {', '.join(SPLITS)}, got {p.split!r}")

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """(images [n, 8, 8, 1] float32 in [0, 1], labels [n] int32) of this split, in split order."""
        all_images, all_labels = load_digits_file()
        index = split_indices(len(all_labels), self.params.split, self.params.split_seed)
        images = (all_images[index] / 16.0).astype(np.float32)[..., np.newaxis]
        return images, all_labels[index].astype(np.int32)

    def in_memory(self) -> dict[str, np.ndarray]:
        images, labels = self.load()
        return {"image": images, "label": labels}


class DigitsParityInput(DigitsInput):
    """The digits of DigitsInput labelled by their parity: ``label`` 0 for an even digit, 1 for an odd one."""

    NUM_CLASSES = 2

    def in_memory(self) -> dict[str, np.ndarray]:
        arrays = super().in_memory()
        return {"image": arrays["image"], "label": arrays["label"] % 2}
