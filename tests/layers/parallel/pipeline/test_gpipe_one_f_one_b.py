"""schedule=one_f_one_b: the same training as fill-drain (K, M, every remat policy, batch norm and
dropout), each stage runs its forwards and backwards in 1F1B order inside the compiled step and so holds
at most K - k micro-batches, and a loss the order cannot serve is refused with one clear error."""

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe, memory, segment
from layers.parallel.pipeline import schedule as schedules
from params.errors import ConfigError
from tests.layers.parallel.pipeline.gpipe_training import (
    BN_TOL,
    FAST,
    PAIRWISE,
    assert_same_training,
    data,
    mlp,
    pipeline,
    reference,
    train,
)
from trainer import tracing
from trainer.pipeline_views import profiling


def _squared_error(ctx, y, target):
    return tf.reduce_sum(tf.square(y - target), axis=-1)


def _loss_in_last_stage(model, ctx, x, target):
    """The mean squared error, each micro-batch's errors computed in the last stage (a head)."""
    per_example = model(ctx, x, head=_squared_error, head_inputs=target)
    return tf.reduce_sum(per_example) / float(np.prod(target.shape))


def _one_f_one_b(layers, k, m, remat):
    return pipeline(layers, num_stages=k, num_micro_batches=m, remat=remat, schedule="one_f_one_b")


def _train_with_head(model):
    return train(model, None, loss_fn=_loss_in_last_stage)


@pytest.mark.parametrize("k, m, remat", FAST)
def test_one_f_one_b_trains_like_the_sequential_model(k, m, remat):
    """10 SGD steps with dropout and batch norm: the same as the unpipelined model at M=1 and as the
    micro-batched sequential model otherwise (which fill-drain also equals)."""
    pipe = _one_f_one_b(mlp(batch_norm=True), k, m, remat)
    assert_same_training(_train_with_head(pipe), reference(m, batch_norm=True), BN_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("k, m, remat", [c for c in PAIRWISE if c not in FAST])
def test_one_f_one_b_full_sweep(k, m, remat):
    pipe = _one_f_one_b(mlp(batch_norm=True), k, m, remat)
    assert_same_training(_train_with_head(pipe), reference(m, batch_norm=True), BN_TOL)


def test_schedules_give_the_same_training_with_the_loss_in_the_last_stage():
    layers = mlp(batch_norm=True)
    got = _train_with_head(_one_f_one_b(layers, 2, 4, "never"))
    want = _train_with_head(pipeline(layers, num_stages=2, num_micro_batches=4, remat="never"))
    # The weight gradients are summed in another order (m = 0 first): rounding, amplified by batch norm.
    assert_same_training(got, want, BN_TOL)


def test_eager_mode_gives_the_same_gradients_without_ordering():
    """Eagerly, ops run as they are called (nothing to order); the gradients are still the same."""
    x, target = data()

    def grads(schedule):
        layers = mlp(dropout=False)
        pipe = pipeline(layers, num_stages=2, num_micro_batches=4, remat="always", schedule=schedule)
        with tf.GradientTape() as tape:
            out = pipe(FPropContext(training=True), x, head=_squared_error, head_inputs=target)
            loss = tf.reduce_sum(out)
        return [g.numpy() for g in tape.gradient(loss, pipe.trainable_variables)]

    for got, want in zip(grads("one_f_one_b"), grads("fill_drain")):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_loss_on_the_joined_outputs_is_refused_with_one_clear_error():
    """Any loss on the joined outputs (here a mean; even a sum of squares, whose gradient is computed
    from the joined tensor) makes every micro-batch's gradient wait for the others' forwards, which
    1F1B runs after the earlier backwards: a cycle, refused when the step is traced."""
    pipe = _one_f_one_b(mlp(dropout=False), 2, 4, "never")
    x, target = data()

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(pipe(FPropContext(training=True), x) - target))
        return tape.gradient(loss, pipe.trainable_variables)

    # Traced and its errors unwrapped as the trainer's step is.
    with pytest.raises(ConfigError, match=r"net: schedule=one_f_one_b .* Compute the loss per micro-batch"):
        with tracing.user_errors():
            tracing.graph_function(step)()


