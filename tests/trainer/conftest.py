"""Fixtures of the trainer tests: the linear experiment's data files."""

from __future__ import annotations

import pytest

from tests.trainer import linear_experiment


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("linear_data")
    linear_experiment.write_data(str(path / "train.npz"), 256, seed=1)
    linear_experiment.write_data(str(path / "dev.npz"), 64, seed=2)
    linear_experiment.write_data(str(path / "test.npz"), 24, seed=3)
    return path
