"""Core layers (projection, conv, pooling, flatten, activation, dropout, embedding, softmax) against
NumPy references, plus initialization and dtype behaviour users rely on."""

import math

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext, weight_init_params
from params.errors import ConfigError

EVAL = FPropContext(training=False)


def _build(params, name="layer", **kwargs):
    return params.set(name=name, **kwargs).instantiate()


def _rng(seed=0):
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------------------- projection
def test_projection_matches_numpy_with_leading_dims():
    layer = _build(core.ProjectionLayer.Params(), input_dim=4, output_dim=3, activation="relu")
    layer.vars["b"].assign([0.5, -0.5, 1.0])
    x = _rng().normal(size=(2, 5, 4)).astype(np.float32)
    w, b = layer.vars["w"].numpy(), layer.vars["b"].numpy()
    want = np.maximum(x @ w + b, 0.0)
    got = layer(EVAL, tf.constant(x)).numpy()
    assert got.shape == (2, 5, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_projection_without_bias_has_only_w():
    layer = _build(core.ProjectionLayer.Params(), input_dim=2, output_dim=2, has_bias=False)
    assert sorted(layer.vars) == ["w"]
    x = np.array([[1.0, 2.0]], np.float32)
    np.testing.assert_allclose(layer(EVAL, x).numpy(), x @ layer.vars["w"].numpy(), rtol=1e-6)


def test_projection_wrong_input_width_names_layer():
    layer = _build(core.ProjectionLayer.Params(), name="proj", input_dim=4, output_dim=3)
    with pytest.raises(ConfigError, match="proj: input last dimension is 5, expected input_dim=4"):
        layer(EVAL, tf.zeros([2, 5]))


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"input_dim": 0, "output_dim": 3}, "params.input_dim must be a positive int, got 0"),
        ({"input_dim": 2, "output_dim": 3, "activation": "rleu"}, "unknown activation 'rleu'"),
    ],
)
def test_projection_bad_settings_fail_at_build(settings, match):
    with pytest.raises(ConfigError, match=match):
        _build(core.ProjectionLayer.Params(), **settings)


# ---------------------------------------------------------------------------------- conv / pool
def _np_conv2d(x, w, stride, padding):
    n, h, wd, _ = x.shape
    kh, kw, _, out = w.shape
    sh, sw = stride
    if padding == "SAME":
        oh, ow = math.ceil(h / sh), math.ceil(wd / sw)
        ph = max((oh - 1) * sh + kh - h, 0)
        pw = max((ow - 1) * sw + kw - wd, 0)
        x = np.pad(x, [(0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)])
    else:
        oh, ow = (h - kh) // sh + 1, (wd - kw) // sw + 1
    y = np.zeros((n, oh, ow, out))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * sh : i * sh + kh, j * sw : j * sw + kw, :]
            y[:, i, j, :] = np.einsum("nhwc,hwco->no", patch, w)
    return y


@pytest.mark.parametrize("padding, stride", [("SAME", (1, 1)), ("SAME", (2, 2)), ("VALID", (2, 1))])
def test_conv2d_matches_numpy(padding, stride):
    layer = _build(
        core.Conv2DLayer.Params(),
        filter_shape=[3, 2, 2, 3],
        filter_stride=stride,
        padding=padding,
        activation="tanh",
    )
    layer.vars["b"].assign([0.1, 0.0, -0.2])
    x = _rng(1).normal(size=(2, 5, 6, 2)).astype(np.float32)
    want = np.tanh(_np_conv2d(x, layer.vars["w"].numpy(), stride, padding) + layer.vars["b"].numpy())
    got = layer(EVAL, x).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_conv2d_bad_padding_and_channels():
    with pytest.raises(ConfigError, match="params.padding must be one of SAME, VALID, got 'same'"):
        _build(core.Conv2DLayer.Params(), filter_shape=[3, 3, 1, 2], padding="same")
    layer = _build(core.Conv2DLayer.Params(), filter_shape=[3, 3, 1, 2])
    with pytest.raises(ConfigError, match=r"expected filter_shape\[2\]=1"):
        layer(EVAL, tf.zeros([1, 4, 4, 3]))


@pytest.mark.parametrize("pooling_type, reduce", [("max", np.max), ("avg", np.mean)])
def test_pooling_matches_numpy(pooling_type, reduce):
    layer = _build(core.PoolingLayer.Params(), pooling_type=pooling_type)
    x = _rng(2).normal(size=(2, 4, 6, 3)).astype(np.float32)
    want = reduce(x.reshape(2, 2, 2, 3, 2, 3), axis=(2, 4))
    np.testing.assert_allclose(layer(EVAL, x).numpy(), want, rtol=1e-6)


