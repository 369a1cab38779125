"""GPipeLayer is transparent: for any K stages, M micro-batches and remat policy, training gives the
same loss, gradients and weights as the same layers run sequentially, dropout included; batch-norm
moving statistics come out as the full batch's; re-materialization recomputes what it should."""

import functools

import numpy as np
import pytest
import tensorflow as tf

from layers import core, gpipe
from layers.base_layer import BaseLayer, FPropContext
from params.hyperparams import InstantiableParams

BATCH, IN_DIM, OUT_DIM = 8, 6, 3
TOL = 1e-5
# Batch norm over micro-batches of 2 examples divides by tiny variances, which amplifies float32
# rounding (a different summation order) over 10 steps to a few 1e-5 (2.4e-4 on one weight at K=4, M=4,
# remat always); the first steps agree to 1e-6.
BN_TOL = 5e-4


def _mlp(dropout: bool = True, depth: int = 4, batch_norm: bool = False) -> list[InstantiableParams]:
    """A tiny MLP: projections (tanh) with dropout between them, so every K in {1, 2, 4} can cut it.
    With ``batch_norm``, batch norm follows fc0 and fc2: the second one's input depends on the first's
    per-micro-batch normalization."""
    dims = [IN_DIM] + [5] * (depth - 1) + [OUT_DIM]
    layers = []
    for i in range(depth):
        act = "tanh" if i < depth - 1 else "none"
        layers.append(
            core.ProjectionLayer.Params().set(
                name=f"fc{i}", input_dim=dims[i], output_dim=dims[i + 1], activation=act
            )
        )
        if batch_norm and i in (0, 2) and i < depth - 1:
            layers.append(core.BatchNormLayer.Params().set(name=f"bn{i}", dim=5, decay=0.5))
        if dropout and i < depth - 1:
            layers.append(core.DropoutLayer.Params().set(name=f"drop{i}", keep_prob=0.75))
    return layers


def _pipeline(layers, num_stages=1, num_micro_batches=1, remat="always", **kwargs) -> gpipe.GPipeLayer:
    p = gpipe.GPipeLayer.Params().set(
        name="net",
        layers=layers,
        num_stages=num_stages,
        num_micro_batches=num_micro_batches,
        remat=remat,
        **kwargs,
    )
    return p.instantiate()


def _sequential(layers) -> BaseLayer:
    # Same root name and child names as the pipeline: same variable paths, so the same initial weights.
    return core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()


