"""SequentialLayer and RepeatLayer: naming, order, distinct weights, inheritance from the parent,
and gradients through a small stack under tf.function."""

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext, weight_init_params
from params.errors import ConfigError

EVAL = FPropContext(training=False)


def _proj(input_dim, output_dim, **kwargs):
    return core.ProjectionLayer.Params().set(input_dim=input_dim, output_dim=output_dim, **kwargs)


def _image_stack():
    p = core.SequentialLayer.Params().set(name="net")
    p.sub = [
        core.Conv2DLayer.Params().set(name="conv", filter_shape=[3, 3, 1, 4], activation="relu"),
        core.PoolingLayer.Params(),
        core.FlattenLayer.Params(),
        _proj(64, 10, name="logits"),
    ]
    return p.instantiate()


def test_sequential_names_children_and_chains_in_order():
    net = _image_stack()
    assert [layer.path for layer in net.sub_layers()] == ["net/conv", "net/sub_1", "net/sub_2", "net/logits"]
    x = np.random.default_rng(0).normal(size=(2, 8, 8, 1)).astype(np.float32)
    y = net(EVAL, x)
    assert y.shape == (2, 10)
    manual = x
    for layer in (net.conv, net.sub_1, net.sub_2, net.logits):
        manual = layer(EVAL, manual)
    np.testing.assert_array_equal(y.numpy(), manual.numpy())
    assert sorted(v.name for v in net.trainable_variables) == [
        "net.conv.b:0",
        "net.conv.w:0",
        "net.logits.b:0",
        "net.logits.w:0",
    ]


def test_empty_sequential_is_identity():
    net = core.SequentialLayer.Params().set(name="id").instantiate()
    np.testing.assert_array_equal(net(EVAL, [1.0, 2.0]), [1.0, 2.0])


def test_sequential_duplicate_child_name_fails():
    p = core.SequentialLayer.Params().set(name="net", sub=[_proj(2, 2, name="a"), _proj(2, 2, name="a")])
    with pytest.raises(ConfigError, match="net: child 'a' already exists"):
        p.instantiate()


def test_sequential_rejects_non_layer_params():
    p = core.SequentialLayer.Params().set(name="net", sub=[_proj(2, 2), weight_init_params()])
    with pytest.raises(ConfigError, match=r"net: params.sub\[1\] must be a layer's Params"):
        p.instantiate()


def test_repeat_builds_distinct_weights_applied_in_order():
    p = core.RepeatLayer.Params().set(name="rep", body=_proj(4, 4, activation="tanh"), repeat=3)
    rep = p.instantiate()
    assert [layer.path for layer in rep.body] == ["rep/body_0", "rep/body_1", "rep/body_2"]
    ws = [layer.vars["w"].numpy() for layer in rep.body]
    assert not np.allclose(ws[0], ws[1]) and not np.allclose(ws[1], ws[2])
    x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    want = x
    for layer in rep.body:
        want = np.tanh(want @ layer.vars["w"].numpy() + layer.vars["b"].numpy())
    np.testing.assert_allclose(rep(EVAL, x).numpy(), want, rtol=1e-5, atol=1e-6)


def test_repeat_needs_body():
    with pytest.raises(ConfigError, match="rep: params.body must be a layer's Params"):
        core.RepeatLayer.Params().set(name="rep", repeat=2).instantiate()


def test_children_inherit_dtype_seed_and_weight_init_unless_set():
    p = core.SequentialLayer.Params().set(
        name="net", dtype=tf.float64, random_seed=77, weight_init=weight_init_params("constant", 0.5)
    )
    p.sub = [_proj(2, 3, name="a"), _proj(3, 2, name="b", random_seed=5, dtype=tf.float32)]
    net = p.instantiate()
    assert net.a.params.dtype == tf.float64 and net.a.params.random_seed == 77
    assert net.a.vars["w"].dtype == tf.float64
    np.testing.assert_array_equal(net.a.vars["w"].numpy(), np.full([2, 3], 0.5))
    assert net.b.params.dtype == tf.float32 and net.b.params.random_seed == 5
    assert net.b.params.weight_init.method == "constant"


def test_same_seed_same_weights_whole_stack_and_seed_changes_them():
    def weights(seed):
        p = core.RepeatLayer.Params().set(name="rep", body=_proj(3, 3), repeat=2, random_seed=seed)
        return [v.numpy() for v in p.instantiate().trainable_variables]

    for a, b in zip(weights(9), weights(9)):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(weights(9)[1], weights(10)[1])


def test_gradient_through_stack_under_tf_function_matches_finite_differences():
    p = core.SequentialLayer.Params().set(name="net", dtype=tf.float64)
    p.sub = [
        _proj(3, 5, name="proj", activation="tanh"),
        core.BatchNormLayer.Params().set(dim=5),
        core.DropoutLayer.Params().set(keep_prob=0.8),
        _proj(5, 4, activation="gelu"),
        core.LayerNorm.Params().set(input_dim=4),
    ]
    net = p.instantiate()
    softmax = core.SoftmaxLayer.Params().set(name="softmax", input_dim=4, num_classes=3, dtype=tf.float64)
    softmax = softmax.instantiate()
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(6, 3)))
    labels = tf.constant([0, 1, 2, 0, 1, 2])
    w = net.proj.vars["w"]

    def loss():
        ctx = FPropContext(training=True, step=3)
        return softmax(ctx, net(ctx, x), labels)["avg_xent"]

    @tf.function
    def grad():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, w)

    analytic = grad().numpy()
    numeric = np.zeros_like(analytic)
    base = w.numpy()
    for index in np.ndindex(base.shape):
        for sign in (1.0, -1.0):
            shifted = base.copy()
            shifted[index] += sign * 1e-6
            w.assign(shifted)
            numeric[index] += sign * loss().numpy() / 2e-6
    w.assign(base)
    assert np.abs(analytic).max() > 1e-3
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-8)


def test_on_key_layer_transforms_one_entry_and_passes_the_rest():
    layer = core.OnKeyLayer.Params().set(name="k", key="x", body=_proj(3, 2)).instantiate()
    x = np.ones((4, 3), np.float32)
    target = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = layer(EVAL, {"x": x, "target": target})
    assert sorted(out) == ["target", "x"]
    np.testing.assert_array_equal(out["x"].numpy(), layer.body(EVAL, x).numpy())
    assert out["target"] is target
    assert [v.name for v in layer.trainable_variables] == ["k.body.b:0", "k.body.w:0"]
    with pytest.raises(ConfigError, match=r"k: expected a dict state with entry 'x', got \['y'\]"):
        layer(EVAL, {"y": x})
    with pytest.raises(ConfigError, match="params.body must be a layer's Params"):
        core.OnKeyLayer.Params().set(name="k").instantiate()
