"""Every schedule gives the gradients of the plain unpipelined model (1e-5), on models and shapes drawn
at random here (seeded): K in {2, 4}, M in {K..2K}, v in {1, 2}, remat on and off; for the layer and
for a task end to end. Also the one-line errors for combinations that cannot run."""

from __future__ import annotations

import random

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe
from layers.parallel.pipeline import schedule as schedules
from params.errors import ConfigError
from tasks.image.model import ImageClassifierTask

TOL = 1e-5


def _draw(schedule: str, seed: int) -> dict:
    """K, M, v, remat and an MLP (depth and widths) drawn for one case."""
    rng = random.Random(f"{schedule}-{seed}")
    k = rng.choice([2, 4])
    v = 2 if schedule == "interleaved_1f1b" and rng.random() < 0.75 else 1
    m = rng.choice([k, 2 * k]) if v > 1 else rng.randint(k, 2 * k)
    depth = rng.randint(k * v, k * v + 2)
    widths = [rng.randint(3, 7) for _ in range(depth + 1)]
    remat = rng.choice(["always", "never", "except_last"])
    return {"k": k, "m": m, "v": v, "remat": remat, "widths": widths, "seed": seed}


def _layers(widths: list[int]) -> list:
    return [
        core.ProjectionLayer.Params().set(
            name=f"fc{i}", input_dim=widths[i], output_dim=widths[i + 1], activation="tanh"
        )
        for i in range(len(widths) - 1)
    ]


def _head(ctx, y, target):
    return tf.reduce_sum(tf.square(y - target["y"]), axis=-1) * target["w"]


def _gradients(pipe: gpipe.GPipeLayer, x, target, weights) -> tuple[float, list[np.ndarray]]:
    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            per_example = pipe(
                FPropContext(training=True), x, head=_head, head_inputs={"y": target, "w": weights}
            )
            loss = tf.reduce_sum(per_example) / tf.reduce_sum(weights)
        return loss, tape.gradient(loss, pipe.trainable_variables)

    loss, grads = step()
    return float(loss), [g.numpy() for g in grads]


# One draw per schedule covering K 2 and 4, v 1 and 2, remat on and off; the other draws are slow.
FAST = {
    "fill_drain": 0,
    "one_f_one_b": 1,
    "interleaved_1f1b": 1,
    "zb_h1": 0,
    "zb_h2": 0,
    "one_f_one_b_split": 2,
}
CASES = [
    pytest.param(s, seed, marks=() if FAST[s] == seed else pytest.mark.slow)
    for s in schedules.SCHEDULES
    for seed in range(4)
]


@pytest.mark.parametrize("schedule, seed", CASES)
def test_every_schedule_gives_the_unpipelined_gradients(schedule, seed):
    c = _draw(schedule, seed)
    rng = np.random.default_rng(seed)
    batch = c["m"] * 2
    x = tf.constant(rng.normal(size=(batch, c["widths"][0])).astype(np.float32))
    target = tf.constant(rng.normal(size=(batch, c["widths"][-1])).astype(np.float32))
    weights = tf.constant(rng.uniform(0.5, 1.5, size=(batch,)).astype(np.float32))

    def make(**kw):
        return gpipe.GPipeLayer.Params().set(name="net", layers=_layers(c["widths"]), **kw).instantiate()

    pipe = make(
        num_stages=c["k"],
        num_micro_batches=c["m"],
        remat=c["remat"],
        schedule=schedule,
        virtual_stages=c["v"],
    )
    assert pipe.num_stages == c["k"] * c["v"] and pipe.num_devices == c["k"]
    plain = make(num_stages=1, num_micro_batches=1, remat="never")
    got_loss, got = _gradients(pipe, x, target, weights)
    want_loss, want = _gradients(plain, x, target, weights)
    assert got_loss == pytest.approx(want_loss, abs=TOL)
    assert len(got) == len(want) == len(c["widths"]) * 2 - 2
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=TOL, err_msg=str(c))


