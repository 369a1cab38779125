"""A Transformer LM sharded over a DTensor mesh computes what it computes unsharded: loss, gradients
and the weights after 10 Adam steps (meshes 2x1, 2x2, 1x4 of the 4 test CPU devices: the batch split
alone, both, the model split alone; 1x1 and 1x2 add nothing these do not cover)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from tasks.lm.params.synthetic import MeshTransformerLM
from trainer.distributed.mesh_placement import MeshPlacement
from trainer.train_step import TrainStep

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

RULES = "batch:data;hidden:model;heads:model;vocab:model"
STEPS = 10


def _experiment() -> MeshTransformerLM:
    return MeshTransformerLM(
        model_dim=8,
        num_heads=4,
        hidden_dim=16,
        num_layers=1,
        batch_size=4,
        seq_length=8,
        num_train_sequences=64,
        learning_rate=1e-2,
        warmup_steps=2,
        max_steps=STEPS,
    )


def _value(x) -> np.ndarray:
    """A DTensor or DVariable (any layout) or a regular tensor -> its full numpy value."""
    x = tf.convert_to_tensor(x.read_value() if isinstance(x, tf.Variable) else x)
    try:
        layout = dtensor.fetch_layout(x)
    except (TypeError, ValueError, tf.errors.OpError):
        return x.numpy()
    if layout is None:
        return x.numpy()
    full = dtensor.relayout(x, dtensor.Layout.replicated(layout.mesh, x.shape.rank))
    return dtensor.unpack(full)[0].numpy()


@pytest.fixture(scope="module")
def reference():
    exp = _experiment()
    step = TrainStep(exp.task(), exp.train())
    batch = next(iter(exp.train().instantiate().dataset()))

    loss, grads = step.loss_and_grads(batch)
    finite, _ = step.run(STEPS)
    assert bool(finite.numpy())
    return {
        "batch": batch,
        "loss": float(loss.numpy()),
        "grads": [tf.convert_to_tensor(g).numpy() for g in grads],
        "weights": {v.name: v.numpy() for v in step.task.trainable_variables},
    }


@pytest.mark.parametrize("shape", [[2, 1], [2, 2], [1, 4]], ids=lambda s: f"{s[0]}x{s[1]}")
def test_sharded_lm_equals_unsharded(reference, shape):
    exp = _experiment()
    mesh = mesh_lib.create_mesh(shape, ["data", "model"], RULES)
    step = TrainStep(exp.task(), exp.train(), MeshPlacement(mesh))
    assert all(isinstance(v, dtensor.DVariable) for v in step.task.variables)
    # The weights really are split: the feed-forward hidden weight over 'model', and gradients come
    # back in the variables' layouts.
    fc1 = step.task.stack.layers[0].ffn.fc1.vars["w"]
    assert dtensor.fetch_layout(fc1).sharding_specs == [dtensor.UNSHARDED, "model"]
    assert mesh.local_bytes(fc1) == 8 * 16 * 4 // shape[1]

    loss, grads = step.loss_and_grads(reference["batch"])
    assert abs(float(_value(loss)) - reference["loss"]) < 1e-5
    for grad, ref_grad, var in zip(grads, reference["grads"], step.task.trainable_variables):
        assert dtensor.fetch_layout(grad) == dtensor.fetch_layout(var), var.name
        np.testing.assert_allclose(_value(grad), ref_grad, atol=1e-5, err_msg=var.name)
        if ".b_k" in var.name:
            assert np.max(np.abs(ref_grad)) < 1e-6

    finite, outputs = step.run(STEPS)
    assert bool(finite.numpy())
    assert int(_value(step.global_step)) == STEPS
    assert np.isfinite(float(outputs["task"]["loss"].numpy()))
    weights = {v.name: _value(v) for v in step.task.trainable_variables}
    assert weights.keys() == reference["weights"].keys()
    for name, value in weights.items():
        if ".b_k" in name:
            # The key bias adds the same logit to every key of a query, so softmax ignores it: its
            # exact gradient is 0 and its computed one is rounding noise (< 1e-6, checked above),
            # which Adam normalizes into steps of size lr whatever the mesh. Nothing to compare.
            continue
        np.testing.assert_allclose(value, reference["weights"][name], atol=1e-5, err_msg=name)
