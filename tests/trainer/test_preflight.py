"""One validation before anything is written: what training refuses, --mode=inspect_params refuses
too, with one line naming the param's full key, and a refused start leaves no file behind."""

from __future__ import annotations

import subprocess
import sys

import gin
import pytest

from params import experiment
from params.errors import ConfigError
from tests.trainer import runner
from tests.trainer.conftest import FINISHED, copy_finished_run
from trainer import preflight, tf_settings

CONVNET = "image.digits.ConvNet"


@pytest.fixture(autouse=True)
def _no_device_settings(monkeypatch):
    """The test process has its devices already; the check's tf_settings.configure is the binary's."""
    monkeypatch.setattr(tf_settings, "configure", lambda *args, **kwargs: None)
    yield
    gin.clear_config()


@pytest.mark.parametrize(
    "override, gin_param, key",
    [
        ("task.train.optimizer : 'adamw'", None, "task.train.optimizer"),
        ("task.train.lr_schedule : 'cosinee'", None, "task.train.lr_schedule"),
        ("task.body.sub[2].activation : 'relux'", None, "'task.body.sub[2].activation'"),
        ("task.softmax.input_dim : 100", None, "'task.softmax.input_dim'"),
        ("task.train.max_steps : 50", None, "task.train.warmup_steps"),
        ("task.train.save_interval_steps : -1", None, "task.train.save_interval_steps"),
        (None, "ConvNet.bn_decay = 1e400", "'task.body.sub[1].decay'"),
    ],
)
def test_what_training_refuses_is_refused_before_anything_runs(override, gin_param, key):
    root = experiment.resolve(
        CONVNET, params_override=override, gin_bindings=[gin_param] if gin_param else []
    )
    with pytest.raises(ConfigError) as e:
        preflight.check(root)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_the_default_experiment_passes():
    preflight.check(experiment.resolve(CONVNET))


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ("--params_override=task.body.sub[2].activation : 'relux'",),
        ("--mode=inspect_params", "--gin_param=ConvNet.bn_decay = 1e400"),
    ],
)
def test_a_refused_start_exits_2_and_leaves_no_file(tmp_path, flags):
    logdir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "trainer", f"--model={CONVNET}", f"--logdir={logdir}", *flags],
        cwd=runner.REPO,
        env=runner._env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("trainer: error: param 'task.body.sub[")
    assert result.stdout == ""
    assert not logdir.exists()


def _tree(logdir):
    return {str(p.relative_to(logdir)): p.stat().st_mtime_ns for p in sorted(logdir.rglob("*"))}


@pytest.mark.slow
def test_a_finished_run_asked_again_says_so_and_writes_nothing(tmp_path, finished_run):
    logdir, data_dir = copy_finished_run(finished_run, tmp_path)
    before = _tree(logdir)
    again = runner.run(logdir, data_dir, override=FINISHED)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == [
        f"trainer: {logdir} holds a finished run (checkpoint at step 20, task.train.max_steps 20; every "
        "job done): nothing to do, nothing written (raise task.train.max_steps to continue it)"
    ]
    assert _tree(logdir) == before  # no new events file, nothing touched
