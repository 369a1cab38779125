"""Checkpoints of a sharded trainer are the plain format: a 2x2 mesh's checkpoint restores into 1x4,
4x1 and an unsharded trainer (weights, optimizer slots, step), and into an evaler's plain task."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from tasks.lm.params.synthetic import MeshTransformerLM
from trainer import checkpointer
from trainer.checkpointer import Checkpointer
from trainer.distributed.mesh_placement import MeshPlacement
from trainer.train_step import TrainStep

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

RULES = "batch:data;hidden:model;heads:model;vocab:model"


def _experiment() -> MeshTransformerLM:
    return MeshTransformerLM(
        model_dim=8,
        num_heads=4,
        hidden_dim=16,
        num_layers=1,
        batch_size=4,
        seq_length=8,
        num_train_sequences=64,
    )


def _step(shape):
    exp = _experiment()
    if shape is None:
        return TrainStep(exp.task(), exp.train())
    return TrainStep(
        exp.task(), exp.train(), MeshPlacement(mesh_lib.create_mesh(shape, ["data", "model"], RULES))
    )


def _value(var: tf.Variable) -> np.ndarray:
    if not isinstance(var, dtensor.DVariable):
        return var.numpy()
    value = var.read_value()
    layout = dtensor.fetch_layout(value)
    full = dtensor.relayout(value, dtensor.Layout.replicated(layout.mesh, value.shape.rank))
    return dtensor.unpack(full)[0].numpy()


def _state(step) -> dict[str, np.ndarray]:
    state = {f"task/{v.name}": _value(v) for v in step.task.variables}
    state.update({f"slot/{i}": _value(v) for i, v in enumerate(step.learner.slot_variables())})
    state["global_step"] = _value(step.global_step)
    return state


def _checkpointer(directory, step) -> Checkpointer:
    return step.placement.checkpointer(str(directory), 0, step)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mesh_ckpt")
    step = _step([2, 2])
    finite, _ = step.run(3)
    assert bool(finite.numpy())
    path = _checkpointer(directory, step).save(3)
    return directory, path, _state(step)


@pytest.mark.parametrize("shape", [[1, 4], [4, 1], None], ids=["1x4", "4x1", "unsharded"])
def test_restores_on_any_mesh(saved, tmp_path, shape):
    directory, _, expected = saved
    step = _step(shape)
    before = _state(step)
    assert not np.allclose(before["global_step"], expected["global_step"])
    assert _checkpointer(directory, step).restore_latest() is not None
    restored = _state(step)
    assert restored.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(restored[name], value, err_msg=name)
    # Training goes on from there on the new mesh.
    finite, _ = step.run(1)
    assert bool(finite.numpy()) and int(_value(step.global_step)) == 4


def test_an_evaler_restores_the_plain_task(saved):
    _, path, expected = saved
    task = _experiment().task().instantiate()
    checkpointer.restore_task(task, path)
    for var in task.variables:
        np.testing.assert_array_equal(var.numpy(), expected[f"task/{var.name}"], err_msg=var.name)
