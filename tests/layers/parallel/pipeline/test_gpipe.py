"""GPipeLayer is transparent: for any K stages, M micro-batches and remat policy, training gives the
same loss, gradients and weights as the same layers run sequentially, dropout included; batch-norm
moving statistics come out as the full batch's; re-materialization recomputes what it should."""

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import BaseLayer, FPropContext
from layers.parallel.pipeline import gpipe
from tests.layers.parallel.pipeline.gpipe_training import (
    BATCH,
    BN_TOL,
    FAST,
    IN_DIM,
    OUT_DIM,
    PAIRWISE,
    TOL,
    assert_same_training,
    data,
    micro_batched_forward,
    mlp,
    pipeline,
    pipelined_forward,
    reference,
    sequential,
    train,
)


@pytest.mark.parametrize("k, m, remat", FAST)
def test_training_with_dropout_and_batch_norm_equals_sequential(k, m, remat):
    """10 SGD steps with dropout and two batch-norm layers (moving statistics compared too): equal to
    the unpipelined model at M=1, to the micro-batched sequential model otherwise."""
    pipe = pipeline(mlp(batch_norm=True), num_stages=k, num_micro_batches=m, remat=remat)
    assert_same_training(train(pipe, pipelined_forward), reference(m, batch_norm=True), BN_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("k, m, remat", [c for c in PAIRWISE if c not in FAST])
def test_training_equals_sequential_full_sweep(k, m, remat):
    pipe = pipeline(mlp(batch_norm=True), num_stages=k, num_micro_batches=m, remat=remat)
    assert_same_training(train(pipe, pipelined_forward), reference(m, batch_norm=True), BN_TOL)


@pytest.mark.parametrize("k, m, remat", [(2, 4, "always"), (4, 8, "never"), (2, 2, "except_last")])
def test_without_dropout_or_batch_norm_equals_the_unpipelined_model(k, m, remat):
    """Nothing keyed by micro-batch: the pipeline equals the plain model on the whole batch at once."""
    pipe = pipeline(mlp(dropout=False), num_stages=k, num_micro_batches=m, remat=remat)
    assert_same_training(train(pipe, pipelined_forward), reference(1, dropout=False))


def test_dropout_is_keyed_by_micro_batch():
    """Different micro-batches draw different masks (so M changes the masks, as documented)."""
    layers = [core.DropoutLayer.Params().set(name="drop", keep_prob=0.5)] * 1
    pipe = pipeline(layers, num_micro_batches=2, remat="never")
    ctx = FPropContext(training=True, step=3)
    y = pipe(ctx, tf.ones([4, 64])).numpy()
    assert not np.array_equal(y[:2] == 0, y[2:] == 0)


def test_stages_params_train_like_the_same_stages_run_sequentially():
    layers = mlp()
    stages = [
        core.SequentialLayer.Params().set(name="s0", sub=layers[:4]),
        core.SequentialLayer.Params().set(name="s1", sub=layers[4:]),
    ]
    p = gpipe.GPipeLayer.Params().set(name="net", stages=stages, num_micro_batches=2, remat="except_last")
    pipe = p.instantiate()
    assert pipe.num_stages == 2 and pipe.devices == ["/device:CPU:0", "/device:CPU:1"]
    want = train(sequential(stages), micro_batched_forward(2))
    assert_same_training(train(pipe, pipelined_forward), want)


def test_micro_batch_size_sets_the_number_of_micro_batches():
    pipe = pipeline(mlp(), num_stages=2, num_micro_batches=1, micro_batch_size=2)
    assert_same_training(train(pipe, pipelined_forward, steps=10), reference(4))


# --------------------------------------------------------------------------------- placement
def test_stages_and_their_weights_sit_on_their_devices():
    pipe = pipeline(mlp(), num_stages=4)
    assert pipe.devices == [f"/device:CPU:{k}" for k in range(4)]
    assert pipe.stage_bounds == [0, 2, 4, 6, 7]
    for k in range(4):
        for layer in pipe.stage_layers(k):
            for v in layer.variables:
                assert v.device.endswith(f"device:CPU:{k}"), (layer.path, v.device)


def test_explicit_devices_are_used():
    pipe = pipeline(mlp(), num_stages=2, devices=["/device:CPU:3", "/device:CPU:1"])
    assert pipe.devices == ["/device:CPU:3", "/device:CPU:1"]
    assert pipe.stage_layers(0)[0].vars["w"].device.endswith("CPU:3")


def test_one_stage_keeps_the_callers_device():
    pipe = pipeline(mlp(), num_stages=1)
    assert pipe.devices == [None]


# ------------------------------------------------------------------------------------ remat
class _CountingLayer(BaseLayer):
    """Doubles its input and notes the ctx's record_updates flag each time its forward is traced."""

    def __init__(self, params, parent=None):
        super().__init__(params, parent)
        self.record_flags = []

    def fprop(self, ctx, x):
        self.record_flags.append(ctx.record_updates)
        return 2.0 * x


@pytest.mark.parametrize("remat, forwards", [("always", 8), ("except_last", 7), ("never", 4)])
def test_remat_policy_decides_which_micro_batches_are_recomputed(remat, forwards):
    layers = [mlp(dropout=False)[0], _CountingLayer.Params().set(name="count")]
    pipe = pipeline(layers, num_stages=2, num_micro_batches=4, remat=remat)
    counting = pipe.stage_layers(1)[0]
    x, _ = data()

    @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
    def step():
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pipe(ctx, x))
        return tape.gradient(loss, pipe.trainable_variables)

    step.get_concrete_function()
    flags = counting.record_flags
    assert len(flags) == forwards
    # The first forward of each micro-batch records updates; recomputes never do.
    assert flags.count(True) == 4
    assert flags.count(False) == forwards - 4


