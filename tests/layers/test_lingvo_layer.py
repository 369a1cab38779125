"""Lingvo-style layers (CreateVariable, _CreateLayerVariables, FProp(theta, ...)) run; on a TensorPipe
layer each Lingvo name is one line naming what to use."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from layers import lingvo_layer as py_utils
from layers.base_layer import FPropContext
from layers.core import ProjectionLayer
from layers.lingvo_layer import LingvoLayer
from tasks.base_task import BaseTask


class Proj(LingvoLayer):
    """Variables made in _CreateLayerVariables, as Lingvo's newer layers do."""

    @classmethod
    def Params(cls):  # noqa: N802
        p = super().Params()
        p.define("input_dim", 0, "Depth of the input.")
        p.define("output_dim", 0, "Depth of the output.")
        return p

    def _CreateLayerVariables(self):  # noqa: N802
        p = self.params
        self.CreateVariable(
            "w", py_utils.WeightParams([p.input_dim, p.output_dim], py_utils.WeightInit.Gaussian(0.1))
        )

    def FProp(self, theta, inputs):  # noqa: N802
        return tf.matmul(inputs, theta.w)


class Encoder(LingvoLayer):
    """Children and a variable made in __init__; a TensorPipe child called with the step's context."""

    @classmethod
    def Params(cls):  # noqa: N802
        p = super().Params()
        p.define("proj", Proj.Params().set(input_dim=4, output_dim=3), "A Lingvo-style child.")
        return p

    def __init__(self, params, parent=None):
        super().__init__(params, parent)
        self.CreateChild("proj", self.params.proj)
        self.CreateChild("out", ProjectionLayer.Params().set(input_dim=3, output_dim=2))
        self.CreateVariable("scale", py_utils.WeightParams([], py_utils.WeightInit.Constant(2.0)))

    def FProp(self, theta, inputs):  # noqa: N802
        hidden = self.proj.FProp(theta.proj, inputs) * theta.scale
        return self.out(self.fprop_context, hidden)


def test_lingvo_style_layer_runs_trains_and_checkpoints(tmp_path):
    layer = Encoder.Params().set(name="enc").instantiate()
    assert [key for key, _ in layer.theta.FlattenItems()] == ["out.b", "out.w", "proj.w", "scale"]
    x = tf.ones([5, 4])
    eager = layer.FPropDefaultTheta(x)

    @tf.function(autograph=False)
    def loss_and_grads():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(FPropContext(training=True), x) ** 2)
        return loss, tape.gradient(loss, layer.trainable_variables)

    loss, grads = loss_and_grads()
    np.testing.assert_allclose(float(loss), float(tf.reduce_sum(eager**2)), rtol=1e-6)
    assert len(grads) == 4 and all(g is not None for g in grads)
    path = tf.train.Checkpoint(task=layer).write(str(tmp_path / "ckpt"))
    other = Encoder.Params().set(name="enc", random_seed=7).instantiate()
    tf.train.Checkpoint(task=other).read(path).assert_existing_objects_matched()
    np.testing.assert_allclose(other.FPropDefaultTheta(x).numpy(), eager.numpy())


@pytest.mark.parametrize(
    ("name", "equivalent"),
    [("FProp", "fprop(ctx, *inputs)"), ("theta", "self.vars"), ("CreateVariable", "self.create_variable")],
)
def test_lingvo_names_on_a_tensorpipe_layer_point_the_way(name, equivalent):
    layer = ProjectionLayer.Params().set(name="p", input_dim=2, output_dim=2).instantiate()
    with pytest.raises(AttributeError) as error:
        getattr(layer, name)
    message = str(error.value)
    assert "\n" not in message and f"Lingvo's {name} is {equivalent}" in message and "LingvoLayer" in message


class _EncoderTask(BaseTask):
    """The Encoder as a task's child, so that task.precision reaches it."""

    def __init__(self, params, parent=None):
        super().__init__(params, parent)
        self.create_child("enc", Encoder.Params().set(name="enc"))


def test_lingvo_style_layer_under_mixed_bfloat16_casts_theta_and_inputs(tmp_path):
    """Float32 weights (the float32 task's checkpoint restores into them), computed in bfloat16, every
    weight's gradient float32; the output within bfloat16 rounding of float32's."""
    f32 = _EncoderTask.Params().set(name="task").instantiate()
    mixed = _EncoderTask.Params().set(name="task", precision="mixed_bfloat16").instantiate()
    assert {v.dtype for v in mixed.variables} == {tf.float32}
    assert {t.dtype for t in tf.nest.flatten(mixed.enc.theta)} == {tf.bfloat16}
    path = tf.train.Checkpoint(task=f32).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(task=mixed).read(path).assert_existing_objects_matched()
    x = tf.random.stateless_normal([5, 4], [1, 2])
    with tf.GradientTape() as tape:
        y = mixed.enc(FPropContext(training=True), x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
    grads = tape.gradient(loss, mixed.trainable_variables)
    assert y.dtype == tf.bfloat16 and len(grads) == 4
    assert all(g is not None and g.dtype == tf.float32 for g in grads)
    expected = f32.enc(FPropContext(training=True), x)
    np.testing.assert_allclose(y.numpy().astype(np.float32), expected.numpy(), rtol=0.05, atol=0.05)
    assert mixed.enc.FPropDefaultTheta(x).dtype == tf.bfloat16
