"""Pipeline x mesh: a K=2 GPipe whose stages each carry a 2-way model mesh over their own two of the
four logical CPU devices (tests/conftest.py) trains exactly like the unsharded, unpipelined stack, for
fill-drain and 1F1B; an impossible combination is one ConfigError line naming the knobs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers import core, transformer
from layers.base_layer import FPropContext
from layers.parallel import mesh as mesh_lib
from layers.parallel.pipeline import gpipe
from params.errors import ConfigError

REPO = Path(__file__).resolve().parents[4]

BATCH, IN_DIM, HIDDEN, OUT_DIM = 8, 6, 8, 4
STEPS, LR, TOL = 3, 0.1, 1e-5


def _layers(hidden: int = HIDDEN) -> list:
    """Four projections; ``hidden`` dims (split over ``model`` by the rules) alternate with ``embed``
    ones, so each stage holds a column-split and a row-split weight (Megatron's pair)."""
    dims = [IN_DIM, hidden, HIDDEN, hidden, OUT_DIM]
    names = ["embed", "hidden", "embed", "hidden", "out"]
    return [
        core.ProjectionLayer.Params().set(
            name=f"fc{i}",
            input_dim=dims[i],
            output_dim=dims[i + 1],
            input_dim_name=names[i],
            output_dim_name=names[i + 1],
            activation="tanh" if i < 3 else "none",
        )
        for i in range(4)
    ]


def _pipeline(schedule: str = "fill_drain", layers=None, **kwargs) -> gpipe.GPipeLayer:
    settings = dict(stage_mesh_shape=[2], stage_mesh_axis_names=["model"], stage_layout_rules="hidden:model")
    settings.update(kwargs)
    return (
        gpipe.GPipeLayer.Params()
        .set(
            name="net",
            layers=layers or _layers(),
            num_stages=2,
            schedule=schedule,
            **{"num_micro_batches": 2, **settings},
        )
        .instantiate()
    )


def _squared_error(ctx, y, target):
    return tf.reduce_sum(tf.square(y - target), axis=-1)


def _whole(t) -> np.ndarray:
    """A DTensor's (or a plain tensor's) full value."""
    if isinstance(t, tf.Variable):
        t = t.read_value()
    if not dtensor.is_dtensor(t):
        return t.numpy()
    layout = dtensor.fetch_layout(t)
    return dtensor.unpack(dtensor.relayout(t, dtensor.Layout.replicated(layout.mesh, t.shape.rank)))[
        0
    ].numpy()


def _train(model, x, target, piped: bool):
    """STEPS of SGD on the summed squared error over BATCH * OUT_DIM (the loss computed per
    micro-batch in the last stage when ``piped``); (losses, first gradients, final weights) by name."""
    variables = model.trainable_variables
    layouts = [dtensor.fetch_layout(v) for v in variables] if piped else []

    @tf.function
    def step():
        ctx = FPropContext(training=True, seed=7)
        with tf.GradientTape() as tape:
            if piped:
                per_example = model(ctx, x, head=_squared_error, head_inputs=target)
            else:
                per_example = _squared_error(ctx, model(ctx, x), target)
            loss = tf.reduce_sum(per_example) / float(BATCH * OUT_DIM)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(LR * g)
        if piped:  # returned from a step over two meshes, a gradient needs its layout spelt out
            grads = [dtensor.relayout(g, layout) for g, layout in zip(grads, layouts)]
        return loss, grads

    losses, first = [], None
    for _ in range(STEPS):
        loss, grads = step()
        losses.append(float(_whole(loss)))
        if first is None:
            first = {v.name: _whole(g) for v, g in zip(variables, grads)}
    return np.array(losses), first, {v.name: _whole(v) for v in variables}


def _assert_trains_like(got, want) -> None:
    """The pipelined run's losses (which fall) and every other result of ``_train`` equal the plain
    stack's within TOL."""
    assert np.max(np.abs(got[0] - want[0])) <= TOL, (got[0], want[0])
    assert got[0][-1] < got[0][0]
    for got_part, want_part in zip(got[1:], want[1:]):
        assert sorted(got_part) == sorted(want_part)
        for name, value in got_part.items():
            assert np.max(np.abs(value - want_part[name])) <= TOL, name


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, IN_DIM)).astype(np.float32)
    y = rng.normal(size=(BATCH, OUT_DIM)).astype(np.float32)
    return x, y


