"""LayerNorm and BatchNormLayer: math against NumPy, train vs eval, and moving statistics that equal
the full batch's when the batch is fed as micro-batches and the updates are merged."""

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from params.errors import ConfigError

EVAL = FPropContext(training=False)


def _batch_norm(dim=3, decay=0.9, epsilon=1e-3, **kwargs):
    p = core.BatchNormLayer.Params().set(name="bn", dim=dim, decay=decay, epsilon=epsilon, **kwargs)
    return p.instantiate()


def _data(shape, seed=0):
    """Channels with different means and scales, plus a drift along the batch so micro-batch means differ."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * np.array([1.0, 2.0, 0.5]) + np.array([0.0, 3.0, -1.0])
    drift = np.linspace(-2.0, 2.0, shape[0]).reshape([-1] + [1] * (len(shape) - 1))
    return (x + drift).astype(np.float32)


# ------------------------------------------------------------------------------------ LayerNorm
def test_layer_norm_matches_numpy():
    layer = core.LayerNorm.Params().set(name="ln", input_dim=4).instantiate()
    layer.vars["scale"].assign([1.0, 2.0, 0.5, -1.0])
    layer.vars["bias"].assign([0.0, 0.1, -0.2, 0.3])
    x = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32) * 3 + 1
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    want = (x - mean) / np.sqrt(var + 1e-6) * layer.vars["scale"].numpy() + layer.vars["bias"].numpy()
    np.testing.assert_allclose(layer(EVAL, x).numpy(), want, rtol=1e-4, atol=1e-5)


def test_layer_norm_wrong_width():
    layer = core.LayerNorm.Params().set(name="ln", input_dim=4).instantiate()
    with pytest.raises(ConfigError, match="ln: input last dimension is 3, expected input_dim=4"):
        layer(EVAL, tf.zeros([2, 3]))


# ------------------------------------------------------------------------------------ BatchNorm
def test_batch_norm_training_uses_batch_statistics():
    bn = _batch_norm()
    bn.vars["gamma"].assign([1.0, 2.0, 0.5])
    bn.vars["beta"].assign([0.0, -1.0, 1.0])
    x = _data((4, 5, 5, 3))
    ctx = FPropContext(training=True)
    got = bn(ctx, x).numpy()
    mean, var = x.mean((0, 1, 2)), x.var((0, 1, 2))
    want = (x - mean) / np.sqrt(var + 1e-3) * [1.0, 2.0, 0.5] + [0.0, -1.0, 1.0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(ctx.updates) == 1


def test_batch_norm_eval_uses_moving_statistics_and_records_nothing():
    bn = _batch_norm()
    bn.vars["moving_mean"].assign([1.0, -1.0, 0.0])
    bn.vars["moving_variance"].assign([4.0, 1.0, 0.25])
    x = _data((6, 3))
    ctx = FPropContext(training=False)
    want = (x - [1.0, -1.0, 0.0]) / np.sqrt(np.array([4.0, 1.0, 0.25]) + 1e-3)
    np.testing.assert_allclose(bn(ctx, x).numpy(), want, rtol=1e-5, atol=1e-5)
    assert ctx.updates == []


def test_batch_norm_moving_statistics_are_non_trainable():
    bn = _batch_norm()
    assert sorted(v.name for v in bn.trainable_variables) == ["bn.beta:0", "bn.gamma:0"]
    assert len(bn.variables) == 4


def test_one_update_moves_statistics_by_decay():
    bn = _batch_norm(decay=0.9)
    x = _data((8, 3))
    ctx = FPropContext(training=True)
    bn(ctx, x)
    ctx.apply_updates()
    np.testing.assert_allclose(bn.vars["moving_mean"].numpy(), 0.1 * x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.vars["moving_variance"].numpy(), 0.9 + 0.1 * x.var(0), rtol=1e-5)
    assert ctx.updates == []


@pytest.mark.parametrize("num_micro_batches", [2, 4])
def test_micro_batch_updates_equal_full_batch_moments(num_micro_batches):
    x = _data((8, 3, 3, 3), seed=num_micro_batches)
    full, split = _batch_norm(decay=0.0), _batch_norm(decay=0.0)  # decay 0: moving = merged moments
    ctx = FPropContext(training=True)
    full(ctx, x)
    ctx.apply_updates()
    ctx = FPropContext(training=True)
    chunks = np.split(x, num_micro_batches)
    for i, chunk in enumerate(chunks):
        split(ctx.for_micro_batch(i), chunk)
    assert len(ctx.updates) == num_micro_batches
    ctx.apply_updates()
    axes = (0, 1, 2)
    for layer in (full, split):
        np.testing.assert_allclose(layer.vars["moving_mean"].numpy(), x.mean(axes), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(layer.vars["moving_variance"].numpy(), x.var(axes), rtol=1e-4)
    # The drift makes averaging the micro-batch variances wrong, so the check above can fail.
    naive = np.mean([c.var(axes) for c in chunks], axis=0)
    assert np.abs(naive - x.var(axes)).min() > 0.05


def test_recompute_without_record_updates_changes_nothing():
    bn = _batch_norm()
    ctx = FPropContext(training=True, record_updates=False)
    bn(ctx, _data((4, 3)))
    ctx.apply_updates()
    np.testing.assert_array_equal(bn.vars["moving_mean"].numpy(), np.zeros(3))


def test_update_inside_tf_function_matches_eager():
    x = _data((6, 4, 3))
    eager, compiled = _batch_norm(), _batch_norm()

    def step(layer, inputs):
        ctx = FPropContext(training=True)
        y = layer(ctx, inputs)
        ctx.apply_updates()
        return y

    want = step(eager, x)
    got = tf.function(lambda inputs: step(compiled, inputs))(tf.constant(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_allclose(compiled.vars[name].numpy(), eager.vars[name].numpy(), rtol=1e-6)
    assert not np.allclose(compiled.vars["moving_mean"].numpy(), 0.0)


def test_moving_statistics_survive_a_checkpoint(tmp_path):
    bn = _batch_norm()
    ctx = FPropContext(training=True)
    bn(ctx, _data((5, 3)))
    ctx.apply_updates()
    path = tf.train.Checkpoint(model=bn).write(str(tmp_path / "ckpt"))
    restored = _batch_norm()
    tf.train.Checkpoint(model=restored).read(path).assert_consumed()
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_array_equal(restored.vars[name].numpy(), bn.vars[name].numpy())


def test_bfloat16_batch_norm_keeps_float32_statistics():
    bn = _batch_norm(dtype=tf.bfloat16)
    ctx = FPropContext(training=True)
    y = bn(ctx, _data((8, 3)))
    ctx.apply_updates()
    assert y.dtype == tf.bfloat16 and bn.vars["moving_mean"].dtype == tf.float32
    assert bn.vars["gamma"].dtype == tf.bfloat16


@pytest.mark.parametrize("decay", [1.0, -0.1])
def test_batch_norm_rejects_bad_decay(decay):
    with pytest.raises(ConfigError, match=r"bn: params.decay must be a number in \[0.0, 1.0\)"):
        _batch_norm(decay=decay)


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_sync_batch_norm_on_two_replicas_equals_one_batch(offset):
    """Two in-sync replicas (two logical CPUs), half the batch each, normalize by the whole batch's
    moments and get its gradients (against one float64 layer on the whole batch). With an offset of
    1000 the sums must be shifted by the moving mean: E[x^2] - E[x]^2 of the raw values would lose the
    variance to float32 rounding (outputs off by about 1e-2)."""
    x = _data((8, 3, 3, 3)) + offset
    weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
    # Reduced through one device, not with collective ops: the process's collective group keys are
    # shared, and a two-device group here clashes with the four-device DTensor meshes of other tests
    # in this pytest process ("joining a group that is already full"), poisoning every collective after.
    one_device = tf.distribute.ReductionToOneDevice("/cpu:0")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=one_device)
    with strategy.scope():
        synced = _batch_norm()
    single = _batch_norm(dtype=tf.float64)
    for layer in (synced, single):
        layer.vars["gamma"].assign([1.0, 2.0, 0.5])
        layer.vars["moving_mean"].assign([offset + 0.5] * 3)  # as after some training

    def loss_and_grads(layer, inputs, outputs_weights):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            y = layer(FPropContext(training=True), inputs)
            loss = tf.reduce_sum(y * outputs_weights)
        return (y, *tape.gradient(loss, [inputs, layer.vars["gamma"], layer.vars["beta"]]))

    halves = [np.split(a, 2) for a in (x, weights)]
    distribute = strategy.experimental_distribute_values_from_function
    shards = [distribute(lambda ctx, h=h: h[ctx.replica_id_in_sync_group]) for h in halves]
    per_replica = tf.function(lambda a, b: strategy.run(lambda u, v: loss_and_grads(synced, u, v), (a, b)))
    got = per_replica(*shards)
    want = loss_and_grads(single, tf.constant(x, tf.float64), tf.constant(weights, tf.float64))
    local = [strategy.experimental_local_results(t) for t in got]
    for i in range(2):  # the outputs and input gradients of each half
        np.testing.assert_allclose(local[0][i], np.split(want[0], 2)[i], atol=1e-4)
        np.testing.assert_allclose(local[1][i], np.split(want[1], 2)[i], atol=1e-4)
    for k in (2, 3):  # gamma and beta: the replicas' gradients add up to the whole batch's
        np.testing.assert_allclose(local[k][0] + local[k][1], want[k], rtol=1e-5, atol=1e-4)
