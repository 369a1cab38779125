"""Fixtures of the trainer tests: the linear experiment's data files, and one finished run of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import made_once
from tests.trainer import linear_experiment, runner


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("linear_data")
    linear_experiment.write_data(str(path / "train.npz"), 256, seed=1)
    linear_experiment.write_data(str(path / "dev.npz"), 64, seed=2)
    linear_experiment.write_data(str(path / "test.npz"), 24, seed=3)
    return path


FINISHED = "task.train.max_steps : 20; task.train.save_interval_steps : 10"


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> tuple[Path, Path]:
    """(logdir, data_dir): a finished run of the linear experiment with every job (checkpoints at
    steps 10 and 20, each evaluated and decoded) and its own data files, made once for the test run
    (tests/conftest.py's ``made_once``, shared by the xdist workers). A test copies the logdir
    (``copy_finished_run``) before it changes anything; the data files are only read."""

    def make(directory: Path) -> None:
        data = directory / "data"
        data.mkdir(parents=True)
        linear_experiment.write_data(str(data / "train.npz"), 256, seed=1)
        linear_experiment.write_data(str(data / "dev.npz"), 64, seed=2)
        linear_experiment.write_data(str(data / "test.npz"), 24, seed=3)
        result = runner.run(directory / "run", data, override=FINISHED)
        assert result.returncode == 0, result.stderr[-3000:]

    directory = made_once(tmp_path_factory, "linear_finished_run", make)
    return directory / "run", directory / "data"


def copy_finished_run(finished_run: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``finished_run``'s logdir (file times kept) under ``tmp_path``, and its data directory."""
    logdir = tmp_path / "run"
    shutil.copytree(finished_run[0], logdir)
    return logdir, finished_run[1]