@pytest.mark.parametrize("schedule", ["fill_drain", "one_f_one_b"])
def test_pipeline_by_mesh_trains_like_the_plain_stack(schedule):
    x, y = _data()
    pipe = _pipeline(schedule)
    got = _train(
        pipe, pipe.input_mesh.to_layout(x, [None, None]), pipe.output_mesh.to_layout(y, [None, None]), True
    )
    plain = core.SequentialLayer.Params().set(name="net", sub=_layers()).instantiate()
    _assert_trains_like(got, _train(plain, tf.constant(x), tf.constant(y), False))


@pytest.mark.parametrize("schedule", ["fill_drain", "one_f_one_b"])
def test_a_data_axis_splits_each_micro_batch_over_its_replicas(schedule):
    """Pipeline x data: each stage's mesh is a 2-way ``data`` axis; the batch arrives split over it,
    each replica splits its own rows into micro-batches (DTensor cannot split a split dimension), and
    training and inference (rows in their order) equal the plain stack's."""
    x, y = _data()
    pipe = _pipeline(schedule, stage_mesh_axis_names=["data"], stage_layout_rules="batch:data")
    assert pipe.stage_replicas == 2
    got = _train(
        pipe,
        pipe.input_mesh.to_layout(x, ["data", None]),
        pipe.output_mesh.to_layout(y, ["data", None]),
        True,
    )
    plain = core.SequentialLayer.Params().set(name="net", sub=_layers()).instantiate()
    _assert_trains_like(got, _train(plain, tf.constant(x), tf.constant(y), False))
    ctx = FPropContext(training=False)
    inferred = tf.function(lambda t: pipe(ctx, t))(pipe.input_mesh.to_layout(x, ["data", None]))
    np.testing.assert_allclose(_whole(inferred), plain(ctx, tf.constant(x)).numpy(), atol=TOL)


def test_a_batch_that_does_not_split_over_replicas_and_micro_batches_is_one_line():
    x, y = _data()
    pipe = _pipeline(stage_mesh_axis_names=["data"], stage_layout_rules="batch:data", num_micro_batches=BATCH)
    with pytest.raises(ConfigError) as info:
        pipe(FPropContext(training=True), pipe.input_mesh.to_layout(x, [None, None]))
    message = str(info.value)
    assert "\n" not in message
    for word in ["8 rows", "8 micro-batches (num_micro_batches)", "2 replicas", "multiple of 16"]:
        assert word in message, message


def test_each_stage_shards_its_weights_on_its_own_devices():
    pipe = _pipeline()
    devices = [d.name.split("/device:")[-1] for d in tf.config.list_logical_devices("CPU")]
    for k, own in enumerate([devices[0:2], devices[2:4]]):
        for layer in pipe.stage_layers(k):
            for var in layer.vars.values():
                layout = dtensor.fetch_layout(var)
                assert [d.split("/device:")[-1] for d in layout.mesh.local_devices()] == own, var.name
        specs = [dtensor.fetch_layout(layer.vars["w"]).sharding_specs for layer in pipe.stage_layers(k)]
        assert specs == [[dtensor.UNSHARDED, "model"], ["model", dtensor.UNSHARDED]]
    # Every weight is split in two or is a bias of the row-split layer: a device holds about a quarter.
    largest = max(
        sum(
            pipe.stage_meshes[0].local_bytes(v) for layer in pipe.stage_layers(k) for v in layer.vars.values()
        )
        for k in range(2)
    )
    whole = sum(int(np.prod(v.shape)) * 4 for v in pipe.trainable_variables)
    assert largest / whole < 0.3
    # The partition table names each stage's mesh as its device.
    rows = [line.split() for line in pipe.partition_report().splitlines()[2:4]]
    assert [row[1:3] for row in rows] == [
        [",".join(devices[0:2]), "(model=2)"],
        [",".join(devices[2:4]), "(model=2)"],
    ]