def test_an_unknown_schedule_is_a_config_error():
    want = (
        "params.schedule must be one of fill_drain, one_f_one_b, one_f_one_b_split, interleaved_1f1b, "
        "zb_h1, zb_h2, zbv, dualpipe_v, got 'zigzag'"
    )
    with pytest.raises(ConfigError, match=want):
        pipeline(mlp(), num_stages=2, schedule="zigzag")


# ------------------------------------------------------------------------- the order in a real step
def _dense_pipeline(k: int, m: int, remat: str, schedule: str, width: int = 64) -> gpipe.GPipeLayer:
    layers = [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=width, output_dim=width, activation="relu")
        for i in range(2 * k)
    ]
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=layers, num_stages=k, num_micro_batches=m, remat=remat, schedule=schedule
    )
    return p.instantiate()


def _profiled_orders(k: int, m: int, remat: str, schedule: str) -> tuple[list[list[tuple[str, int]]], list]:
    """Each stage's (kind, micro-batch) sequence in a profiled training step, and the events."""
    pipe = _dense_pipeline(k, m, remat, schedule)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(m * 16, 64)).astype(np.float32))
    target = tf.constant(rng.normal(size=(m * 16, 64)).astype(np.float32))

    @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
    def step():
        with tf.GradientTape() as tape:
            out = pipe(FPropContext(training=True), x, head=_squared_error, head_inputs=target)
            loss = tf.reduce_sum(out)
        return loss, tape.gradient(loss, pipe.trainable_variables)  # the loss too, as a trainer

    step()
    evs = profiling.pipeline_events(profiling.op_events(lambda: step()[0].numpy()))
    orders = [
        [(e.kind, e.micro_batch) for e in sorted((e for e in evs if e.stage == s), key=lambda e: e.start)]
        for s in range(k)
    ]
    return orders, evs


@pytest.mark.parametrize(
    "k, m, remat, schedule",
    [(2, 4, "never", "one_f_one_b"), (4, 6, "always", "one_f_one_b"), (2, 4, "never", "fill_drain")],
)
def test_each_stage_runs_its_work_in_the_schedules_order(k, m, remat, schedule):
    """In a profiled step every stage runs its forwards, recomputes and backwards exactly in the order
    ``stage_orders`` lists, so under 1F1B stage k never holds more than K - k micro-batches. (The
    order is enforced by the graph, not by timing: a loaded machine cannot change it.)"""
    orders, evs = _profiled_orders(k, m, remat, schedule)
    orders_wanted = schedules.stage_orders(schedule, k, m, remat)
    want = [[(op.kind, op.micro_batch) for op in order] for order in orders_wanted]
    assert orders == want
    if schedule == "one_f_one_b":
        assert memory.peak_in_flight(evs) == [min(k - s, m) for s in range(k)]


def test_in_step_weight_gradients_are_scaled_on_their_stages_devices():
    """In-step, each weight gradient is multiplied by the loss's output gradient on its own stage's
    device. Unplaced, the products ran on the caller's device: for stages in other processes, every
    weight gradient crossed the network to the trainer and back each step."""
    pipe = _dense_pipeline(2, 4, "never", "one_f_one_b", width=8)
    x, target = tf.ones([8, 8]), tf.zeros([8, 8])

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(
                pipe(FPropContext(training=True), x, head=_squared_error, head_inputs=target)
            )
        return tape.gradient(loss, pipe.trainable_variables)

    ops = step.get_concrete_function().graph.get_operations()
    scaled = [
        op for op in ops if op.type == "Mul" and any(segment.SUMS_SCOPE in t.op.name for t in op.inputs)
    ]
    devices = sorted(op.device.split("device:")[-1] for op in scaled)
    assert devices == ["CPU:0"] * 4 + ["CPU:1"] * 4  # 2 layers per stage, a weight and a bias each
