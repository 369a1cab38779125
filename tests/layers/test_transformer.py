"""Transformer layers: positions, masks through the stack, the decoding cache, the loss."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from layers import beam_search
from layers.base_layer import FPropContext
from layers.core import SoftmaxLayer
from layers.losses import label_smoothed_xent
from layers.transformer import transformer_layer_params
from layers.transformer_decoding import (
    cached_step_fn,
    full_prefix_step_fn,
    init_cached_state,
    init_full_prefix_state,
)
from layers.transformer_input import PositionalEmbedding, TransformerInput, sinusoidal_positions
from layers.transformer_stack import TransformerStack, stack_params
from params.errors import ConfigError

CTX = FPropContext()
DIM = 16


def _decoder(num_layers: int = 2, **kwargs) -> TransformerStack:
    p = stack_params(num_layers, DIM, 4, 32, decoder=True, **kwargs).set(name="dec", random_seed=3)
    return p.instantiate()


def _encoder(num_layers: int = 2) -> TransformerStack:
    return stack_params(num_layers, DIM, 4, 32).set(name="enc", random_seed=4).instantiate()


def test_sinusoidal_positions_follow_the_formula():
    signal = sinusoidal_positions(tf.range(5), 8).numpy()
    assert signal.shape == (5, 8)
    inv = 1e4 ** (-np.arange(4) / 3.0)
    pos = np.arange(5)[:, None] * inv
    np.testing.assert_allclose(signal, np.concatenate([np.sin(pos), np.cos(pos)], 1), rtol=1e-5, atol=1e-5)


def test_learned_positions_and_positions_argument():
    p = TransformerInput.Params().set(
        name="emb", vocab_size=10, model_dim=DIM, position="learned", max_length=8
    )
    emb = p.instantiate()
    ids = tf.constant([[4, 5, 6, 7]])
    default = emb(CTX, ids).numpy()
    restarted = emb(CTX, ids, positions=tf.constant([[0, 1, 0, 1]])).numpy()
    np.testing.assert_allclose(restarted[:, 2:], emb(CTX, ids[:, 2:]).numpy(), rtol=1e-6)
    np.testing.assert_allclose(restarted[:, :2], default[:, :2], rtol=1e-6)
    assert np.abs(restarted[:, 2:] - default[:, 2:]).max() > 1e-3
    rows = (
        emb.token_emb.emb_matrix().numpy()[[4, 5]] * math.sqrt(DIM) + emb.position_emb.vars["emb"].numpy()[:2]
    )
    np.testing.assert_allclose(default[0, :2], rows, rtol=1e-5)


def test_encoder_ignores_padded_positions():
    enc = _encoder()
    rng = np.random.RandomState(0)
    x = rng.randn(2, 6, DIM).astype(np.float32)
    paddings = np.array([[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]], np.float32)
    noisy = x + 30.0 * rng.randn(2, 6, DIM).astype(np.float32) * paddings[:, :, None]
    a = enc(CTX, x, paddings=paddings).numpy()
    b = enc(CTX, noisy, paddings=paddings).numpy()
    np.testing.assert_allclose(a[0, :4], b[0, :4], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(a[1], b[1])


def test_decoder_ignores_the_future_and_padded_source():
    dec = _decoder()
    rng = np.random.RandomState(1)
    x = rng.randn(2, 5, DIM).astype(np.float32)
    src = rng.randn(2, 4, DIM).astype(np.float32)
    src_pad = np.array([[0, 0, 1, 1], [0, 0, 0, 0]], np.float32)
    base = dec(CTX, x, source=src, source_paddings=src_pad).numpy()
    future = x.copy()
    future[:, 3:] += 10.0
    noisy_src = src + 10.0 * src_pad[:, :, None]
    np.testing.assert_allclose(
        dec(CTX, future, source=src, source_paddings=src_pad).numpy()[:, :3],
        base[:, :3],
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        dec(CTX, x, source=noisy_src, source_paddings=src_pad).numpy(), base, rtol=1e-5, atol=1e-5
    )


def test_extend_step_matches_full_decoder():
    dec = _decoder(3)
    rng = np.random.RandomState(2)
    x = tf.constant(rng.randn(3, 6, DIM).astype(np.float32))
    src = tf.constant(rng.randn(3, 4, DIM).astype(np.float32))
    src_pad = tf.constant([[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]], tf.float32)
    full = dec(CTX, x, source=src, source_paddings=src_pad).numpy()
    cache = dec.init_cache(3, 6)
    kv = dec.project_source(src)
    for t in range(6):
        y, cache = dec.extend_step(CTX, x[:, t : t + 1], cache, t, kv, src_pad)
        np.testing.assert_allclose(y.numpy()[:, 0], full[:, t], rtol=1e-4, atol=1e-5)


def _decode_setup(batch: int = 3, vocab: int = 11):
    emb = TransformerInput.Params().set(name="emb", vocab_size=vocab, model_dim=DIM, random_seed=5)
    emb = emb.instantiate()
    dec = _decoder(2)
    rng = np.random.RandomState(3)
    src = tf.constant(rng.randn(batch, 4, DIM).astype(np.float32))
    src_pad = tf.constant([[0, 0, 0, 1], [0, 0, 0, 0], [0, 1, 1, 1]][:batch], tf.float32)
    # A random output layer (a tied one would mostly echo the input token of an untrained model).
    # EOS (id 2) is made unlikely so that hypotheses run for several steps.
    w_out = tf.constant(3.0 * rng.randn(DIM, vocab).astype(np.float32))
    eos_bias = tf.constant(-4.0 * np.eye(vocab, dtype=np.float32)[2])
    return emb, dec, src, src_pad, (lambda y: tf.matmul(y, w_out) + eos_bias)


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 3])
def test_cached_decoding_gives_the_tokens_of_full_prefix_decoding(beam_size):
    emb, dec, src, src_pad, logits_fn = _decode_setup()
    max_length = 7

    @tf.function(autograph=False)
    def run(use_cache: bool):
        s, sp = (src, src_pad) if beam_size == 1 else beam_search.tile_beams((src, src_pad), beam_size)
        if use_cache:
            step = cached_step_fn(CTX, emb, dec, logits_fn, s, sp)
            state = init_cached_state(dec, 3, max_length)
        else:
            step = full_prefix_step_fn(CTX, emb, dec, logits_fn, s, sp)
            state = init_full_prefix_state(3, max_length)
        if beam_size == 1:
            return beam_search.greedy_search(step, state, 3, max_length, 1, 2)
        return beam_search.beam_search(step, state, 3, beam_size, max_length, 1, 2)

    cached, full = run(True), run(False)
    np.testing.assert_array_equal(cached["ids"].numpy(), full["ids"].numpy())
    np.testing.assert_allclose(cached["scores"].numpy(), full["scores"].numpy(), rtol=1e-4, atol=1e-4)
    assert len(np.unique(cached["ids"].numpy())) > 2  # a real sequence, not one repeated token


def test_label_smoothed_xent_matches_formula_and_softmax_layer():
    rng = np.random.RandomState(4)
    logits = rng.randn(3, 5, 7).astype(np.float32)
    labels = rng.randint(0, 7, size=(3, 5))
    eps = 0.1
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = (1 - eps) * np.eye(7)[labels] + eps / 7
    want = -(target * log_probs).sum(-1)
    got = label_smoothed_xent(tf.constant(logits), tf.constant(labels), eps).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Same convention as layers.core.SoftmaxLayer.
    sm = SoftmaxLayer.Params().set(name="sm", input_dim=7, num_classes=7, label_smoothing=eps).instantiate()
    sm.vars["w"].assign(np.eye(7, dtype=np.float32))
    np.testing.assert_allclose(sm(CTX, logits, labels)["per_example_xent"].numpy(), want, rtol=1e-5)


def test_dropout_in_layers_is_reproducible_by_step():
    p = stack_params(1, DIM, 4, 32, dropout_prob=0.3).set(name="enc")
    enc = p.instantiate()
    x = np.random.RandomState(5).randn(2, 4, DIM).astype(np.float32)
    a, b, c = (enc(FPropContext(training=True, step=s), x).numpy() for s in (1, 1, 2))
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
    np.testing.assert_array_equal(enc(CTX, x).numpy(), enc(CTX, x).numpy())


def test_stack_is_a_plain_list_of_layer_params():
    p = stack_params(3, DIM, 4, decoder=True)
    assert p.get("layers[2].num_heads") == 4 and p.get("layers[0].causal") is True
    p.set(**{"layers[1].hidden_dim": 8, "name": "dec"})
    dec = p.instantiate()
    assert [layer.path for layer in dec.layers] == ["dec/layers_0", "dec/layers_1", "dec/layers_2"]
    assert dec.layers[1].ffn.fc1.vars["w"].shape == (DIM, 8)
    assert dec.layers[0].ffn.fc1.vars["w"].shape == (DIM, 4 * DIM)


def test_bad_settings_are_config_errors():
    with pytest.raises(ConfigError, match="model_dim=16"):
        TransformerStack.Params().set(
            name="s", model_dim=DIM, layers=[transformer_layer_params(8, 2)]
        ).instantiate()
    with pytest.raises(ConfigError, match="kind must be one of"):
        PositionalEmbedding.Params().set(name="p", embedding_dim=4, kind="rotary").instantiate()
    dec = _decoder(1)
    with pytest.raises(ConfigError, match="needs a source"):
        dec(CTX, np.zeros((1, 2, DIM), np.float32))


def _pipelined_decoder(num_layers: int = 2, **pipeline) -> TransformerStack:
    from layers.parallel.pipeline.gpipe import GPipeLayer

    p = stack_params(num_layers, DIM, 4, 32, decoder=True).set(name="dec", random_seed=3)
    p.pipeline = GPipeLayer.Params().set(name="pipeline", **pipeline)
    return p.instantiate()


@pytest.mark.parametrize("training", [True, False])
def test_stack_pipeline_param_runs_the_same_layers_as_a_pipeline(training):
    """``params.pipeline`` cuts the stack into stages on two devices (its list of layer Params goes
    into a GPipeLayer as is, the dict-state form, source paddings included): outputs and gradients
    equal the plain stack's, and cached decoding runs the same (pipelined) layers."""
    plain = _decoder(2)
    piped = _pipelined_decoder(2, num_stages=2, num_micro_batches=2, remat="always")
    assert [x.params.name for x in piped.sequence] == ["layers_0", "layers_1"]
    assert piped.pipeline.devices == ["/device:CPU:0", "/device:CPU:1"]
    for a, b in zip(plain.layers, piped.sequence):
        for va, vb in zip(a.trainable_variables, b.trainable_variables):
            vb.assign(va)
    for va, vb in zip(plain.final_ln.trainable_variables, piped.final_ln.trainable_variables):
        vb.assign(va)
    assert len(piped.trainable_variables) == len(plain.trainable_variables)
    rng = np.random.RandomState(8)
    x = tf.constant(rng.randn(4, 5, DIM).astype(np.float32))
    src = tf.constant(rng.randn(4, 3, DIM).astype(np.float32))
    pad = tf.constant([[0, 0, 0, 1, 1], [0] * 5, [0, 0, 1, 1, 1], [0] * 5], tf.float32)
    src_pad = tf.constant([[0, 0, 1], [0, 0, 0], [0, 1, 1], [0, 0, 0]], tf.float32)
    ctx = FPropContext(training=training, step=2)

    @tf.function(autograph=False)
    def run(stack):
        with tf.GradientTape() as tape:
            y = stack(ctx, x, paddings=pad, source=src, source_paddings=src_pad)
            loss = tf.reduce_sum(tf.square(y) * (1.0 - pad)[:, :, None])
        return y, tape.gradient(loss, stack.trainable_variables)

    want_y, want_g = run(plain)
    got_y, got_g = run(piped)
    np.testing.assert_allclose(got_y.numpy(), want_y.numpy(), rtol=1e-5, atol=1e-5)
    for g_a, g_b in zip(want_g, got_g):
        np.testing.assert_allclose(
            tf.convert_to_tensor(g_b).numpy(), tf.convert_to_tensor(g_a).numpy(), rtol=1e-4, atol=1e-5
        )
    cache = piped.init_cache(4, 5)
    kv = piped.project_source(src)
    step_y, _ = piped.extend_step(ctx, x[:, :1], cache, 0, kv)
    want_step, _ = plain.extend_step(ctx, x[:, :1], plain.init_cache(4, 5), 0, plain.project_source(src))
    np.testing.assert_allclose(step_y.numpy(), want_step.numpy(), rtol=1e-5, atol=1e-5)


def test_stack_pipeline_param_errors():
    from layers.parallel.pipeline.gpipe import GPipeLayer

    p = stack_params(2, DIM, 4, 32, decoder=True).set(name="dec")
    with pytest.raises(ConfigError, match="must be None or GPipeLayer.Params"):
        p.copy().set(pipeline=TransformerStack.Params()).instantiate()
    template = GPipeLayer.Params().set(name="pipeline", layers=[transformer_layer_params(DIM, 4)])
    with pytest.raises(ConfigError, match="leave params.pipeline.layers and .stages empty"):
        p.copy().set(pipeline=template).instantiate()
    with pytest.raises(ConfigError, match="num_stages=3 but there are only 2 layers"):
        p.copy().set(pipeline=GPipeLayer.Params().set(name="pipeline", num_stages=3)).instantiate()
