"""Test-session set-up: four logical CPU devices (pipeline tests need up to K=4) before TF starts; the
test experiments (``tests.*``, named by full path) opted in as an experiment package, for the tests in
this process and the binaries they start; and the fixtures that the whole run shares (one trained
default experiment, made once across xdist workers)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One intra-op thread in every TensorFlow process of the run (this one, and the binaries the tests
# start, which inherit it) unless a test or cluster setting asks for more: three workers share two
# cores, and each process's default pool of a thread per core spins while it waits (13-18% more CPU
# seconds for the in-process tests, measured).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TENSORPIPE_EXPERIMENT_PACKAGES", "tests")

import tensorflow as tf  # noqa: E402

NUM_TEST_DEVICES = 4

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_DEVICES
)


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(directory)`` once for the whole test run: the first process (pytest, or the first xdist
    worker) to ask makes it under the run's shared temporary directory; the others wait for it and get
    the same directory. They must only read it (copy it to change it). A failed ``make`` is retried by
    the next process that asks, so each reports the failure."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the workers' basetemps are popen-gwN folders of one run's folder
    directory, done = base / name, base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)
            make(directory)
            done.touch()
    return directory


@pytest.fixture(autouse=True)
def fresh_gin_config():
    """Gin bindings are process-wide (``experiment.resolve`` leaves them bound): one test's bindings
    must not reach the next test run by the same worker."""
    yield
    import gin

    gin.clear_config()


@dataclass(frozen=True)
class TrainedRun:
    logdir: Path
    stdout: str
    stderr: str


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> TrainedRun:
    """The README's first command as written (``python -m trainer --model=image.digits.ConvNet``, its
    1500 steps, evaler and decoder), run once for every test that needs a trained default logdir."""

    from tests.trainer.runner import REPO, _env  # here: Bazel's params tests carry no tests/trainer

    def train(directory: Path) -> None:
        directory.mkdir()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainer",
                "--model=image.digits.ConvNet",
                f"--logdir={directory / 'digits'}",
            ],
            cwd=REPO,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        (directory / "stdout.txt").write_text(result.stdout)
        (directory / "stderr.txt").write_text(result.stderr)

    directory = made_once(tmp_path_factory, "default_run", train)
    return TrainedRun(
        directory / "digits", (directory / "stdout.txt").read_text(), (directory / "stderr.txt").read_text()
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow tests first (otherwise in collection order): the workers hand out tests in this
    order, so the long ones start early and the workers end together rather than one finishing a
    long test alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` (what ``tools/dev.py test`` runs), as this suite wants it: a test file that
    defines a module-scoped fixture (a logdir trained once for the module) goes to one worker whole,
    so the fixture is built once; every other test is handed out on its own, so long ones (each
    document's commands, the pipeline sweeps) spread over the workers."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixturesTogether(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log=None) -> None:
            super().__init__(config, log)
            self._shares: dict[str, bool] = {}

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            if path not in self._shares:
                source = (config.rootpath / path).read_text() if path.endswith(".py") else ""
                self._shares[path] = 'scope="module"' in source
            return path if self._shares[path] else nodeid

    return ModuleFixturesTogether(config, log)