@pytest.mark.parametrize(
    "schedule, m, remat", [("zbv", 3, "never"), ("zbv", 3, "except_last"), ("dualpipe_v", 4, "except_last")]
)
def test_v_schedules_run_their_v_with_the_unpipelined_gradients(schedule, m, remat):
    """ZB-V and DualPipeV at K=2: four stages in a V (device 0 holds stages 0 and 3), each on its
    device; DualPipeV mixes full backwards (its overlapped pairs, run in order) with I and W."""
    rng = np.random.default_rng(5)
    widths = [4, 5, 6, 5, 3]
    x = tf.constant(rng.normal(size=(2 * m, 4)).astype(np.float32))
    target = tf.constant(rng.normal(size=(2 * m, 3)).astype(np.float32))
    weights = tf.constant(rng.uniform(0.5, 1.5, size=(2 * m,)).astype(np.float32))

    def make(**kw):
        return gpipe.GPipeLayer.Params().set(name="net", layers=_layers(widths), **kw).instantiate()

    devices = ["/device:CPU:0", "/device:CPU:1"]
    pipe = make(
        num_stages=2, virtual_stages=2, num_micro_batches=m, remat=remat, schedule=schedule, devices=devices
    )
    assert pipe.schedule_for(m).placement == (0, 1, 1, 0)
    assert [d[-5:] for d in pipe.stage_devices] == ["CPU:0", "CPU:1", "CPU:1", "CPU:0"]
    got_loss, got = _gradients(pipe, x, target, weights)
    want_loss, want = _gradients(make(num_stages=1, num_micro_batches=1), x, target, weights)
    assert got_loss == pytest.approx(want_loss, abs=TOL)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=TOL)


def test_zbv_needs_two_virtual_stages():
    with pytest.raises(
        ConfigError, match=r"schedule='zbv' places two stages per device in a V; set virtual_stages=2"
    ):
        gpipe.GPipeLayer.Params().set(
            name="net", layers=_layers([3, 3, 3]), num_stages=2, schedule="zbv"
        ).instantiate()


def _image_task(schedule: str, k: int, m: int, v: int, remat: str) -> ImageClassifierTask:
    layers = [core.FlattenLayer.Params().set(name="flatten")] + _layers([12, 8, 8, 8, 6])
    for p in layers[1:]:
        p.activation = "relu"
    pipeline = gpipe.GPipeLayer.Params().set(
        name="pipeline",
        layers=layers,
        num_stages=k,
        num_micro_batches=m,
        remat=remat,
        schedule=schedule,
        virtual_stages=v,
    )
    p = ImageClassifierTask.Params().set(name="task")
    p.body.sub = [pipeline]
    p.softmax.set(input_dim=6, num_classes=3)
    return p.instantiate()


@pytest.mark.parametrize(
    "schedule, k, m, v, remat",
    [("zb_h1", 2, 3, 1, "always"), ("interleaved_1f1b", 2, 4, 2, "never")],
)
def test_a_task_trains_with_the_unpipelined_gradients(schedule, k, m, v, remat):
    """The image task end to end: its loss in the last stage (softmax included), weighted examples."""
    rng = np.random.default_rng(3)
    batch = {
        "image": tf.constant(rng.normal(size=(12, 2, 2, 3)).astype(np.float32)),
        "label": tf.constant(rng.integers(0, 3, size=(12,)).astype(np.int32)),
        "weight": tf.constant([1, 1, 1, 0, 1, 1, 1, 1, 0.5, 1, 1, 1], tf.float32),
    }

    def grads(task):
        @tf.function(autograph=False)
        def step():
            with tf.GradientTape() as tape:
                loss = task.fprop(FPropContext(training=True), batch)["loss"][0]
            return loss, tape.gradient(loss, task.trainable_variables)

        loss, g = step()
        return float(loss), [x.numpy() for x in g]

    got_loss, got = grads(_image_task(schedule, k, m, v, remat))
    want_loss, want = grads(_image_task("fill_drain", 1, 1, 1, "never"))
    assert got_loss == pytest.approx(want_loss, abs=TOL)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=TOL)