def test_inference_equals_the_plain_stack():
    x, _ = _data()
    pipe = _pipeline()
    plain = core.SequentialLayer.Params().set(name="net", sub=_layers()).instantiate()
    ctx = FPropContext(training=False)
    got = tf.function(lambda t: pipe(ctx, t))(pipe.input_mesh.to_layout(x, [None, None]))
    np.testing.assert_allclose(_whole(got), plain(ctx, tf.constant(x)).numpy(), atol=TOL)


@pytest.mark.parametrize(
    "settings, layers, words",
    [
        (
            dict(stage_mesh_shape=[4]),
            None,
            ["num_stages=2", "stage_mesh_shape [4]", "needs 8", "found 4", "num_logical_cpu_devices"],
        ),
        (
            dict(stage_mesh_shape=[1, 2], stage_mesh_axis_names=["model", "model"]),
            None,
            ["stage_mesh_axis_names", "'model' twice"],
        ),
        ({}, _layers(hidden=5), ["net/fc0", "weight 'w'", "size 5", "not divisible", "'model'"]),
        (dict(devices=["/cpu:0", "/cpu:1"]), None, ["params.devices", "stage_mesh_shape"]),
        (dict(stage_layout_rules="hidden:data"), None, ["stage_layout_rules", "'data'", "not a mesh axis"]),
    ],
)
def test_impossible_combinations_fail_in_one_line(settings, layers, words):
    with pytest.raises(ConfigError) as info:
        _pipeline(layers=layers, **settings)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


# Six projections, three a stage: each stage ends on a hidden (split) activation and holds a row-split
# weight, so both meshes all-reduce in the forward and the backward. With DTensor's all-reduce
# combiner on, stage 0's forward all-reduce of micro-batch 1 and its backward one of micro-batch 0
# (independent inside stage 0's function, dependent through stage 1's) were merged and the step hung
# with every thread idle (TensorFlow 2.21). In a fresh process, bounded by a timeout.
_COMBINED_ALL_REDUCES = textwrap.dedent(
    """
    import sys

    import numpy as np
    import tensorflow as tf

    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4
    )
    from tensorflow.experimental import dtensor

    from layers import core
    from layers.base_layer import FPropContext
    from layers.parallel.pipeline import gpipe

    schedule = sys.argv[1]

    def stack():
        dims, names = [4, 8, 4, 8, 4, 8, 4], ["embed", "hidden"] * 3 + ["embed"]
        return [
            core.ProjectionLayer.Params().set(
                name=f"fc{i}", input_dim=dims[i], output_dim=dims[i + 1], input_dim_name=names[i],
                output_dim_name=names[i + 1], activation="tanh",
            )
            for i in range(6)
        ]

    pipe = gpipe.GPipeLayer.Params().set(
        name="net", layers=stack(), num_stages=2, num_micro_batches=2, schedule=schedule,
        stage_mesh_shape=[2], stage_mesh_axis_names=["model"], stage_layout_rules="hidden:model",
    ).instantiate()
    plain = core.SequentialLayer.Params().set(name="net", sub=stack()).instantiate()
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 4)).astype("f"), rng.normal(size=(4, 4)).astype("f")

    def step(model, x, y, piped):
        variables = model.trainable_variables

        @tf.function
        def run():
            ctx = FPropContext(training=True)
            with tf.GradientTape() as tape:
                if piped:
                    per = model(ctx, x, head=lambda c, o, t: tf.reduce_sum((o - t) ** 2, -1), head_inputs=y)
                else:
                    per = tf.reduce_sum((model(ctx, x) - y) ** 2, -1)
                loss = tf.reduce_sum(per)
            for v, g in zip(variables, tape.gradient(loss, variables)):
                v.assign_sub(0.1 * g)

        run()
        return {v.name: whole(v) if piped else v.numpy() for v in variables}

    def whole(v):
        replicated = dtensor.Layout.replicated(dtensor.fetch_layout(v).mesh, v.shape.rank)
        return dtensor.unpack(dtensor.relayout(v.read_value(), replicated))[0].numpy()

    x_in, y_in = pipe.input_mesh.to_layout(x, [None, None]), pipe.output_mesh.to_layout(y, [None, None])
    got = step(pipe, x_in, y_in, True)
    want = step(plain, tf.constant(x), tf.constant(y), False)
    print("max_weight_diff", max(float(np.max(np.abs(got[k] - want[k]))) for k in want))
    """
)


