"""The kill drill, short: one SIGKILL of each kind (save, random, eval, start-up) on the linear model.

The full drill (``python -m tools.kill_drill --kills=20``) is run by hand; this keeps the tool working.
"""

import argparse
import json
import subprocess
import sys

import pytest

from tests.trainer import linear_experiment, runner
from tools import kill_drill


@pytest.mark.slow
def test_short_kill_drill_ends_like_an_uninterrupted_run(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name, count, seed in (("train", 256, 1), ("dev", 64, 2), ("test", 24, 3)):
        linear_experiment.write_data(str(data / f"{name}.npz"), count, seed)
    # 15 saves: the 4 kills (at the first save, a third of the reference's time at most, just after a
    # save, start-up) end well before step 1500, so the drill never finishes early.
    override = runner.data_override(data) + (
        "; task.train.max_steps : 1500; task.train.save_interval_steps : 100; "
        "task.train.log_interval_steps : 100; task.train.summary_interval_steps : 100"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.kill_drill",
            "--kills=4",
            f"--model={runner.MODEL}",
            f"--params_override={override}",
            f"--workdir={tmp_path / 'work'}",
        ],
        cwd=runner.REPO,
        env=runner._env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and summary["ok"], summary
    assert summary["sigkills"] == 4 and summary["max_abs_diff"] == 0.0
    assert summary["temp_dirs_left"] == [] and not any(summary["scores_duplicates"].values())


def test_a_small_corpus_and_an_override_after_the_drills_cadence(tmp_path):
    """``--corpus_lines=N``: the drill's runs train on the first N lines of the experiment's train
    files (a small corpus, many epochs: the case of a resume in the middle of one); the user's
    ``--params_override`` comes after the drill's own cadence, so it changes only what it names."""
    args = argparse.Namespace(
        model="lm.text.TextTransformerLM",
        params_override="task.train.max_steps : 300",
        gin_param=["TextTransformerLM.seq_length = 64"],
        corpus_lines=695,
    )
    kill_drill.small_corpus(args, tmp_path)
    corpus = tmp_path / "corpus-695.txt"
    assert len(corpus.read_text().splitlines()) == 695
    command = kill_drill._command(args, tmp_path / "run")
    (override,) = [a for a in command if a.startswith("--params_override=")]
    assert override == (
        f"--params_override={kill_drill.DEFAULT_OVERRIDE}; task.train.max_steps : 300; "
        f"input.train.file_pattern : '{corpus}'"
    )
