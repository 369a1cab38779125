"""Learner: schedules against their formulas, L2, clipping, validation, checkpointed slots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from params.errors import ConfigError
from tasks import learner as learner_lib
from tasks.learner import Learner


def _params(**kwargs):
    return learner_lib.train_params().set(**kwargs)


def _lr(p, step: int) -> float:
    return float(Learner(p).learning_rate(tf.constant(step, tf.int64)))


def test_constant_schedule() -> None:
    p = _params(learning_rate=0.5)
    assert [_lr(p, s) for s in (0, 10, 10**6)] == pytest.approx([0.5, 0.5, 0.5])


@pytest.mark.parametrize("step", [0, 4, 9, 10, 99, 9999])
def test_linear_rsqrt_schedule(step: int) -> None:
    p = _params(learning_rate=2.0, lr_schedule="linear_rsqrt", warmup_steps=10)
    want = 2.0 * min((step + 1) / 10, math.sqrt(10 / (step + 1)))
    assert _lr(p, step) == pytest.approx(want, rel=1e-6)


def test_linear_rsqrt_peaks_at_the_end_of_warmup() -> None:
    learner = Learner(_params(learning_rate=1.0, lr_schedule="linear_rsqrt", warmup_steps=10))
    values = [float(learner.learning_rate(s)) for s in range(30)]
    assert int(np.argmax(values)) == 9 and values[9] == pytest.approx(1.0)


@pytest.mark.parametrize("step", [0, 49, 50, 51, 275, 499, 500, 2000])
def test_linear_cosine_schedule(step: int) -> None:
    p = _params(learning_rate=3.0, lr_schedule="linear_cosine", warmup_steps=50, max_steps=500)
    if step < 50:
        want = (step + 1) / 50
    else:
        want = 0.5 * (1 + math.cos(math.pi * min(1.0, (step - 50) / 450)))
    assert _lr(p, step) == pytest.approx(3.0 * want, rel=1e-5, abs=1e-7)


def test_linear_cosine_without_warmup_starts_at_peak_and_ends_at_zero() -> None:
    learner = Learner(_params(learning_rate=1.0, lr_schedule="linear_cosine", warmup_steps=0, max_steps=100))
    assert float(learner.learning_rate(0)) == pytest.approx(1.0)
    assert float(learner.learning_rate(50)) == pytest.approx(0.5, abs=1e-6)
    assert float(learner.learning_rate(100)) == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    "step, want", [(0, 1.0), (99, 1.0), (100, 0.1), (199, 0.1), (200, 0.01), (10**5, 0.01)]
)
def test_piecewise_schedule(step: int, want: float) -> None:
    p = _params(
        learning_rate=0.2, lr_schedule="piecewise", lr_boundaries=[100, 200], lr_values=[1.0, 0.1, 0.01]
    )
    assert _lr(p, step) == pytest.approx(0.2 * want, rel=1e-6)


def test_schedule_works_inside_tf_function() -> None:
    learner = Learner(_params(learning_rate=1.0, lr_schedule="linear_rsqrt", warmup_steps=4))
    lr = tf.function(learner.learning_rate)
    assert float(lr(tf.constant(15, tf.int64))) == pytest.approx(math.sqrt(4 / 16))


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"lr_schedule": "exp"}, "lr_schedule"),
        ({"lr_schedule": "linear_rsqrt", "warmup_steps": 0}, "warmup_steps"),
        ({"lr_schedule": "linear_cosine", "warmup_steps": 10, "max_steps": 10}, "warmup_steps"),
        ({"lr_schedule": "piecewise", "lr_boundaries": [10], "lr_values": [1.0]}, "lr_values"),
        (
            {"lr_schedule": "piecewise", "lr_boundaries": [20, 10], "lr_values": [1.0, 0.5, 0.1]},
            "lr_boundaries",
        ),
        ({"clip_gradient_norm_to_value": -1.0}, "clip_gradient_norm_to_value"),
        ({"l2_regularizer_weight": -0.1}, "l2_regularizer_weight"),
        ({"beta2": 1.0}, "beta2"),
        ({"learning_rate": -0.1}, "learning_rate"),
    ],
)
def test_bad_settings_raise_config_error_naming_the_key(settings: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"task\.train\.{key}: expected"):
        Learner(_params(**settings))


def _sgd_step(grads: list[np.ndarray], init: list[np.ndarray], step: int = 0, **settings):
    variables = [tf.Variable(v) for v in init]
    learner = Learner(_params(optimizer="sgd", learning_rate=0.5, **settings), variables)
    out = tf.function(learner.apply_gradients)(
        [(tf.constant(g), v) for g, v in zip(grads, variables)], tf.constant(step, tf.int64)
    )
    return [v.numpy() for v in variables], {k: float(v) for k, v in out.items()}


GRADS = [np.array([3.0, 0.0], np.float32), np.array([[0.0], [4.0]], np.float32)]  # global norm 5
INIT = [np.array([1.0, 2.0], np.float32), np.array([[-1.0], [0.5]], np.float32)]


def test_without_clipping_the_step_is_plain_sgd() -> None:
    new, out = _sgd_step(GRADS, INIT)
    assert out == pytest.approx({"learning_rate": 0.5, "grad_norm": 5.0, "grad_scale": 1.0})
    for n, i, g in zip(new, INIT, GRADS):
        np.testing.assert_allclose(n, i - 0.5 * g, rtol=1e-6)


def test_clipping_scales_gradients_to_the_global_norm() -> None:
    new, out = _sgd_step(GRADS, INIT, clip_gradient_norm_to_value=2.0)
    assert out["grad_norm"] == pytest.approx(5.0)
    assert out["grad_scale"] == pytest.approx(0.4)
    for n, i, g in zip(new, INIT, GRADS):
        np.testing.assert_allclose(n, i - 0.5 * 0.4 * g, rtol=1e-6)


def test_clipping_and_l2_run_where_each_gradient_is() -> None:
    """A pipeline stage's gradient is scaled on its own device (for stages on other processes: in its
    own process, not the trainer's)."""
    with tf.device("/device:CPU:1"):
        v = tf.Variable([1.0, 2.0])
    learner = Learner(
        _params(optimizer="sgd", clip_gradient_norm_to_value=1.0, l2_regularizer_weight=0.1), [v]
    )

    def step():
        with tf.device("/device:CPU:1"):
            g = tf.identity(tf.constant([3.0, 4.0]), name="stage_gradient")
        return learner.apply_gradients([(g, v)], tf.constant(0, tf.int64))

    graph = tf.function(step).get_concrete_function().graph
    # Every op that computes on the gradient itself (gradient-shaped tensors from stage_gradient on:
    # the L2 term added, the clipping's scale applied) is placed where the gradient is.
    found, frontier = [], [graph.get_operation_by_name("stage_gradient")]
    while frontier:
        op = frontier.pop()
        for consumer in {c for t in op.outputs for c in t.consumers()}:
            if consumer not in found and any(t.shape == v.shape for t in consumer.outputs):
                found.append(consumer)
                frontier.append(consumer)
    assert len(found) >= 2, [op.name for op in found]  # the L2 term and the scale, at least
    assert all("CPU:1" in op.device for op in found), [(op.name, op.device) for op in found]


