"""Multi-head attention: against a NumPy reference, masks, fused projections, the decoding cache."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from layers.attention import MultiHeadAttention, causal_mask, padding_mask, segment_mask
from layers.base_layer import FPropContext
from params.errors import ConfigError

CTX = FPropContext()


def _layer(**kwargs) -> MultiHeadAttention:
    p = MultiHeadAttention.Params().set(name="atten", input_dim=8, num_heads=2, random_seed=7)
    p.set(**kwargs)
    layer = p.instantiate()
    for name, var in layer.vars.items():  # non-zero biases, so the reference checks them too
        if name.startswith("b_"):
            var.assign(tf.random.stateless_normal(var.shape, [1, len(name)]))
    return layer


def _numpy_attention(layer, query, source, mask):
    """Vaswani et al.'s formula with explicit per-head loops."""
    v = {k: x.numpy() for k, x in layer.vars.items()}
    hidden = layer.num_heads * layer.head_dim
    if "w_qkv" in v:
        wq, wk, wv = np.split(v["w_qkv"], 3, axis=1)
        bq, bk, bv = np.split(v["b_qkv"], 3)
    else:
        wq, wk, wv, bq, bk, bv = (v[k] for k in ("w_q", "w_k", "w_v", "b_q", "b_k", "b_v"))
    q, k, val = query @ wq + bq, source @ wk + bk, source @ wv + bv
    b, t, s = query.shape[0], query.shape[1], source.shape[1]
    context = np.zeros((b, t, hidden))
    for h in range(layer.num_heads):
        cols = slice(h * layer.head_dim, (h + 1) * layer.head_dim)
        logits = q[:, :, cols] @ np.transpose(k[:, :, cols], (0, 2, 1)) / np.sqrt(layer.head_dim)
        logits = np.where(np.broadcast_to(mask, (b, t, s)), logits, -np.inf)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context[:, :, cols] = probs @ val[:, :, cols]
    return context @ v["w_o"] + v["b_o"]


@pytest.mark.parametrize("fused", [False, True])
def test_self_attention_matches_numpy_reference_with_padding(fused):
    layer = _layer(fused_qkv=fused)
    x = np.random.RandomState(0).randn(3, 5, 8).astype(np.float32)
    paddings = np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]], np.float32)
    mask = padding_mask(tf.constant(paddings))
    got = layer(CTX, x, mask=mask).numpy()
    want = _numpy_attention(layer, x, x, paddings[:, None, :] == 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_cross_attention_matches_numpy_reference():
    layer = _layer(source_dim=6, output_dim=4, hidden_dim=12, num_heads=3)
    rng = np.random.RandomState(1)
    query = rng.randn(2, 4, 8).astype(np.float32)
    source = rng.randn(2, 7, 6).astype(np.float32)
    got = layer(CTX, query, source=source).numpy()
    assert got.shape == (2, 4, 4)
    np.testing.assert_allclose(got, _numpy_attention(layer, query, source, True), rtol=1e-4, atol=1e-5)


def test_causal_matches_numpy_reference():
    layer = _layer(causal=True)
    x = np.random.RandomState(2).randn(2, 6, 8).astype(np.float32)
    want = _numpy_attention(layer, x, x, np.tril(np.ones((6, 6), bool)))
    np.testing.assert_allclose(layer(CTX, x).numpy(), want, rtol=1e-4, atol=1e-5)


def test_padded_keys_have_no_effect():
    layer = _layer()
    rng = np.random.RandomState(3)
    query = rng.randn(2, 3, 8).astype(np.float32)
    source = rng.randn(2, 5, 8).astype(np.float32)
    paddings = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]], np.float32)
    mask = padding_mask(tf.constant(paddings))
    perturbed = source + 100.0 * rng.randn(2, 5, 8).astype(np.float32) * paddings[:, :, None]
    a = layer(CTX, query, source=source, mask=mask).numpy()
    b = layer(CTX, query, source=perturbed, mask=mask).numpy()
    np.testing.assert_array_equal(a, b)
    unmasked = layer(CTX, query, source=perturbed).numpy()
    assert np.abs(unmasked - a).max() > 1e-2  # the perturbation does matter without the mask