def test_a_head_dict_with_a_loss_entry_seeds_only_the_loss():
    """A head returning a loss and a differentiable metric beside it (an LM's log_pplx beside its
    label-smoothed loss): only ``loss`` is differentiated; 1F1B-family schedules must agree."""

    def head(ctx, y, target):
        err = tf.reduce_sum(tf.square(y - target), axis=-1)
        return {"loss": 0.5 * err, "metric": tf.reduce_sum(tf.abs(y - target), axis=-1)}

    x = tf.constant(np.random.default_rng(5).normal(size=(4, 4)).astype(np.float32))

    def grads(schedule, k, m):
        pipe = (
            gpipe.GPipeLayer.Params()
            .set(name="net", layers=_layers([4, 4, 4]), num_stages=k, num_micro_batches=m, schedule=schedule)
            .instantiate()
        )

        @tf.function(autograph=False)
        def step():
            with tf.GradientTape() as tape:
                out = pipe(FPropContext(training=True), x, head=head, head_inputs=x * 0.5)
                loss = tf.reduce_sum(out["loss"]) / 4.0
            return tape.gradient(loss, pipe.trainable_variables)

        return [g.numpy() for g in step()]

    for got, want in zip(grads("zb_h1", 2, 2), grads("fill_drain", 1, 1)):
        np.testing.assert_allclose(got, want, atol=TOL)


def test_a_loss_that_is_not_a_constant_times_the_sum_fails_the_step_with_one_clear_error():
    pipe = (
        gpipe.GPipeLayer.Params()
        .set(name="net", layers=_layers([4, 4, 4]), num_stages=2, num_micro_batches=2, schedule="zb_h1")
        .instantiate()
    )
    x = tf.constant(np.random.default_rng(6).normal(size=(4, 4)).astype(np.float32))

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            out = pipe(FPropContext(training=True), x, head=_head, head_inputs={"y": x, "w": tf.ones([4])})
            loss = tf.reduce_sum(tf.square(out))  # not linear in the per-example values
        return tape.gradient(loss, pipe.trainable_variables)

    with pytest.raises(tf.errors.InvalidArgumentError, match="net: schedule=zb_h1 runs each micro-batch"):
        step()


@pytest.mark.parametrize(
    "settings, match",
    [
        (
            {"schedule": "one_f_one_b", "virtual_stages": 2},
            r"virtual_stages=2 needs schedule='interleaved_1f1b'",
        ),
        (
            {"schedule": "interleaved_1f1b", "virtual_stages": 3},
            r"needs 6 stages but there are only 4 layers",
        ),
        ({"schedule": "interleaved_1f1b", "virtual_stages": 0}, r"virtual_stages"),
    ],
)
def test_impossible_settings_fail_at_build(settings, match):
    with pytest.raises(ConfigError, match=match):
        gpipe.GPipeLayer.Params().set(
            name="net", layers=_layers([4] * 5), num_stages=2, **settings
        ).instantiate()


def test_interleaving_with_m_not_a_multiple_of_k_names_the_knob_and_the_fix():
    pipe = (
        gpipe.GPipeLayer.Params()
        .set(
            name="net",
            layers=_layers([4] * 5),
            num_stages=2,
            num_micro_batches=3,
            schedule="interleaved_1f1b",
            virtual_stages=2,
        )
        .instantiate()
    )
    with pytest.raises(ConfigError, match=r"^net: schedule='interleaved_1f1b' needs num_micro_batches \(3\)"):
        pipe(
            FPropContext(training=True),
            tf.ones([6, 4]),
            head=_head,
            head_inputs={"y": tf.ones([6, 4]), "w": tf.ones([6])},
        )
