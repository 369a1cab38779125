"""Checkpoints across placements (trainer/checkpoint_names.py): a pipelined task's checkpoint restores
into the same experiment unpipelined (``num_stages = 0``: one GPipe level less in every path) and the
other way round, onto stage meshes too, by the variables' names; what does not match is one line.
Tiny untrained models: each restore is checked against the values written."""

from __future__ import annotations

import gin
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from params import experiment
from params.errors import ConfigError, UserError
from tasks.learner import Learner
from trainer import checkpoint_names, checkpointer, logdir_guard

KNOBS = ["model_dim = 8", "hidden_dim = 16", "num_heads = 2", "batch_size = 4", "seq_length = 4"]


def _root(*knobs: str):
    gin.clear_config()
    bindings = [f"StageMeshTransformerLM.{k}" for k in KNOBS + list(knobs)]
    return experiment.resolve("lm.synthetic.StageMeshTransformerLM", gin_bindings=bindings)


def _task(*knobs: str) -> tf.Module:
    return experiment.task_params_for(_root(*knobs), "dev").instantiate()


def _values(task: tf.Module) -> dict[str, np.ndarray]:
    """{name without the pipeline's level (spelled out here, not by the module): whole value}."""
    out = {}
    for v in task.variables:
        value = v.read_value()
        if isinstance(v, dtensor.DVariable):
            layout = dtensor.fetch_layout(v)
            value = dtensor.unpack(
                dtensor.relayout(value, dtensor.Layout.replicated(layout.mesh, v.shape.rank))
            )[0]
        out[checkpoint_names.name_of(v).replace(".pipeline.", ".")] = value.numpy()
    return out


def _save(task: tf.Module, path) -> str:
    return tf.train.Checkpoint(task=task).write(str(path / "ckpt-1"))


def test_names_without_the_pipeline_level():
    name = "task.stack.pipeline.layers_0.ffn.fc1.w"
    assert checkpoint_names.drop_levels(name, ["task.stack.pipeline"]) == "task.stack.layers_0.ffn.fc1.w"
    assert checkpoint_names.drop_levels("task.emb.w", ["task.stack.pipeline"]) == "task.emb.w"
    saved = [name, "task.stack.pipeline.layers_1.w", "task.emb.w"]
    wanted = ["task.stack.layers_0.ffn.fc1.w", "task.stack.layers_1.w", "task.emb.w"]
    assert checkpoint_names.inferred_levels(saved, wanted) == {"task.stack.pipeline"}
    assert checkpoint_names.inferred_levels(wanted, wanted) == set()  # the same placement: none


@pytest.mark.parametrize(
    "writer, reader",
    [(("stage_mesh_size = 1",), ("num_stages = 0",)),  # pipelined -> plain
     (("num_stages = 0",), ("stage_mesh_size = 1",)),  # plain -> pipelined
     (("num_stages = 0",), ())],  # plain -> pipeline x mesh (DVariables split by their layouts)
)  # fmt: skip
def test_a_checkpoint_restores_into_the_other_placement(writer, reader, tmp_path):
    written, restored = _task(*writer), _task(*reader)
    want, before = _values(written), _values(restored)
    assert sorted(want) == sorted(before)
    assert any(not np.array_equal(want[k], before[k]) for k in want)  # other initial weights
    with pytest.raises(AssertionError):  # the object graphs differ: the paths do not match
        tf.train.Checkpoint(task=restored).read(_save(written, tmp_path)).assert_existing_objects_matched()
    checkpointer.restore_task(restored, str(tmp_path / "ckpt-1"))
    got = _values(restored)
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_a_checkpoint_of_another_model_is_one_line(tmp_path):
    path = _save(_task("num_layers = 2", "stage_mesh_size = 1"), tmp_path)
    with pytest.raises(UserError, match="^[^\n]*holds no variable named task.stack.layers_2") as e:
        checkpointer.restore_task(_task("num_stages = 0"), path)
    assert "the checkpoint's ['task.stack.pipeline']" in str(e.value)


def test_the_logdir_guard_lets_a_trainer_of_the_other_placement_in_unless_its_slots_are_unnamed(tmp_path):
    pipelined = _root("stage_mesh_size = 1")
    (tmp_path / "params.txt").write_text(pipelined.to_text())
    task = experiment.task_params_for(pipelined, "train").instantiate()
    learner = Learner(task.params.train, list(task.trainable_variables))
    saver = checkpointer.Checkpointer(str(tmp_path / "train"), 1, task=task, learner=learner)
    saver.save(1)
    plain = _root("num_stages = 0")
    for trains in (False, True):  # the pipeline gone: a Params change like any other
        changes = logdir_guard.check(plain, str(tmp_path), trains=trains, log=lambda _: None)
        assert "+ task.stack.pipeline : None" in changes
    with pytest.raises(ConfigError, match="variables differ from checkpoint"):  # not the same model
        logdir_guard.check(_root("num_stages = 0", "num_layers = 2"), str(tmp_path), trains=False)

    # Slots named by position only (checkpoints written before they were named by their variables).
    old = tf.Module()
    old.optimizer = tf.Module()
    old.optimizer.slots = [
        {"m": tf.Variable(tf.zeros(v.shape), name=f"adam.{i}.m")}
        for i, v in enumerate(task.trainable_variables)
    ]
    checkpointer.Checkpointer(str(tmp_path / "train"), 1, task=task, learner=old).save(2)
    assert logdir_guard.check(plain, str(tmp_path), trains=False, log=lambda _: None)  # an evaler: in
    with pytest.raises(ConfigError, match="^[^\n]*optimizer slots are known by position only") as e:
        logdir_guard.check(plain, str(tmp_path), trains=True, allow=True, log=lambda _: None)
    assert "resume it once with the placement that wrote it" in str(e.value)