def test_future_positions_have_no_effect_under_causal_mask():
    layer = _layer(causal=True)
    rng = np.random.RandomState(4)
    x = rng.randn(2, 6, 8).astype(np.float32)
    changed = x.copy()
    changed[:, 4:] += 50.0 * rng.randn(2, 2, 8).astype(np.float32)
    a, b = layer(CTX, x).numpy(), layer(CTX, changed).numpy()
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert np.abs(a[:, 4:] - b[:, 4:]).max() > 1e-2


def test_segment_mask_keeps_packed_examples_apart():
    layer = _layer()
    rng = np.random.RandomState(5)
    x = rng.randn(1, 6, 8).astype(np.float32)
    segments = tf.constant([[1, 1, 1, 2, 2, 2]])
    packed = layer(CTX, x, mask=segment_mask(segments, segments)).numpy()
    first, second = layer(CTX, x[:, :3]).numpy(), layer(CTX, x[:, 3:]).numpy()
    np.testing.assert_allclose(packed, np.concatenate([first, second], 1), rtol=1e-5, atol=1e-6)


def test_fused_and_separate_projections_agree():
    fused = _layer(fused_qkv=True)
    separate = _layer(fused_qkv=False)
    w = np.split(fused.vars["w_qkv"].numpy(), 3, axis=1)
    b = np.split(fused.vars["b_qkv"].numpy(), 3)
    for i, name in enumerate("qkv"):
        separate.vars[f"w_{name}"].assign(w[i])
        separate.vars[f"b_{name}"].assign(b[i])
    separate.vars["w_o"].assign(fused.vars["w_o"])
    separate.vars["b_o"].assign(fused.vars["b_o"])
    x = np.random.RandomState(6).randn(2, 4, 8).astype(np.float32)
    np.testing.assert_allclose(fused(CTX, x).numpy(), separate(CTX, x).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True])
def test_extend_step_with_cache_matches_causal_fprop(fused):
    layer = _layer(causal=True, fused_qkv=fused)
    x = tf.constant(np.random.RandomState(7).randn(2, 5, 8).astype(np.float32))
    full = layer(CTX, x).numpy()
    cache = layer.init_cache(2, 8)  # longer than needed: unused slots must be invisible
    step = tf.function(lambda x_t, cache, t: layer.extend_step(CTX, x_t, cache, t))
    for t in range(5):
        out, cache = step(x[:, t : t + 1], cache, tf.constant(t))
        np.testing.assert_allclose(out.numpy()[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    assert cache["key"].shape == (2, 8, 2, 4)
    np.testing.assert_array_equal(cache["key"].numpy()[:, 5:], 0.0)


def test_attention_dropout_is_keyed_by_step_and_off_in_eval():
    layer = _layer(atten_dropout_prob=0.5)
    x = np.random.RandomState(8).randn(2, 5, 8).astype(np.float32)
    train = [layer(FPropContext(training=True, step=s), x).numpy() for s in (3, 3, 4)]
    np.testing.assert_array_equal(train[0], train[1])
    assert np.abs(train[0] - train[2]).max() > 1e-3
    eval_out = layer(FPropContext(training=False), x).numpy()
    no_dropout = _layer()(CTX, x).numpy()
    np.testing.assert_array_equal(eval_out, no_dropout)


def test_mask_helpers():
    np.testing.assert_array_equal(
        causal_mask(3).numpy()[0], [[True, False, False], [True, True, False], [True, True, True]]
    )
    # Keys aligned to the end: the last query sees every key.
    np.testing.assert_array_equal(causal_mask(1, 4).numpy()[0], [[True, True, True, True]])
    np.testing.assert_array_equal(padding_mask(tf.constant([[0.0, 1.0]])).numpy(), [[[True, False]]])


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="num_heads=3 must divide hidden_dim=8"):
        _layer(num_heads=3)
    with pytest.raises(ConfigError, match="fused_qkv needs source_dim == input_dim"):
        _layer(fused_qkv=True, source_dim=4)
    with pytest.raises(ConfigError, match="input last dimension is 6"):
        _layer()(CTX, np.zeros((1, 2, 6), np.float32))
