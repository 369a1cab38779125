"""tools.list_models: --help, and --module listing the experiments of a user's own module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from params import registry
from params.errors import ConfigError
from tests.trainer.runner import REPO, _env
from tools import list_models

USER_MODULE = '''
"""A user's experiments, outside the repository."""

from params.experiment import Experiment
from params import registry


@registry.register
class Registered(Experiment):
    """Registered with its doc line.

    Not this paragraph."""

    def task(self):
        return None


class Unregistered(Experiment):
    """Named by its import path only."""


class NotAnExperiment:
    """Left out."""
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"user_exps_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, tmp_path
    registry.unregister(f"{name}.Registered")
    sys.modules.pop(name, None)


def test_module_lists_its_experiment_classes_by_the_key_model_takes(user_module):
    name, _ = user_module
    found = list_models.module_experiments(name)
    assert sorted(found) == [f"{name}.Registered", f"{name}.Unregistered"]
    assert registry.doc_line(found[f"{name}.Registered"]) == "Registered with its doc line."


def test_a_missing_or_broken_module_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="no such module here; run from the directory that holds it"):
        list_models.module_experiments("no_such_module_anywhere")
    with pytest.raises(ConfigError, match="not a module name"):
        list_models.module_experiments("my_exps.py")
    (tmp_path / "broken_exps_mod.py").write_text("import numpy\nraise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="importing it failed: RuntimeError: boom"):
        list_models.module_experiments("broken_exps_mod")


def test_help_exits_0_and_names_module():
    result = subprocess.run(
        [sys.executable, "-m", "tools.list_models", "--help"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "--module" in result.stdout and "its code runs" in result.stdout


@pytest.mark.slow
def test_module_through_the_binary_from_the_users_directory(user_module):
    name, directory = user_module
    result = subprocess.run(
        [sys.executable, "-m", "tools.list_models", f"--module={name}"],
        cwd=directory,  # python -m finds the user's module in the current directory
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [f"{name}.Registered", f"{name}.Unregistered"]
    assert "image.digits.ConvNet" not in result.stdout


def test_list_models_doc_lines_are_whole_sentences():
    result = subprocess.run(
        [sys.executable, "-m", "tools.list_models"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("lm.synthetic.GPipeTransformerLM"))
    assert line.rstrip().endswith("micro-batches per step."), line
