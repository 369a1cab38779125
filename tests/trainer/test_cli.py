"""The binary in a subprocess: resolved Params out, one-line errors and exit codes for bad input."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer import runner

ROOT = Path(__file__).resolve().parents[2]
MODEL = "--model=tests.params.fake_experiments.TinyExp"


def run_trainer(*args: str, cwd: Path = ROOT, path: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (f"{os.pathsep}{path}" if path else ""))
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_inspect_params_prints_resolved_params_with_overrides():
    result = run_trainer(
        MODEL, "--mode=inspect_params", "--params_override=task.train.learning_rate : 0.5",
        "--gin_param=TinyExp.width = 6",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "task.train.learning_rate : 0.5" in lines
    assert "task.width : 6" in lines
    assert f"model : '{MODEL.split('=')[1]}'" in lines
    assert lines == sorted(lines)


def test_inspect_datasets_lists_each_dataset_and_its_jobs():
    result = run_trainer(MODEL, "--mode=inspect_datasets")
    assert result.returncode == 0, result.stderr
    assert "dev (jobs: evaler_dev, decoder_dev)" in result.stdout
    assert "train (jobs: trainer)" in result.stdout
    assert "  batch_size : 16" in result.stdout


# One case per way the binary meets bad input (each case is a process importing TensorFlow): a
# Params error from the override flags, one from gin, each of the binary's own checks, absl's flag
# errors. The other messages of Params and the registry (cannot parse, no such file, a model name's
# typo) come from the same experiment.resolve call as the first case: tests/params checks their text.
@pytest.mark.parametrize(
    "args, message",
    [
        ((MODEL, "--mode=inspect_params", "--params_override=task.train.learrning_rate : 0.5"),
         "'task.train.learrning_rate'; did you mean 'task.train.learning_rate'?"),
        ((MODEL, "--mode=inspect_params", "--gin_param=TinyExp.nope = 1"), "gin:"),
        (("--mode=inspect_params",), "--model is required"),
        ((MODEL, "--mode=bogus"), "--mode"),
        ((MODEL, "--no_such_flag=1"), "no_such_flag"),
        ((MODEL,), "--logdir is required"),
        ((MODEL, "--mode=inspect_params", "stray"), "unexpected arguments 'stray'"),
    ],
)  # fmt: skip
def test_bad_input_exits_2_with_one_line(args, message):
    result = run_trainer(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    error_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(error_lines) == 1, result.stderr
    assert message in error_lines[0]
    assert "Traceback" not in result.stderr


def test_help_describes_the_flags():
    result = run_trainer("--helpshort")
    assert result.returncode == 0
    for flag in ("--model", "--logdir", "--mode", "--job", "--params_override", "--gin_param"):
        assert flag in result.stdout


@pytest.mark.parametrize("model", ["this.s", "drillcanary.X"])
def test_model_imports_nothing_outside_the_experiment_packages(tmp_path, model):
    """`this` prints the Zen of Python when imported; the canary module writes a file."""
    marker = tmp_path / "imported"
    (tmp_path / "drillcanary.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass X: pass\n")
    result = run_trainer(f"--model={model}", "--mode=inspect_params", path=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Beautiful is better" not in result.stdout + result.stderr
    assert not marker.exists()
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    package = model.split(".")[0]
    assert f"unknown model {model!r}" in line and f"--experiment_packages={package}" in line


def test_mode_help_describes_every_mode():
    """Each of MODES is described in --mode's help (in a process of its own: the binary's flags)."""
    code = (  # absl puts <mode|mode|...>: before the help; each mode is described as 'mode:'
        "import re; from trainer import main; h = main.FLAGS['mode'].help.split('>: ', 1)[1]; "
        "print([m for m in main.MODES if not re.search(rf'(?<![\\w/]){m}( / \\w+)?:', h)])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.slow
def test_empty_job_names_are_refused(tmp_path, data_dir):
    result = runner.run(tmp_path / "run", data_dir, "--job=,")
    assert result.returncode == 2
    (line,) = runner.error_lines(result.stderr)
    assert "--job: empty job name" in line


def test_log_dir_typo_is_named():
    result = run_trainer("--model=image.digits.ConvNet", "--log_dir=runs/x")
    assert result.returncode == 2
    assert "did you mean --logdir?" in result.stderr.strip().splitlines()[-1]