def _run_fresh(argument: str, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop(mesh_lib.COMBINE_ALL_REDUCES_ENV, None)  # this process's meshes set it: the child must itself
    try:
        return subprocess.run(
            [sys.executable, "-c", _COMBINED_ALL_REDUCES, argument],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"a pipeline x mesh step ({argument}) did not end in {timeout:.0f} s: hung")


def test_stages_whose_all_reduces_depend_across_meshes_do_not_hang():
    result = _run_fresh("fill_drain", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    diff = float(result.stdout.split("max_weight_diff")[-1])
    assert diff <= TOL, result.stdout


def test_an_environment_with_the_combiner_on_is_refused_in_one_line(monkeypatch):
    # In this process: the check reads the variable when the stage meshes are made.
    monkeypatch.setenv(mesh_lib.COMBINE_ALL_REDUCES_ENV, "1")
    with pytest.raises(ConfigError) as raised:
        _pipeline()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("net: stage_mesh_shape needs")
    assert f"set {mesh_lib.COMBINE_ALL_REDUCES_ENV}=0 in the environment" in message


def _transformer_layers() -> list:
    """Two Transformer layers (model width 8, 2 heads, feed-forward 16), one a stage."""
    return [
        transformer.TransformerLayer.Params().set(
            name=f"layer{i}", model_dim=8, num_heads=2, hidden_dim=16, fused_qkv=False
        )
        for i in range(2)
    ]


@pytest.mark.parametrize("schedule", ["one_f_one_b"])
def test_transformer_layers_on_stage_meshes_train_like_the_plain_stack(schedule):
    """Heads and the feed-forward hidden dimension split over each stage's 2-way mesh (attention and
    feed-forward all-reduces in both stages): 1F1B's step over two such stages hung before the
    all-reduce combiner was turned off (so did fill-drain's, as the six projections above did; that
    one case stands for both here: each Transformer case is ~15 s of the suite)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(BATCH, 3, 8)).astype(np.float32)
    y = rng.normal(size=(BATCH, 3, 8)).astype(np.float32)
    pipe = _pipeline(schedule, layers=_transformer_layers(), stage_layout_rules="hidden:model;heads:model")
    sharded = [v.name for v in pipe.trainable_variables if "model" in dtensor.fetch_layout(v).sharding_specs]
    assert len(sharded) >= 8, sharded  # each layer's q/k/v, output and both feed-forward weights
    got = _train(
        pipe,
        pipe.input_mesh.to_layout(x, [None, None, None]),
        pipe.output_mesh.to_layout(y, [None, None, None]),
        True,
    )
    plain = core.SequentialLayer.Params().set(name="net", sub=_transformer_layers()).instantiate()
    _assert_trains_like(got, _train(plain, tf.constant(x), tf.constant(y), False))