def test_clipping_leaves_small_gradients_alone() -> None:
    new, out = _sgd_step(GRADS, INIT, clip_gradient_norm_to_value=10.0)
    assert out["grad_scale"] == pytest.approx(1.0)
    np.testing.assert_allclose(new[0], INIT[0] - 0.5 * GRADS[0], rtol=1e-6)


def test_l2_adds_weight_times_variable_before_the_norm() -> None:
    new, out = _sgd_step(GRADS, INIT, l2_regularizer_weight=0.1)
    total = [g + 0.1 * i for g, i in zip(GRADS, INIT)]
    assert out["grad_norm"] == pytest.approx(math.sqrt(sum(float(np.sum(t * t)) for t in total)), rel=1e-6)
    for n, i, t in zip(new, INIT, total):
        np.testing.assert_allclose(n, i - 0.5 * t, rtol=1e-6)


def test_l2_matches_the_gradient_of_half_the_squared_norm() -> None:
    """l2_regularizer_weight is the weight of 0.5 * sum(w^2): the same step as adding it to the loss."""
    w = tf.Variable(INIT[0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(GRADS[0] * w) + 0.1 * 0.5 * tf.reduce_sum(tf.square(w))
    want = INIT[0] - 0.5 * tape.gradient(loss, w).numpy()
    new, _ = _sgd_step([GRADS[0]], [INIT[0]], l2_regularizer_weight=0.1)
    np.testing.assert_allclose(new[0], want, rtol=1e-6)


def test_variables_without_gradient_are_skipped() -> None:
    a, b = tf.Variable([1.0]), tf.Variable([2.0])
    learner = Learner(_params(optimizer="adam", learning_rate=0.1), [a, b])
    learner.apply_gradients([(tf.constant([1.0]), a), (None, b)], 0)
    assert a.numpy()[0] != 1.0 and b.numpy()[0] == 2.0
    with pytest.raises(ValueError, match="no variable has a gradient"):
        learner.apply_gradients([(None, a)], 1)


def test_learner_slots_are_saved_by_a_checkpoint(tmp_path) -> None:
    var = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
    learner = Learner(_params(optimizer="adam"), [var])
    learner.apply_gradients([(tf.ones_like(var), var)], 0)
    assert len(learner.slot_variables()) == 2
    path = tf.train.Checkpoint(learner=learner).save(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path)}
    assert sum("learner/optimizer/slots" in name for name in saved) == 2

    other = Learner(_params(optimizer="adam"), [tf.Variable(tf.zeros([2, 2]))])
    tf.train.Checkpoint(learner=other).restore(path).assert_existing_objects_matched()
    for got, want in zip(other.slot_variables(), learner.slot_variables()):
        np.testing.assert_allclose(got.numpy(), want.numpy())


def test_slots_are_created_on_first_use_inside_tf_function() -> None:
    """Without build(), the first compiled step creates the slots (once) and training proceeds."""
    var = tf.Variable([[1.0, -1.0]])
    learner = Learner(_params(optimizer="adam", learning_rate=0.1))

    @tf.function
    def step(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(var))
        return learner.apply_gradients(zip(tape.gradient(loss, [var]), [var]), s)

    for s in range(3):
        step(tf.constant(s, tf.int64))
    assert len(learner.slot_variables()) == 2
    # Adam's first steps move each weight by about lr toward zero.
    np.testing.assert_allclose(var.numpy(), [[0.7, -0.7]], atol=5e-3)