def test_pooling_window_3_stride_1_same_keeps_size():
    layer = _build(core.PoolingLayer.Params(), window=(3, 3), stride=(1, 1), padding="SAME")
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    got = layer(EVAL, x).numpy()[0, :, :, 0]
    # The max of each 3x3 neighbourhood of an increasing ramp is its bottom-right neighbour.
    want = np.array([[5, 6, 7, 7], [9, 10, 11, 11], [13, 14, 15, 15], [13, 14, 15, 15]], np.float32)
    np.testing.assert_array_equal(got, want)


def test_flatten_keeps_batch_dim_under_tf_function():
    layer = _build(core.FlattenLayer.Params())
    fn = tf.function(lambda x: layer(EVAL, x), input_signature=[tf.TensorSpec([None, 3, 4, 2])])
    x = _rng().normal(size=(5, 3, 4, 2)).astype(np.float32)
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None, 24]
    np.testing.assert_array_equal(fn(x).numpy(), x.reshape(5, 24))


def test_activation_layer():
    layer = _build(core.ActivationLayer.Params(), activation="sigmoid")
    np.testing.assert_allclose(layer(EVAL, [0.0, 2.0]).numpy(), [0.5, 1 / (1 + math.exp(-2))], rtol=1e-6)


# -------------------------------------------------------------------------------------- dropout
def _dropout(keep_prob=0.5):
    return _build(core.DropoutLayer.Params(), name="drop", keep_prob=keep_prob)


def test_dropout_same_key_same_mask_other_step_or_micro_batch_differ():
    layer = _dropout()
    x = tf.ones([64, 32])
    a = layer(FPropContext(training=True, step=3, seed=7), x).numpy()
    b = layer(FPropContext(training=True, step=3, seed=7), x).numpy()
    np.testing.assert_array_equal(a, b)
    for ctx in (
        FPropContext(training=True, step=4, seed=7),
        FPropContext(training=True, step=3, seed=8),
        FPropContext(training=True, step=3, seed=7).for_micro_batch(1),
    ):
        assert not np.array_equal(a, layer(ctx, x).numpy())


def test_dropout_mask_same_in_tf_function_with_tensor_step():
    layer = _dropout()
    x = tf.ones([16, 16])
    fn = tf.function(lambda step: layer(FPropContext(training=True, step=step), x))
    np.testing.assert_array_equal(fn(tf.constant(5)).numpy(), layer(FPropContext(training=True, step=5), x))


def test_dropout_eval_is_identity():
    x = _rng().normal(size=(8, 8)).astype(np.float32)
    np.testing.assert_array_equal(_dropout(0.3)(EVAL, x).numpy(), x)


def test_dropout_keep_rate_and_scaling():
    keep_prob = 0.8
    y = _dropout(keep_prob)(FPropContext(training=True, step=1), tf.ones([200, 500])).numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], 1.0 / keep_prob, rtol=1e-6)
    # 100k Bernoulli(0.8) draws: the standard error of the rate is ~0.0013.
    assert abs(kept.mean() - keep_prob) < 0.006
    assert abs(y.mean() - 1.0) < 0.01


def test_dropout_rejects_keep_prob_zero():
    with pytest.raises(
        ConfigError, match=r"drop: params.keep_prob must be a number in \(0.0, 1.0\], got 0.0"
    ):
        _dropout(0.0)


# ------------------------------------------------------------------------------------ embedding
@pytest.mark.parametrize("scale", [False, True])
def test_embedding_gathers_rows(scale):
    layer = _build(core.EmbeddingLayer.Params(), vocab_size=10, embedding_dim=4, scale_sqrt_depth=scale)
    ids = np.array([[1, 9, 1], [0, 3, 2]])
    table = layer.emb_matrix().numpy()
    assert table.shape == (10, 4)
    got = layer(EVAL, tf.constant(ids)).numpy()
    np.testing.assert_allclose(got, table[ids] * (2.0 if scale else 1.0), rtol=1e-6)


def test_embedding_rejects_float_ids():
    layer = _build(core.EmbeddingLayer.Params(), name="emb", vocab_size=3, embedding_dim=2)
    with pytest.raises(ConfigError, match="emb: ids must be ints, got dtype float32"):
        layer(EVAL, tf.constant([1.0]))


