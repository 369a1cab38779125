"""The logdir guard: reusing a log directory stops with one line, and params.txt stays as it was.

One finished run of the linear experiment (30 steps) is shared; each case copies it. Another
experiment on a used logdir (exit 2, one line, nothing changed) is test_open_logdir.py's, in every mode."""

from __future__ import annotations

import shutil

import pytest

from params import experiment
from params.errors import ConfigError
from tests.trainer import runner
from tests.trainer.runner import data_override, error_lines
from trainer import logdir_guard


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    logdir = tmp_path_factory.mktemp("guard") / "run"
    result = runner.run(logdir, data_dir)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return logdir


@pytest.fixture
def logdir(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def _root(data_dir, override: str = ""):
    text = data_override(data_dir) + (f"; {override}" if override else "")
    return experiment.resolve(runner.MODEL, params_override=text)


@pytest.mark.slow
def test_changed_shapes_are_refused_and_params_txt_is_unchanged(logdir, data_dir):
    before = (logdir / "params.txt").read_text()
    result = runner.run(logdir, data_dir, override="task.input_dim : 3")
    assert result.returncode == 2, result.stdout + result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1 and "variables differ from checkpoint" in errors[0], result.stderr
    assert "removed" in errors[0] or "->" in errors[0]
    assert (logdir / "params.txt").read_text() == before
    assert "Traceback" not in result.stderr


def test_a_finished_run_with_a_new_learning_rate_is_refused(logdir, data_dir):
    before = (logdir / "params.txt").read_text()
    with pytest.raises(ConfigError, match=r"finished at step 30 .*task\.train\.learning_rate.*max_steps"):
        logdir_guard.check(_root(data_dir, "task.train.learning_rate : 0.5"), str(logdir), trains=True)
    assert (logdir / "params.txt").read_text() == before


def test_evaluating_a_finished_run_with_other_eval_settings_is_allowed(logdir, data_dir):
    lines = []
    root = _root(data_dir, "task.eval.samples_per_summary : 8")
    changes = logdir_guard.check(root, str(logdir), trains=False, log=lines.append)
    assert changes == ["< task.eval.samples_per_summary : 0", "> task.eval.samples_per_summary : 8"]
    assert any("differ from" in line for line in lines)


def test_same_params_and_an_empty_logdir_pass_silently(logdir, data_dir, tmp_path):
    lines = []
    assert logdir_guard.check(_root(data_dir), str(logdir), trains=True, log=lines.append) == []
    assert logdir_guard.check(_root(data_dir), str(tmp_path / "new"), trains=True, log=lines.append) == []
    assert lines == [] and not (tmp_path / "new").exists()


def test_allow_params_change_turns_a_refusal_into_a_warning(logdir, data_dir):
    lines = []
    root = _root(data_dir, "task.train.learning_rate : 0.5")
    changes = logdir_guard.check(root, str(logdir), trains=True, allow=True, log=lines.append)
    assert "> task.train.learning_rate : 0.5" in changes
    assert lines[0].startswith("trainer: warning: its run finished at step 30")


@pytest.mark.slow
def test_allow_params_change_with_changed_shapes_is_refused_before_any_restore(logdir, data_dir):
    """Every checkpoint of the logdir holds the old shapes: a new logdir is the way."""
    before = {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()}
    result = runner.run(logdir, data_dir, "--allow_params_change", override="task.input_dim : 3")
    assert result.returncode == 2, result.stdout + result.stderr
    errors = error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert "variables differ from checkpoint" in errors[0] and "->" in errors[0]
    assert "even with --allow_params_change" in errors[0] and "new --logdir" in errors[0]
    assert "resumed" not in result.stdout and "Traceback" not in result.stderr
    assert {p: p.read_bytes() for p in logdir.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_a_compatible_change_continues_and_is_recorded(logdir, data_dir):
    override = "task.train.learning_rate : 0.2; task.train.max_steps : 40"
    result = runner.run(logdir, data_dir, override=override)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "> task.train.learning_rate : 0.2" in result.stdout
    assert "task.train.learning_rate : 0.2" in (logdir / "params.txt").read_text()
    record = (logdir / "params_changes.txt").read_text()
    assert record.startswith("# step 30, ")
    assert "> task.train.max_steps : 40" in record and "< task.train.max_steps : 30" in record
    assert runner.checkpoint_steps(logdir)[-1] == 40
