"""Pipeline x mesh in the trainer: lm.synthetic.StageMeshTransformerLM (2 GPipe stages x a 2-way
``model`` mesh each, on the four logical CPU devices of tests/conftest.py) trains through the one
``TrainStep`` (``StageMeshPlacement``) to the weights of the same experiment unpipelined and unsharded
(``num_stages = 0``), from the same initial weights, on the same batches, with SGD and the global-norm
clipping of the experiment's learner."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from params import experiment
from tests.trainer.distributed.stage_mesh_training import (
    STEPS,
    TOL,
    difference,
    key,
    root,
    start_alike,
    train,
    train_step,
    weights,
)
from tools import export
from trainer import checkpointer
from trainer.distributed import mesh_placement
from trainer.evaler_job import Evaler

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("schedule", ["fill_drain", "one_f_one_b"])
def test_stage_meshes_train_like_the_plain_model(schedule, tmp_path):
    plain = train_step("num_stages = 0")
    staged = train_step(f'schedule = "{schedule}"')
    assert type(staged.placement).__name__ == "StageMeshPlacement"
    start = weights(plain)
    start_alike(start, staged)
    sharded = [
        v for v in staged.task.trainable_variables if "model" in dtensor.fetch_layout(v).sharding_specs
    ]
    assert len(sharded) >= 12, [v.name for v in sharded]
    line = staged.placement.startup_line(staged.task, staged.functions)
    assert "\n" not in line and line.startswith("trainer: pipeline 2 x mesh model=2: weight bytes per device")
    assert all(f"CPU:{d}=" in line for d in range(4)) and "<= 2 micro-batches x 2.2K" in line, (
        line
    )  # x [4, 8, 16] + paddings [4, 8]
    losses = {name: train(step) for name, step in (("plain", plain), ("staged", staged))}
    assert abs(losses["staged"] - losses["plain"]) <= TOL, losses
    want = weights(plain)
    diff = difference(staged, want)
    moved = max(float(np.max(np.abs(want[k] - start[k]))) for k in want)
    assert diff <= TOL < moved, (diff, moved)

    if schedule != "fill_drain":
        return  # what follows reads the checkpoint, the same whatever the schedule
    # Its checkpoint (the plain format, through the plain-device mirror) restores into the export's
    # single-device task: pipeline x mesh -> one device, the same weights.
    path = staged.placement.checkpointer(str(tmp_path / "train"), 1, staged).save(STEPS)
    single = export.single_device(experiment.task_params_for(root(), "dev")).instantiate()
    checkpointer.restore_task(single, path)
    restored = {key(v): v.numpy() for v in single.trainable_variables}
    assert sorted(restored) == sorted(want)
    assert max(float(np.max(np.abs(restored[k] - want[k]))) for k in want) <= TOL

    # ... and into the unpipelined model (num_stages = 0: no pipeline level in its paths), matched by
    # the variables' names (trainer/checkpoint_names.py).
    unpipelined = experiment.task_params_for(root("num_stages = 0"), "dev").instantiate()
    assert not any("pipeline" in v.name for v in unpipelined.variables)
    checkpointer.restore_task(unpipelined, path)
    restored = {key(v): v.numpy() for v in unpipelined.trainable_variables}
    assert sorted(restored) == sorted(want)
    assert max(float(np.max(np.abs(restored[k] - want[k]))) for k in want) <= TOL

    # An evaler of the stage-mesh experiment scores it with its stages on plain devices (DTensor
    # refuses a restore across the stages' meshes), its loss the plain model's on the same batches.
    lines = []
    staged_eval = Evaler(root(), str(tmp_path), "dev", log=lines.append)
    plain_eval = Evaler(root("num_stages = 0"), str(tmp_path / "plain"), "dev", log=lines.append)
    assert not mesh_placement.staged_pipelines(staged_eval.task_params)
    assert staged_eval.run_pending() == 1, lines
    plain_eval.shared.restore(plain_eval.task, path)
    scores = staged_eval.process(STEPS), plain_eval.process(STEPS)
    assert abs(scores[0]["loss"] - scores[1]["loss"]) <= TOL, scores


def test_pipeline_by_mesh_by_data_on_eight_devices_trains_like_the_plain_model():
    """2 stages x a 2 x 2 (data x model) mesh each, on 8 logical devices (a fresh
    process: a test process has 4): every micro-batch split over the data axis's 2 replicas; the
    run's checkpoint restores into the unpipelined model. (1F1B over a data axis:
    tests/layers/parallel/pipeline/test_gpipe_stage_mesh.py.)"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    env.pop(mesh_lib.COMBINE_ALL_REDUCES_ENV, None)  # the child sets it itself
    run = subprocess.run(
        [sys.executable, "-m", "tests.trainer.distributed.stage_mesh_training", "8",
         "fill_drain", "--staged=stage_replicas = 2"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    assert [x["schedule"] for x in lines] == ["fill_drain"]
    for x in lines:
        assert x["placement"] == "StageMeshPlacement"
        assert x["startup_line"].startswith("trainer: pipeline 2 x mesh data=2 x model=2:"), x
        assert all(f"CPU:{d}=" in x["startup_line"] for d in range(8))
        assert "<= 2 micro-batches x 1.1K" in x["startup_line"], x  # half of each stage input a device
        assert abs(x["loss"] - x["plain_loss"]) <= TOL, x
        assert x["weight_difference"] <= TOL < x["moved"], x
        assert x["restored_difference"] <= TOL, x  # its checkpoint, into the unpipelined model by name
