"""Pipeline x mesh in the trainer: lm.synthetic.StageMeshTransformerLM (2 GPipe stages x a 2-way
``model`` mesh each, on the four logical CPU devices of tests/conftest.py) trains through the one
``TrainStep`` (``StageMeshPlacement``) to the weights of the same experiment unpipelined and unsharded
(``num_stages = 0``), from the same initial weights, on the same batches, with SGD and the global-norm
clipping of the experiment's learner."""

import gin
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from params import experiment
from tools import export
from trainer import checkpointer
from trainer.distributed import mesh_placement
from trainer.evaler_job import Evaler

STEPS, TOL = 20, 1e-5
# SGD: Adam divides each gradient by its own running norm, so float noise in a near-zero gradient
# (sums in another order on a split mesh) becomes a visible step (7e-5 after 20 Adam steps).
OVERRIDE = "task.train.optimizer : 'sgd'; task.train.learning_rate : 0.5"
KNOBS = [
    "model_dim = 16", "hidden_dim = 32", "num_heads = 2", "batch_size = 8", "seq_length = 8",
    "max_steps = 40", "warmup_steps = 2", "num_train_sequences = 64",
]  # fmt: skip


def _root(*knobs: str):
    gin.clear_config()
    try:
        return experiment.resolve(
            "lm.synthetic.StageMeshTransformerLM",
            gin_bindings=[f"StageMeshTransformerLM.{k}" for k in KNOBS + list(knobs)],
            params_override=OVERRIDE,
        )
    finally:
        gin.clear_config()


def _train_step(*knobs: str):
    root = _root(*knobs)
    task_params = experiment.task_params_for(root, "train")
    return mesh_placement.make_train_step(root.cluster, task_params, root.input.train)


def _key(v) -> str:
    """A variable's name without the pipeline's level (DVariables spell '/' as '.')."""
    return v.name.replace(".", "/").replace("pipeline/", "").split(":")[0]


def _whole(v) -> np.ndarray:
    if not isinstance(v, dtensor.DVariable):
        return v.numpy()
    layout = dtensor.fetch_layout(v)
    return dtensor.unpack(
        dtensor.relayout(v.read_value(), dtensor.Layout.replicated(layout.mesh, v.shape.rank))
    )[0].numpy()


@pytest.mark.parametrize("schedule", ["fill_drain"])  # 1F1B: the same, another minute
def test_stage_meshes_train_like_the_plain_model(schedule, tmp_path):
    plain = _train_step("num_stages = 0")
    staged = _train_step(f'schedule = "{schedule}"')
    assert type(staged.placement).__name__ == "StageMeshPlacement"
    start = {_key(v): v.numpy() for v in plain.task.trainable_variables}
    assert sorted(start) == sorted(_key(v) for v in staged.task.trainable_variables)
    for v in staged.task.trainable_variables:  # the same initial weights, split by their layouts
        layout = dtensor.fetch_layout(v)
        full = dtensor.copy_to_mesh(
            tf.constant(start[_key(v)]), dtensor.Layout.replicated(layout.mesh, v.shape.rank)
        )
        v.assign(dtensor.relayout(full, layout))
    sharded = [
        v for v in staged.task.trainable_variables if "model" in dtensor.fetch_layout(v).sharding_specs
    ]
    assert len(sharded) >= 12, [v.name for v in sharded]
    line = staged.placement.startup_line(staged)
    assert "\n" not in line and line.startswith("trainer: pipeline 2 x mesh model=2: weight bytes per device")
    assert all(f"CPU:{d}=" in line for d in range(4)) and "<= 2 micro-batches x 2.2K" in line, (
        line
    )  # x [4, 8, 16] + paddings [4, 8]
    losses = {}
    for name, step in (("plain", plain), ("staged", staged)):
        finite, outputs = step.run(STEPS)
        assert bool(np.asarray(finite)) and int(np.asarray(_whole(step.global_step))) == STEPS
        losses[name] = float(outputs["task"]["loss"])
    assert abs(losses["staged"] - losses["plain"]) <= TOL, losses
    want = {_key(v): v.numpy() for v in plain.task.trainable_variables}
    diff = max(float(np.max(np.abs(_whole(v) - want[_key(v)]))) for v in staged.task.trainable_variables)
    moved = max(float(np.max(np.abs(want[k] - start[k]))) for k in want)
    assert diff <= TOL < moved, (diff, moved)

    # Its checkpoint (the plain format, through the plain-device mirror) restores into the export's
    # single-device task: pipeline x mesh -> one device, the same weights.
    path = mesh_placement.make_checkpointer(str(tmp_path / "train"), 1, staged).save(STEPS)
    single = export.single_device(experiment.task_params_for(_root(), "dev")).instantiate()
    checkpointer.restore_task(single, path)
    restored = {_key(v): v.numpy() for v in single.trainable_variables}
    assert sorted(restored) == sorted(want)
    assert max(float(np.max(np.abs(restored[k] - want[k]))) for k in want) <= TOL

    # ... and into the unpipelined model (num_stages = 0: no pipeline level in its paths), matched by
    # the variables' names (trainer/checkpoint_names.py).
    unpipelined = experiment.task_params_for(_root("num_stages = 0"), "dev").instantiate()
    assert not any("pipeline" in v.name for v in unpipelined.variables)
    checkpointer.restore_task(unpipelined, path)
    restored = {_key(v): v.numpy() for v in unpipelined.trainable_variables}
    assert sorted(restored) == sorted(want)
    assert max(float(np.max(np.abs(restored[k] - want[k]))) for k in want) <= TOL

    # An evaler of the stage-mesh experiment scores it with its stages on plain devices (DTensor
    # refuses a restore across the stages' meshes), its loss the plain model's on the same batches.
    lines = []
    staged_eval = Evaler(_root(), str(tmp_path), "dev", log=lines.append)
    plain_eval = Evaler(_root("num_stages = 0"), str(tmp_path / "plain"), "dev", log=lines.append)
    assert not mesh_placement.staged_pipelines(staged_eval.task_params)
    assert staged_eval.run_pending() == 1, lines
    plain_eval.shared.restore(plain_eval.task, path)
    scores = staged_eval.process(STEPS), plain_eval.process(STEPS)
    assert abs(scores[0]["loss"] - scores[1]["loss"]) <= TOL, scores
