"""tools.params_diff: Lingvo-TextDiff lines between two runs' Params (logdirs, files, experiment keys)."""

from __future__ import annotations

import subprocess
import sys

import gin
import pytest

from params import experiment
from params.errors import ConfigError
from tests.trainer.runner import REPO, _env
from tools import params_diff


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


A = """model : 'x.Exp'
task.body.sub[0].dim : 8
task.body.sub[0].name : 'a'
task.body.sub[1].name : 'b'
task.train.learning_rate : 0.1
"""
B = """model : 'x.Exp'
task.body.sub[0].dim : 16
task.body.sub[0].name : 'a'
task.train.learning_rate : 0.1
task.train.schedule.warmup : 10
"""


def test_added_removed_and_changed_nested_keys(tmp_path):
    (tmp_path / "a.txt").write_text(A)
    (tmp_path / "b.txt").write_text(B)
    assert params_diff.diff(str(tmp_path / "a.txt"), str(tmp_path / "b.txt")) == [
        "> task.body.sub[0].dim : 8",  # Lingvo's A.TextDiff(B): '>' A's side, '<' B's
        "< task.body.sub[0].dim : 16",
        "> task.body.sub[1].name : 'b'",
        "< task.train.schedule.warmup : 10",
    ]
    assert params_diff.diff(str(tmp_path / "a.txt"), str(tmp_path / "a.txt")) == []


def test_override_applies_to_a_file_or_an_experiment_key(tmp_path):
    (tmp_path / "a.txt").write_text(A)
    lines = params_diff.diff(
        str(tmp_path / "a.txt"), str(tmp_path / "a.txt"), b_override="task.body.sub[0].dim : 9"
    )
    assert lines == ["> task.body.sub[0].dim : 8", "< task.body.sub[0].dim : 9"]
    lines = params_diff.diff(
        "image.digits.ConvNet", "image.digits.ConvNet", a_override="task.train.learning_rate : 0.5"
    )
    assert lines == ["> task.train.learning_rate : 0.5", "< task.train.learning_rate : 0.003"]


def test_bad_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such params file"):
        params_diff.params_text(str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="without a params.txt"):
        params_diff.params_text(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown model"):
        params_diff.params_text("image.digits.NoSuchNet")


def test_cli_on_two_logdirs_prints_the_changed_lines_and_exits_0(tmp_path):
    for name, override in (
        ("run1", None),
        ("run2", "task.train.learning_rate : 0.01; task.train.max_steps : 10"),
    ):
        (tmp_path / name).mkdir()
        root = experiment.resolve("image.digits.ConvNet", params_override=override)
        (tmp_path / name / "params.txt").write_text(root.to_text())
    (tmp_path / "run3").mkdir()
    three_layers = experiment.resolve("image.digits.ConvNet", gin_bindings=["ConvNet.num_layers = 3"])
    (tmp_path / "run3" / "params.txt").write_text(three_layers.to_text())
    result = subprocess.run(
        [sys.executable, "-m", "tools.params_diff", str(tmp_path / "run1"), str(tmp_path / "run2")],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "> task.train.learning_rate : 0.003",
        "< task.train.learning_rate : 0.01",
        "> task.train.max_steps : 1500",
        "< task.train.max_steps : 10",
    ]
    lines = params_diff.diff(str(tmp_path / "run1"), str(tmp_path / "run3"))
    assert "< task.body.sub[10].name : 'relu2'" in lines  # a third conv block: added nested keys


def test_the_experiment_packages_flag_it_advises_is_taken():
    """A class outside the experiment packages: the refusal names --experiment_packages, and that flag
    (not only the environment variable) then lets the key resolve."""
    env = {k: v for k, v in _env().items() if k != "TENSORPIPE_EXPERIMENT_PACKAGES"}
    key = "tests.trainer.linear_experiment.LinearRegression"
    command = [sys.executable, "-m", "tools.params_diff", key, key, "--b_override=task.train.max_steps : 7"]
    refused = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--experiment_packages=tests" in refused.stderr, refused.stderr
    taken = subprocess.run(
        [*command, "--experiment_packages=tests"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert taken.returncode == 0, taken.stderr
    assert taken.stdout.splitlines()[1] == "< task.train.max_steps : 7"