def _data(seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, IN_DIM)).astype(np.float32)
    y = rng.normal(size=(batch, OUT_DIM)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def _train(model, forward, steps=10, lr=0.1, loss_fn=None):
    """SGD on a squared loss; returns (losses, first-step gradients, final weights) as NumPy.
    ``loss_fn(model, ctx, x, target)``, if given, computes the loss instead of ``forward``."""
    x, target = _data()
    variables = model.trainable_variables

    @tf.function
    def step(i):
        ctx = FPropContext(training=True, step=i, seed=7)
        with tf.GradientTape() as tape:
            if loss_fn is not None:
                loss = loss_fn(model, ctx, x, target)
            else:
                loss = tf.reduce_mean(tf.square(forward(model, ctx, x) - target))
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(lr * g)
        ctx.apply_updates()
        return loss, grads

    losses, first_grads = [], None
    for i in range(steps):
        loss, grads = step(tf.constant(i))
        losses.append(loss.numpy())
        if first_grads is None:  # by name: layers' variable order differs between containers
            first_grads = {v.name: g.numpy() for v, g in zip(variables, grads)}
    weights = {v.name: v.numpy() for v in model.variables}
    return np.array(losses), first_grads, weights


def _pipelined_forward(model, ctx, x):
    return model(ctx, x)


def _micro_batched_forward(num_micro_batches):
    """The sequential model run micro-batch by micro-batch with the pipeline's randomness keys."""

    def forward(model, ctx, x):
        parts = tf.split(x, num_micro_batches)
        return tf.concat([model(ctx.for_micro_batch(m), xm) for m, xm in enumerate(parts)], 0)

    return forward


def _unpipelined_forward(model, ctx, x):
    return model(ctx, x)


@functools.cache
def _reference(num_micro_batches: int, dropout: bool = True, batch_norm: bool = False):
    """The sequential model trained on the whole batch where that is what the pipeline computes
    exactly (one micro-batch; or no batch norm and no dropout, whose masks are keyed by micro-batch),
    else micro-batch by micro-batch with the pipeline's randomness keys and batch-norm statistics."""
    model = _sequential(_mlp(dropout, batch_norm=batch_norm))
    if num_micro_batches == 1 or not (dropout or batch_norm):
        return _train(model, _unpipelined_forward)
    return _train(model, _micro_batched_forward(num_micro_batches))


def _assert_same_training(got, want, tol=TOL):
    losses, grads, weights = got
    want_losses, want_grads, want_weights = want
    assert np.max(np.abs(losses - want_losses)) <= tol, (losses, want_losses)
    assert sorted(grads) == sorted(want_grads)
    for name, g in grads.items():
        assert np.max(np.abs(g - want_grads[name])) <= tol, name
    assert sorted(weights) == sorted(want_weights)
    for name, value in weights.items():
        assert np.max(np.abs(value - want_weights[name])) <= tol, name
    # The run must have learned something, or equality would prove little.
    assert losses[-1] < losses[0]


# A covering subset of K x M x remat (each value of each factor at least once); the full product is slow.
FAST = [(1, 1, "never"), (2, 4, "always"), (4, 8, "except_last"), (2, 2, "never"), (4, 1, "always")]
ALL = [(k, m, r) for k in (1, 2, 4) for m in (1, 2, 4, 8) for r in gpipe.REMAT_POLICIES]


@pytest.mark.parametrize("k, m, remat", FAST)
def test_training_with_dropout_and_batch_norm_equals_sequential(k, m, remat):
    """10 SGD steps with dropout and two batch-norm layers (moving statistics compared too): equal to
    the unpipelined model at M=1, to the micro-batched sequential model otherwise."""
    pipe = _pipeline(_mlp(batch_norm=True), num_stages=k, num_micro_batches=m, remat=remat)
    _assert_same_training(_train(pipe, _pipelined_forward), _reference(m, batch_norm=True), BN_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("k, m, remat", [c for c in ALL if c not in FAST])
def test_training_equals_sequential_full_sweep(k, m, remat):
    pipe = _pipeline(_mlp(batch_norm=True), num_stages=k, num_micro_batches=m, remat=remat)
    _assert_same_training(_train(pipe, _pipelined_forward), _reference(m, batch_norm=True), BN_TOL)


@pytest.mark.parametrize("k, m, remat", [(2, 4, "always"), (4, 8, "never"), (2, 2, "except_last")])
def test_without_dropout_or_batch_norm_equals_the_unpipelined_model(k, m, remat):
    """Nothing keyed by micro-batch: the pipeline equals the plain model on the whole batch at once."""
    pipe = _pipeline(_mlp(dropout=False), num_stages=k, num_micro_batches=m, remat=remat)
    _assert_same_training(_train(pipe, _pipelined_forward), _reference(1, dropout=False))


def test_dropout_is_keyed_by_micro_batch():
    """Different micro-batches draw different masks (so M changes the masks, as documented)."""
    layers = [core.DropoutLayer.Params().set(name="drop", keep_prob=0.5)] * 1
    pipe = _pipeline(layers, num_micro_batches=2, remat="never")
    ctx = FPropContext(training=True, step=3)
    y = pipe(ctx, tf.ones([4, 64])).numpy()
    assert not np.array_equal(y[:2] == 0, y[2:] == 0)


def test_stages_params_train_like_the_same_stages_run_sequentially():
    layers = _mlp()
    stages = [
        core.SequentialLayer.Params().set(name="s0", sub=layers[:4]),
        core.SequentialLayer.Params().set(name="s1", sub=layers[4:]),
    ]
    p = gpipe.GPipeLayer.Params().set(name="net", stages=stages, num_micro_batches=2, remat="except_last")
    pipe = p.instantiate()
    assert pipe.num_stages == 2 and pipe.devices == ["/device:CPU:0", "/device:CPU:1"]
    want = _train(_sequential(stages), _micro_batched_forward(2))
    _assert_same_training(_train(pipe, _pipelined_forward), want)


def test_micro_batch_size_sets_the_number_of_micro_batches():
    pipe = _pipeline(_mlp(), num_stages=2, num_micro_batches=1, micro_batch_size=2)
    _assert_same_training(_train(pipe, _pipelined_forward, steps=10), _reference(4))


# --------------------------------------------------------------------------------- placement
def test_stages_and_their_weights_sit_on_their_devices():
    pipe = _pipeline(_mlp(), num_stages=4)
    assert pipe.devices == [f"/device:CPU:{k}" for k in range(4)]
    assert pipe.stage_bounds == [0, 2, 4, 6, 7]
    for k in range(4):
        for layer in pipe.stage_layers(k):
            for v in layer.variables:
                assert v.device.endswith(f"device:CPU:{k}"), (layer.path, v.device)


def test_explicit_devices_are_used():
    pipe = _pipeline(_mlp(), num_stages=2, devices=["/device:CPU:3", "/device:CPU:1"])
    assert pipe.devices == ["/device:CPU:3", "/device:CPU:1"]
    assert pipe.stage_layers(0)[0].vars["w"].device.endswith("CPU:3")


def test_one_stage_keeps_the_callers_device():
    pipe = _pipeline(_mlp(), num_stages=1)
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
    layers = [_mlp(dropout=False)[0], _CountingLayer.Params().set(name="count")]
    pipe = _pipeline(layers, num_stages=2, num_micro_batches=4, remat=remat)
    counting = pipe.stage_layers(1)[0]
    x, _ = _data()

    @tf.function
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
    x, _ = _data()
    layers = [_mlp()[0], core.DropoutLayer.Params().set(name="drop", keep_prob=0.5), _mlp()[2]]
    results = []
    for remat in ("always", "never"):
        pipe = _pipeline(layers, num_stages=2, num_micro_batches=2, remat=remat)
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
    x, t = _data()
    drift = tf.linspace(-3.0, 3.0, BATCH)[:, None]
    return x + drift, t


@pytest.mark.parametrize("remat", ["always", "never"])
def test_deferred_batch_norm_moving_statistics_equal_the_full_batch(remat):
    x, target = _drifting_data()
    pipe = _pipeline(_bn_layers(), num_stages=2, num_micro_batches=4, remat=remat)
    plain = _sequential(_bn_layers())
    for model in (pipe, plain):

        @tf.function
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
    pipe = _pipeline(_bn_layers(), num_stages=2, num_micro_batches=4)
    plain = _sequential(_bn_layers())
    for bn in (pipe.stage_layers(0)[1], plain.bn):
        bn.vars["moving_mean"].assign([0.5, -0.5, 1.0, 0.0])
        bn.vars["moving_variance"].assign([2.0, 1.0, 0.5, 3.0])
    ctx = FPropContext(training=False)
    np.testing.assert_allclose(pipe(ctx, x).numpy(), plain(ctx, x).numpy(), atol=TOL)
    assert ctx.updates == []


# ---------------------------------------------------------------------------------------- eval
def test_eval_accepts_any_batch_size_and_an_unknown_batch_dimension():
    pipe = _pipeline(_mlp(), num_stages=2, num_micro_batches=4)
    plain = _sequential(_mlp())
    x, _ = _data(batch=6)  # 6 is not a multiple of 4: eval splits into near-equal parts

    @tf.function(input_signature=[tf.TensorSpec([None, IN_DIM])])
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
    pipe = _pipeline(layers, num_stages=2, num_micro_batches=2)
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
    pipe = _pipeline(_mlp(), num_stages=2, input_shape=[None, IN_DIM])
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
            pipe = gpipe.GPipeLayer.Params().set(layers=_mlp(), num_stages=2)
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

    @tf.function
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
    layers = _mlp(dropout=False, depth=2)
    layers.insert(1, _StopGradientFor.Params().set(name="stop", micro_batch=blocked))
    pipe = _pipeline(layers, num_stages=2, split_points=[1], num_micro_batches=4, remat=remat)
    plain = _sequential(layers)
    x, _ = _data()

    def grads(model, forward):
        @tf.function
        def run():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(forward(model, FPropContext(training=True), x)))
            return tape.gradient(loss, model.trainable_variables)

        return [g.numpy() for g in run()]

    got, want = grads(pipe, _pipelined_forward), grads(plain, _micro_batched_forward(4))
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=TOL)
    assert np.max(np.abs(got[0])) > 0.01  # stage 0's weights do learn from the other micro-batches
