"""The learner over variables on two DTensor meshes (a GPipe pipeline's stages on meshes of their own):
its shared scalars (learning rate, the clipping scale, Adam's step) are copied onto each variable's
mesh, the global norm is summed on the ``home`` mesh, and ``finite=False`` changes nothing."""

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from tasks.learner import Learner, train_params

STEPS = 3


def _settings():
    return train_params().set(
        optimizer="adam", learning_rate=0.1, lr_schedule="linear_cosine", warmup_steps=1, max_steps=10,
        clip_gradient_norm_to_value=0.5,
    )  # fmt: skip


def _values():
    rng = np.random.default_rng(0)
    return [rng.normal(size=(4, 2)).astype("f"), rng.normal(size=(2,)).astype("f")]


def _whole(v) -> np.ndarray:
    layout = dtensor.fetch_layout(v)
    full = dtensor.relayout(v.read_value(), dtensor.Layout.replicated(layout.mesh, v.shape.rank))
    return dtensor.unpack(full)[0].numpy()


def _run(variables, step, home_mesh, finite: bool):
    learner = Learner(_settings(), variables, home=home_mesh)

    @tf.function
    def update():
        # The gradient of sum(v ** 3) of each variable, made on its own mesh.
        grads = [3.0 * tf.square(v.read_value()) for v in variables]
        flag = (
            tf.constant(finite) if home_mesh is None else mesh_lib.scalar_on(tf.constant(finite), home_mesh)
        )
        out = learner.apply_gradients(zip(grads, variables), step.read_value(), finite=flag)
        step.assign_add(1)
        return out["grad_norm"]

    norms = [update() for _ in range(STEPS)]
    return norms


def test_two_meshes_update_like_one_device_and_a_false_guard_changes_nothing():
    a = mesh_lib.create_mesh([2], ["model"], first_device=0)
    b = mesh_lib.create_mesh([2], ["model"], first_device=2)
    w, bias = _values()
    plain = [tf.Variable(w), tf.Variable(bias)]
    want_norms = _run(plain, tf.Variable(0, dtype=tf.int64), None, True)
    sharded = [a.variable(w, [None, "model"], "w", True), b.variable(bias, ["model"], "b", True)]
    step = b.variable(tf.constant(0, tf.int64), [], "global_step", False)
    got_norms = _run(sharded, step, b.mesh, True)
    for got, want in zip(got_norms, want_norms):
        np.testing.assert_allclose(dtensor.unpack(got)[0].numpy(), want.numpy(), rtol=1e-6)
    for v, p in zip(sharded, plain):
        np.testing.assert_allclose(_whole(v), p.numpy(), atol=1e-6)
    assert not np.allclose(plain[0].numpy(), w)  # it trained

    frozen = [a.variable(w, [None, "model"], "w2", True), b.variable(bias, ["model"], "b2", True)]
    _run(frozen, b.variable(tf.constant(0, tf.int64), [], "step2", False), b.mesh, False)
    np.testing.assert_array_equal(_whole(frozen[0]), w)
    np.testing.assert_array_equal(_whole(frozen[1]), bias)