# -------------------------------------------------------------------------------------- softmax
def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_xent_matches_numpy(smoothing):
    layer = _build(core.SoftmaxLayer.Params(), input_dim=3, num_classes=5, label_smoothing=smoothing)
    layer.vars["b"].assign([0.0, 0.1, 0.2, 0.3, -1.0])
    x = _rng(3).normal(size=(4, 3)).astype(np.float32)
    labels = np.array([0, 4, 2, 2])
    weights = np.array([1.0, 0.5, 0.0, 2.0], np.float32)
    out = layer(EVAL, x, labels, weights)
    logits = x @ layer.vars["w"].numpy() + layer.vars["b"].numpy()
    target = (1 - smoothing) * np.eye(5)[labels] + smoothing / 5
    xent = -(target * _np_log_softmax(logits.astype(np.float64))).sum(-1)
    np.testing.assert_allclose(out["logits"].numpy(), logits, rtol=1e-5)
    np.testing.assert_allclose(out["per_example_xent"].numpy(), xent, rtol=1e-5)
    np.testing.assert_allclose(out["total_weight"].numpy(), 3.5)
    np.testing.assert_allclose(out["avg_xent"].numpy(), (xent * weights).sum() / 3.5, rtol=1e-5)


def test_label_smoothing_hand_computed_value():
    # Zero logits: each class has probability 1/4, so the xent is log(4) whatever the smoothing.
    # With logits [log 3, 0, 0, 0] the probabilities are [1/2, 1/6, 1/6, 1/6]; eps=0.2 gives target
    # [0.85, 0.05, 0.05, 0.05] for label 0, so xent = 0.85 log 2 + 0.15 log 6.
    layer = _build(core.SoftmaxLayer.Params(), input_dim=1, num_classes=4, label_smoothing=0.2)
    layer.vars["w"].assign([[math.log(3.0), 0.0, 0.0, 0.0]])
    out = layer(EVAL, [[1.0], [0.0]], [0, 2])
    want = [0.85 * math.log(2) + 0.15 * math.log(6), math.log(4)]
    np.testing.assert_allclose(out["per_example_xent"].numpy(), want, rtol=1e-6)
    assert out["total_weight"].numpy() == 2.0


def test_softmax_zero_total_weight_gives_zero_not_nan():
    layer = _build(core.SoftmaxLayer.Params(), input_dim=2, num_classes=3)
    out = layer(EVAL, tf.ones([2, 2]), [0, 1], weights=[0.0, 0.0])
    assert out["avg_xent"].numpy() == 0.0


def test_softmax_rejects_smoothing_one():
    with pytest.raises(ConfigError, match=r"params.label_smoothing must be a number in \[0.0, 1.0\)"):
        _build(core.SoftmaxLayer.Params(), input_dim=2, num_classes=3, label_smoothing=1.0)


# ----------------------------------------------------------------------- initialization / dtypes
def _weights(seed):
    p = core.ProjectionLayer.Params().set(name="proj", input_dim=8, output_dim=8, random_seed=seed)
    return p.instantiate().vars["w"].numpy()


def test_same_seed_same_weights_different_seed_different_weights():
    np.testing.assert_array_equal(_weights(1), _weights(1))
    assert not np.allclose(_weights(1), _weights(2))


def test_xavier_default_within_limit_and_weight_init_override():
    w = _weights(3)
    limit = math.sqrt(6.0 / 16)
    assert np.abs(w).max() <= limit and np.abs(w).max() > 0.5 * limit
    p = core.ProjectionLayer.Params().set(
        name="p", input_dim=2, output_dim=2, weight_init=weight_init_params("constant", 0.25)
    )
    np.testing.assert_array_equal(p.instantiate().vars["w"].numpy(), np.full([2, 2], 0.25))


@pytest.mark.parametrize("dtype", [tf.float64, tf.bfloat16])
def test_layers_compute_in_params_dtype(dtype):
    proj = _build(core.ProjectionLayer.Params(), input_dim=3, output_dim=2, dtype=dtype)
    assert proj.vars["w"].dtype == dtype
    y = tf.function(lambda x: proj(EVAL, x))(np.ones([2, 3], np.float32))
    assert y.dtype == dtype
    softmax = _build(core.SoftmaxLayer.Params(), input_dim=2, num_classes=3, dtype=dtype)
    out = softmax(EVAL, y, [0, 1])
    assert out["logits"].dtype == dtype
    assert out["avg_xent"].dtype == (tf.float64 if dtype == tf.float64 else tf.float32)
