"""Each optimizer against a NumPy reference on a tiny quadratic; slots are checkpointed variables."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tasks import optimizers

# loss = 0.5 * sum(a * (w - c)^2) per variable, so grad = a * (w - c).
INIT = {
    "matrix": np.array([[1.0, -2.0, 0.5], [0.3, 2.0, -1.0]], np.float32),
    "vector": np.array([0.5, -1.5, 2.5], np.float32),
}
SCALE = {k: np.linspace(0.5, 2.0, v.size, dtype=np.float32).reshape(v.shape) for k, v in INIT.items()}
TARGET = {k: np.full(v.shape, 0.25, np.float32) for k, v in INIT.items()}
LR = 0.1
STEPS = 3


def _grad(name: str, w: np.ndarray) -> np.ndarray:
    return SCALE[name] * (w - TARGET[name])


def _run_tf(optimizer: optimizers.Optimizer, start_step: int = 0) -> dict[str, np.ndarray]:
    variables = {k: tf.Variable(v) for k, v in INIT.items()}
    var_list = [variables["matrix"], variables["vector"]]
    optimizer.build(var_list)

    @tf.function
    def step(s: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            loss = tf.add_n(
                [0.5 * tf.reduce_sum(SCALE[k] * tf.square(variables[k] - TARGET[k])) for k in variables]
            )
        grads = tape.gradient(loss, var_list)
        optimizer.apply(grads, var_list, tf.constant(LR), s)

    for s in range(start_step, start_step + STEPS):
        step(tf.constant(s, tf.int64))
    return {k: v.numpy() for k, v in variables.items()}


def _run_numpy(update) -> dict[str, np.ndarray]:
    out = {}
    for name, w0 in INIT.items():
        w = w0.astype(np.float64)
        state: dict = {}
        for s in range(STEPS):
            w = update(w, _grad(name, w).astype(np.float64), state, s + 1)
        out[name] = w
    return out


def _sgd(w, g, state, t):
    return w - LR * g


def _momentum(w, g, state, t):
    state["m"] = 0.8 * state.get("m", 0.0) + g
    return w - LR * state["m"]


def _adam(w, g, state, t):
    b1, b2, eps = 0.9, 0.99, 1e-7
    state["m"] = b1 * state.get("m", 0.0) + (1 - b1) * g
    state["v"] = b2 * state.get("v", 0.0) + (1 - b2) * g * g
    lr_t = LR * np.sqrt(1 - b2**t) / (1 - b1**t)
    return w - lr_t * state["m"] / (np.sqrt(state["v"]) + eps)


def _adafactor(beta1: float):
    def update(w, g, state, t):
        beta2_t = 1.0 - t ** (-0.8)
        g2 = g * g + 1e-30
        if w.ndim >= 2:
            state["vr"] = beta2_t * state.get("vr", 0.0) + (1 - beta2_t) * g2.mean(axis=-1)
            state["vc"] = beta2_t * state.get("vc", 0.0) + (1 - beta2_t) * g2.mean(axis=-2)
            v_hat = np.outer(state["vr"], state["vc"]) / state["vr"].mean()
        else:
            state["v"] = beta2_t * state.get("v", 0.0) + (1 - beta2_t) * g2
            v_hat = state["v"]
        u = g / np.sqrt(v_hat)
        u = u / max(1.0, np.sqrt(np.mean(u * u)) / 1.0)
        step_size = LR * max(1e-3, np.sqrt(np.mean(w * w)))
        if beta1 > 0:
            state["m"] = beta1 * state.get("m", 0.0) + (1 - beta1) * u
            u = state["m"]
        return w - step_size * u

    return update


@pytest.mark.parametrize(
    "make, reference",
    [
        (optimizers.Sgd, _sgd),
        (lambda: optimizers.Momentum(0.8), _momentum),
        (lambda: optimizers.Adam(0.9, 0.99, 1e-7), _adam),
        (optimizers.Adafactor, _adafactor(0.0)),
        (lambda: optimizers.Adafactor(beta1=0.5), _adafactor(0.5)),
    ],
    ids=["sgd", "momentum", "adam", "adafactor", "adafactor_beta1"],
)
def test_three_steps_match_numpy(make, reference) -> None:
    got = _run_tf(make())
    want = _run_numpy(reference)
    for name in INIT:
        assert not np.allclose(got[name], INIT[name]), "the weights must move"
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_adafactor_factors_matrices_and_keeps_vectors_full() -> None:
    opt = optimizers.Adafactor()
    opt.build([tf.Variable(tf.zeros([4, 5, 6])), tf.Variable(tf.zeros([3]))])
    shapes = [{name: v.shape.as_list() for name, v in slots.items()} for slots in opt.slots]
    assert shapes == [{"vr": [4, 5], "vc": [4, 6]}, {"v": [3]}]


def test_adam_bias_correction_uses_the_global_step() -> None:
    """Resuming at step 1000 (t = 1001) differs from a fresh start: the step feeds the correction."""
    fresh = _run_tf(optimizers.Adam(0.9, 0.99, 1e-7))
    late = _run_tf(optimizers.Adam(0.9, 0.99, 1e-7), start_step=1000)
    assert not np.allclose(fresh["vector"], late["vector"], atol=1e-4)


def test_slots_live_on_the_device_of_their_variable() -> None:
    with tf.device("/device:CPU:2"):
        var = tf.Variable(tf.ones([2, 2]))
    opt = optimizers.Adam(0.9, 0.999, 1e-7)
    opt.build([var])
    assert all(s.device.endswith("CPU:2") for s in opt.slot_variables())
    assert len(opt.slot_variables()) == 2


def test_slots_restore_from_a_checkpoint_even_before_build(tmp_path) -> None:
    var = tf.Variable(INIT["matrix"])
    opt = optimizers.Momentum(0.9)
    opt.build([var])
    opt.apply([tf.ones_like(var)], [var], tf.constant(0.1), 0)
    path = tf.train.Checkpoint(opt=opt).save(str(tmp_path / "ckpt"))

    restored = optimizers.Momentum(0.9)
    status = tf.train.Checkpoint(opt=restored).restore(path)
    restored.build([tf.Variable(tf.zeros_like(INIT["matrix"]))])  # after restore: deferred restoration
    status.assert_existing_objects_matched()
    np.testing.assert_allclose(restored.slot_variables()[0].numpy(), np.ones_like(INIT["matrix"]))


def test_build_rejects_a_different_variable_list() -> None:
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    opt = optimizers.Adam(0.9, 0.999, 1e-7)
    opt.build([a, b])
    opt.build([a, b])  # the same list again is fine
    with pytest.raises(ValueError, match="different list"):
        opt.build([b, a])
    with pytest.raises(ValueError, match="not given to build"):
        opt.apply([tf.constant(1.0)], [tf.Variable(3.0)], tf.constant(0.1), 0)


def test_each_slot_is_named_by_its_variable() -> None:
    """A slot's name (which a checkpoint's object graph records) names its variable, so a trainer
    that orders the variables otherwise finds the slots by name (trainer/checkpoint_names.py)."""
    a, b = tf.Variable(tf.zeros([2]), name="task.a.w"), tf.Variable(tf.zeros([3]), name="task.b.w")
    opt = optimizers.Adam(0.9, 0.999, 1e-7)
    opt.build([a, b])
    assert {k: v.name for k, v in opt.slots_of(b).items()} == {
        "m": "task.b.w/adam/m:0",
        "v": "task.b.w/adam/v:0",
    }
    assert [optimizers.slot_owner(s.name.split(":")[0]) for s in opt.slot_variables()] == ["task.a.w"] * 2 + [
        "task.b.w"
    ] * 2
    assert optimizers.slot_owner("adam.3.m") is None  # the names of older checkpoints: by position only
    with pytest.raises(ValueError, match="was not given to build"):
        opt.slots_of(tf.Variable(0.0))
