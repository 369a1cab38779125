"""tools.measure: an experiment trained in-process, its dev metrics as JSON lines; bad input one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env


def _measure(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.measure", *args],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_measure_trains_and_prints_the_dev_metrics_per_evaluation():
    result = _measure("image.digits.ConvNet", "--steps=4", "--eval_every=2")
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["model"] == "image.digits.ConvNet" and lines[0]["steps"] == 4
    evaluations = [line for line in lines if "step" in line]
    assert [line["step"] for line in evaluations] == [2, 4]
    assert all(0.0 <= line["dev_accuracy"] <= 1.0 and line["train_loss"] > 0 for line in evaluations)
    decoded = [line for line in lines if "decode_seconds" in line]  # the digits task decodes too
    assert len(decoded) == 1 and decoded[0]["test_num_decoded"] > 0


def test_an_unknown_experiment_is_one_line_and_exit_2():
    result = _measure("image.digits.NoSuchNet", "--steps=1")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("measure: error:")]
    assert len(errors) == 1 and "NoSuchNet" in errors[0]