def test_recompute_reuses_the_dropout_masks():
    """With remat the gradient is computed from a recomputed forward; equal gradients to the
    never-remat pipeline mean the recompute drew the same masks (and the keep_prob is low enough
    that a different mask would show)."""
    x, _ = data()
    layers = [mlp()[0], core.DropoutLayer.Params().set(name="drop", keep_prob=0.5), mlp()[2]]
    results = []
    for remat in ("always", "never"):
        pipe = pipeline(layers, num_stages=2, num_micro_batches=2, remat=remat)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(pipe(FPropContext(training=True, step=5), x)))
        results.append([g.numpy() for g in tape.gradient(loss, pipe.trainable_variables)])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, atol=TOL)


# --------------------------------------------------------------------------------- batch norm
def _bn_layers():
    return [
        core.ProjectionLayer.Params().set(name="fc0", input_dim=IN_DIM, output_dim=4),
        core.BatchNormLayer.Params().set(name="bn", dim=4, decay=0.5),
        core.ProjectionLayer.Params().set(name="fc1", input_dim=4, output_dim=OUT_DIM),
    ]


def _drifting_data():
    """Micro-batch means differ (a drift along the batch), so merging variances directly would fail."""
    x, t = data()
    drift = tf.linspace(-3.0, 3.0, BATCH)[:, None]
    return x + drift, t


@pytest.mark.parametrize("remat", ["always", "never"])
def test_deferred_batch_norm_moving_statistics_equal_the_full_batch(remat):
    x, target = _drifting_data()
    pipe = pipeline(_bn_layers(), num_stages=2, num_micro_batches=4, remat=remat)
    plain = sequential(_bn_layers())
    for model in (pipe, plain):

        @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
        def step(model=model):
            ctx = FPropContext(training=True)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(ctx, x) - target))
            grads = tape.gradient(loss, model.trainable_variables)
            for v, g in zip(model.trainable_variables, grads):
                v.assign_sub(0.01 * g)
            recorded = len(ctx.updates)
            ctx.apply_updates()
            return recorded

        recorded = step()
        assert recorded == (4 if model is pipe else 1)  # once per micro-batch, never in a recompute
    bn_pipe, bn_plain = pipe.stage_layers(0)[1], plain.bn
    for name in ("moving_mean", "moving_variance"):
        got, want = bn_pipe.vars[name].numpy(), bn_plain.vars[name].numpy()
        assert np.max(np.abs(got - want)) <= TOL, name
    # The statistics did move away from their initial values.
    assert np.max(np.abs(bn_plain.vars["moving_mean"].numpy())) > 0.1


def test_eval_uses_moving_statistics_and_equals_sequential():
    x, _ = _drifting_data()
    pipe = pipeline(_bn_layers(), num_stages=2, num_micro_batches=4)
    plain = sequential(_bn_layers())
    for bn in (pipe.stage_layers(0)[1], plain.bn):
        bn.vars["moving_mean"].assign([0.5, -0.5, 1.0, 0.0])
        bn.vars["moving_variance"].assign([2.0, 1.0, 0.5, 3.0])
    ctx = FPropContext(training=False)
    np.testing.assert_allclose(pipe(ctx, x).numpy(), plain(ctx, x).numpy(), atol=TOL)
    assert ctx.updates == []


# ---------------------------------------------------------------------------------------- eval
def test_eval_accepts_any_batch_size_and_an_unknown_batch_dimension():
    pipe = pipeline(mlp(), num_stages=2, num_micro_batches=4)
    plain = sequential(mlp())
    x, _ = data(batch=6)  # 6 is not a multiple of 4: eval splits into near-equal parts

    @tf.function(input_signature=[tf.TensorSpec([None, IN_DIM])], autograph=False)
    def evaluate(x):
        return pipe(FPropContext(training=False), x)

    want = plain(FPropContext(training=False), x).numpy()
    np.testing.assert_allclose(evaluate(x).numpy(), want, atol=TOL)
    np.testing.assert_allclose(pipe(FPropContext(training=False), x).numpy(), want, atol=TOL)


