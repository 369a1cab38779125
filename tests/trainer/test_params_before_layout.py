"""A params.txt written before the modules moved under layers/parallel/ (tests/data/params_before_layout: the
trainer's own params.txt of image.digits.GPipeConvNet and lm.synthetic.LocalTransformerLM, 2 steps each,
from the tree before the move) still loads and trains: its ``type/layers.gpipe/GPipeLayer`` and
``type/layers.local_parallel/...`` paths read through ``params.module_aliases``."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from params import experiment
from params.hyperparams import Params
from tasks.learner import Learner
from tests.tasks.loop import train_steps
from tests.trainer.runner import REPO, _env

OLD = REPO / "tests" / "data" / "params_before_layout"
# Params added to TensorPipe after those files were written, at their defaults (a run resumed with
# such a file reports them as changes, as it should): appended, so what is compared is the move alone.
ADDED_SINCE = (  # params defined after the move, with their defaults
    "cluster.stage_job : ''\n"
    "task.body.sub[0].stage_layout_rules : ''\n"
    "task.body.sub[0].stage_mesh_axis_names : []\n"
    "task.body.sub[0].stage_mesh_shape : []\n"
    "task.precision : 'float32'\n"
)


def test_an_old_local_lm_params_txt_alone_builds_its_task_and_trains():
    text = (OLD / "lm.synthetic.LocalTransformerLM.params.txt").read_text()
    assert "type/layers.local_parallel/LocalParallelLayer" in text
    root = Params.from_text(text)
    task = experiment.task_params_for(root, "train").instantiate()
    assert type(task.local).__module__ == "layers.parallel.local"
    batches = iter(root.input.train.instantiate().dataset())
    history = train_steps(task, Learner(root.task.train), batches, 3)
    assert len(history) == 3 and all(math.isfinite(h["loss"]) for h in history)


@pytest.mark.slow
def test_a_logdir_from_before_the_move_resumes_with_its_params_file(tmp_path):
    """The old params.txt in the logdir and as --params_file_override: the guard sees the same Params
    (no 'differ' lines, no params_changes.txt), the GPipe model trains, and params.txt is rewritten
    with today's class paths."""
    text = (OLD / "image.digits.GPipeConvNet.params.txt").read_text()
    assert "type/layers.gpipe/GPipeLayer" in text
    logdir = tmp_path / "run"
    logdir.mkdir()
    old = tmp_path / "old_params.txt"
    for path in (old, logdir / "params.txt"):
        path.write_text(text + ADDED_SINCE)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--model=image.digits.GPipeConvNet",
            f"--logdir={logdir}",
            f"--params_file_override={old}",
            "--job=controller,trainer",
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "done at step 2" in result.stdout
    assert "differ" not in result.stdout + result.stderr
    assert not (logdir / "params_changes.txt").exists()
    written = (logdir / "params.txt").read_text()
    assert "type/layers.parallel.pipeline.gpipe/GPipeLayer" in written and "layers.gpipe/" not in written
    assert (logdir / "train" / "ckpt-2.index").exists()