def test_nested_inputs_are_split_and_joined():
    """A dict input: every leaf is split along the batch and the output dict is re-joined."""

    class _Scale(BaseLayer):
        def fprop(self, ctx, x):
            return {"a": x["a"] * 2.0, "b": x["b"] + 1.0}

    layers = [_Scale.Params().set(name="s0"), _Scale.Params().set(name="s1")]
    pipe = pipeline(layers, num_stages=2, num_micro_batches=2)
    a = tf.reshape(tf.range(8.0), [4, 2])
    b = tf.zeros([4, 3])
    with tf.GradientTape() as tape:
        tape.watch(a)
        out = pipe(FPropContext(training=True), {"a": a, "b": b})
        loss = tf.reduce_sum(out["a"])
    np.testing.assert_allclose(out["a"].numpy(), a.numpy() * 4.0)
    np.testing.assert_allclose(out["b"].numpy(), np.full([4, 3], 2.0))
    np.testing.assert_allclose(tape.gradient(loss, a).numpy(), np.full([4, 2], 4.0))


# -------------------------------------------------------------------------------------- report
def test_partition_report_names_stages_devices_layers_and_costs():
    pipe = pipeline(mlp(), num_stages=2, input_shape=[None, IN_DIM])
    report = pipe.partition_report()
    lines = report.splitlines()
    assert lines[0].startswith("GPipe net: 7 layers in 2 stages")
    assert "/device:CPU:0" in lines[2] and "fc0,drop0,fc1,drop1" in lines[2]
    assert "/device:CPU:1" in lines[3] and "fc2,drop2,fc3" in lines[3]
    assert "param_bytes" in lines[1] and "flops" in lines[1]
    # fc0 (6x5 + 5) and fc1 (5x5 + 5) = 65 parameters in stage 0.
    assert " 65 " in lines[2]


def test_partition_reports_collects_every_pipeline_in_a_tree():
    class _Model(BaseLayer):
        def __init__(self, params, parent=None):
            super().__init__(params, parent)
            pipe = gpipe.GPipeLayer.Params().set(layers=mlp(), num_stages=2)
            self.create_children("towers", [pipe, pipe])

    model = _Model.Params().set(name="model").instantiate()
    text = gpipe.partition_reports(model)
    assert text.count("GPipe model/towers_") == 2


class _SquaredError(BaseLayer):
    """Per-example squared error of a dict state's 'x' against its 'target'."""

    def fprop(self, ctx, state):
        return tf.reduce_sum(tf.square(state["x"] - state["target"]), axis=-1)


def test_targets_travel_with_micro_batches_and_the_loss_runs_in_the_last_stage():
    """Layers wrapped in OnKeyLayer carry the targets through the stages, and a per-example loss as
    the last layer gives the unpipelined loss and gradients."""
    from layers.containers import OnKeyLayer, SequentialLayer

    layers = [
        OnKeyLayer.Params().set(name=f"l{i}", body=core.ProjectionLayer.Params().set(
            input_dim=6, output_dim=6, activation="tanh"))
        for i in range(4)
    ] + [_SquaredError.Params().set(name="loss")]  # fmt: skip
    plain = SequentialLayer.Params().set(name="net", sub=layers).instantiate()
    piped = (
        gpipe.GPipeLayer.Params()
        .set(name="net", layers=layers, split_points=[2], num_micro_batches=4, remat="always")
        .instantiate()
    )
    rng = np.random.default_rng(3)
    x, target = rng.normal(size=(2, 8, 6)).astype(np.float32)
    state = {"x": x, "target": target}
    ctx = FPropContext(training=True, step=1)

    @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
    def loss_and_grads(model):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(ctx, state))
        return loss, tape.gradient(loss, model.trainable_variables)

    want_loss, want_grads = loss_and_grads(plain)
    got_loss, got_grads = loss_and_grads(piped)
    assert piped.stage_bounds == [0, 2, 5]
    np.testing.assert_allclose(got_loss.numpy(), want_loss.numpy(), rtol=1e-6)
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------- losses using some micro-batches
class _StopGradientFor(BaseLayer):
    """Passes its input on, but blocks its gradient for one micro-batch (a loss that uses only some
    of the pipeline's micro-batches, as far as the earlier stages can tell)."""

    def fprop(self, ctx, x):
        return tf.stop_gradient(x) if ctx.micro_batch == self.params.micro_batch else x

    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("micro_batch", 0, "The micro-batch whose gradient is blocked.")
        return p


@pytest.mark.parametrize("remat", ["always", "never"])
@pytest.mark.parametrize("blocked", [0, 1, 3])
def test_a_loss_without_some_micro_batches_keeps_the_others_weight_gradients(remat, blocked):
    """Stage 0 gets no gradient for one micro-batch: its weight gradients are the other three
    micro-batches' (they used to vanish without an error)."""
    layers = mlp(dropout=False, depth=2)
    layers.insert(1, _StopGradientFor.Params().set(name="stop", micro_batch=blocked))
    pipe = pipeline(layers, num_stages=2, split_points=[1], num_micro_batches=4, remat=remat)
    plain = sequential(layers)
    x, _ = data()

    def grads(model, forward):
        @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
        def run():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(forward(model, FPropContext(training=True), x)))
            return tape.gradient(loss, model.trainable_variables)

        return [g.numpy() for g in run()]

    got, want = grads(pipe, pipelined_forward), grads(plain, micro_batched_forward(4))
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=TOL)
    assert np.max(np.abs(got[0])) > 0.01  # stage 0's weights do learn from the other micro-batches
