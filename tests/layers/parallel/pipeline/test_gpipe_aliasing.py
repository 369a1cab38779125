"""A dict state may hold one tensor under several keys (a skip connection keeps the activation it
branches from), and every schedule and remat policy must still give the unpipelined model's loss,
input gradient and weight gradients (1e-5): one tensor under two keys inside a stage, a key aliased
across one cut and across several, the same tensors returned by two layers, and an input given twice.
A random-structure property test draws layers that copy, alias, drop and add keys."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers import containers, core
from layers.base_layer import BaseLayer, FPropContext
from layers.parallel.pipeline import gpipe
from params.hyperparams import InstantiableParams

TOL = 1e-5
WIDTH, OUT = 5, 3


class Alias(BaseLayer):
    """``state[dst] = state[src]``: the same tensor under a second key."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("src", "x", "The key whose tensor is aliased.")
        p.define("dst", "skip", "The new key.")
        return p

    def fprop(self, ctx: FPropContext, state: dict) -> dict:
        return {**state, self.params.dst: state[self.params.src]}


class Copy(Alias):
    """``state[dst]`` a copy of ``state[src]`` (a new tensor): the reference the aliases must equal."""

    def fprop(self, ctx: FPropContext, state: dict) -> dict:
        return {**state, self.params.dst: tf.identity(state[self.params.src])}


class Echo(BaseLayer):
    """Returns its state unchanged: the same tensors leave two layers."""

    def fprop(self, ctx: FPropContext, state: dict) -> dict:
        return state


class AddBack(BaseLayer):
    """``x += proj(state[src])``; ``state[src]`` dropped."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("src", "skip", "The key added back to x (and dropped).")
        p.define("input_dim", WIDTH, "Its width.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        proj = core.ProjectionLayer.Params().set(input_dim=self.params.input_dim, output_dim=WIDTH)
        self.create_child("proj", proj)

    def fprop(self, ctx: FPropContext, state: dict) -> dict:
        rest = {k: v for k, v in state.items() if k != self.params.src}
        return {**rest, "x": state["x"] + self.proj(ctx, state[self.params.src])}


def _dense(name: str, in_dim: int = WIDTH, out_dim: int = WIDTH, act: str = "tanh") -> InstantiableParams:
    body = core.ProjectionLayer.Params().set(input_dim=in_dim, output_dim=out_dim, activation=act)
    return containers.OnKeyLayer.Params().set(name=name, body=body, key="x")


def _skips(dropout: bool = False) -> list[InstantiableParams]:
    """12 layers: ``raw`` (the input, given twice) crosses every cut to the end; ``long`` crosses
    several cuts at K=4; ``short`` stays inside a stage; ``echo`` returns the same tensors as fc1.
    With ``dropout``, fc2's output drops a quarter (masks keyed by micro-batch)."""
    layers = [
        _dense("fc0", in_dim=4),
        Alias.Params().set(name="keep_long", dst="long"),
        _dense("fc1"),
        Echo.Params().set(name="echo"),
        Alias.Params().set(name="keep_short", dst="short"),
        _dense("fc2"),
        AddBack.Params().set(name="add_short", src="short"),
        _dense("fc3"),
        _dense("fc4"),
        AddBack.Params().set(name="add_long", src="long"),
        AddBack.Params().set(name="add_raw", src="raw", input_dim=4),
        _dense("out", out_dim=OUT, act="none"),
    ]
    if dropout:
        drop = core.DropoutLayer.Params().set(keep_prob=0.75)
        layers.insert(6, containers.OnKeyLayer.Params().set(name="drop", body=drop, key="x"))
    return layers


def _head(ctx, state, target):
    return tf.reduce_sum(tf.square(state["x"] - target["y"]), axis=-1) * target["w"]


def _data(batch: int, in_dim: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, in_dim)).astype(np.float32))
    y = tf.constant(rng.normal(size=(batch, OUT)).astype(np.float32))
    w = tf.constant(rng.uniform(0.5, 1.5, size=(batch,)).astype(np.float32))
    return x, {"y": y, "w": w}


def _step(model, x, target, piped: bool, micro_batches: int = 1):
    """Loss, d loss / d x, and the weight gradients by name, of one step on a weighted squared error
    (per micro-batch in the last stage when ``piped``; else, with ``micro_batches``, the model run
    micro-batch by micro-batch with the pipeline's randomness keys)."""

    @tf.function(autograph=False)
    def step():
        ctx = FPropContext(training=True, step=tf.constant(0), seed=3)
        with tf.GradientTape() as tape:
            tape.watch(x)
            state = {"x": x, "raw": x}  # one input tensor under two keys
            if piped:
                per_example = model(ctx, state, head=_head, head_inputs=target)
            else:
                parts = [tf.split(t, micro_batches) for t in (x, target["y"], target["w"])]
                per_example = tf.concat(
                    [
                        _head(ctx, model(ctx.for_micro_batch(m), {"x": xm, "raw": xm}), {"y": ym, "w": wm})
                        for m, (xm, ym, wm) in enumerate(zip(*parts))
                    ],
                    0,
                )
            loss = tf.reduce_sum(per_example) / tf.reduce_sum(target["w"])
        variables = list(model.trainable_variables)
        grads = tape.gradient(loss, [x] + variables)
        return loss, grads[0], dict(zip([v.name for v in variables], grads[1:]))

    loss, dx, dws = step()
    return float(loss), dx.numpy(), {k: v.numpy() for k, v in dws.items()}


def _assert_same(got, want) -> None:
    assert got[0] == pytest.approx(want[0], abs=TOL)
    np.testing.assert_allclose(got[1], want[1], atol=TOL, err_msg="input gradient")
    assert sorted(got[2]) == sorted(want[2])
    for name, g in got[2].items():
        np.testing.assert_allclose(g, want[2][name], atol=TOL, err_msg=name)


def _sequential(layers):
    return core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()


def _pipeline(layers, **kwargs):
    return gpipe.GPipeLayer.Params().set(name="net", layers=layers, **kwargs).instantiate()


# Every schedule with every remat policy; K and M vary so that each K in {1, 2, 4} and each M in
# {1, 2, 4, 8} meet (the in-step schedules need M >= K; interleaved runs v=2).
CASES = [
    ("fill_drain", 1, 1, "always"),
    ("fill_drain", 2, 8, "never"),
    ("fill_drain", 4, 2, "except_last"),
    ("one_f_one_b", 1, 4, "never"),
    ("one_f_one_b", 2, 2, "always"),
    ("one_f_one_b", 4, 4, "except_last"),
    ("one_f_one_b_split", 2, 4, "except_last"),
    ("one_f_one_b_split", 4, 8, "always"),
    ("one_f_one_b_split", 1, 2, "never"),
    ("interleaved_1f1b", 2, 4, "always"),
    ("interleaved_1f1b", 2, 2, "never"),
    ("interleaved_1f1b", 2, 8, "except_last"),
    ("zb_h1", 4, 4, "never"),
    ("zb_h1", 2, 8, "always"),
    ("zb_h1", 1, 1, "except_last"),
    ("zb_h2", 2, 2, "except_last"),
    ("zb_h2", 4, 8, "never"),
    ("zb_h2", 1, 4, "always"),
]


@pytest.fixture(scope="module")
def reference():
    x, target = _data(16)
    return x, target, _step(_sequential(_skips()), x, target, piped=False)


@pytest.mark.parametrize("schedule, k, m, remat", CASES)
def test_aliased_keys_give_the_unpipelined_gradients(reference, schedule, k, m, remat):
    x, target, want = reference
    v = 2 if schedule == "interleaved_1f1b" else 1
    pipe = _pipeline(
        _skips(), num_stages=k, num_micro_batches=m, remat=remat, schedule=schedule, virtual_stages=v
    )
    _assert_same(_step(pipe, x, target, piped=True), want)


@functools.cache
def _dropout_reference(micro_batches: int):
    x, target = _data(16)
    return _step(_sequential(_skips(dropout=True)), x, target, piped=False, micro_batches=micro_batches)


# The drill: K in {1, 2, 4} x M in {1, 2, 4, 8} x remat always and never, dropout on (fill-drain).
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("remat", ["always", "never"])
def test_aliased_keys_with_dropout(k, m, remat):
    x, target = _data(16)
    pipe = _pipeline(_skips(dropout=True), num_stages=k, num_micro_batches=m, remat=remat)
    _assert_same(_step(pipe, x, target, piped=True), _dropout_reference(m))


def test_aliases_train_as_copies_do():
    """The same model with every alias made a copy: the aliases change nothing (K=4, M=4, ZB-H1)."""
    x, target = _data(8)
    copies = [Copy.Params().set(name=p.name, dst=p.dst) if p.cls is Alias else p for p in _skips()]
    kw = dict(num_stages=4, num_micro_batches=4, remat="always", schedule="zb_h1")
    _assert_same(
        _step(_pipeline(_skips(), **kw), x, target, True), _step(_pipeline(copies, **kw), x, target, True)
    )


def _random_layers(rng: random.Random) -> list[InstantiableParams]:
    """6 to 10 layers that transform ``x``, alias it or a kept key under a new key, echo the state,
    or add a kept key back (dropping it); every key left is added back before the output."""
    layers: list[InstantiableParams] = [_dense("in", in_dim=4)]
    kept: list[str] = []
    for i in range(rng.randint(6, 10)):
        move = rng.choice(["dense", "alias", "alias", "echo", "add"])
        if move == "alias":
            src = rng.choice(["x"] + kept)
            kept.append(f"k{i}")
            layers.append(Alias.Params().set(name=f"alias{i}", src=src, dst=f"k{i}"))
        elif move == "add" and kept:
            layers.append(AddBack.Params().set(name=f"add{i}", src=kept.pop(rng.randrange(len(kept)))))
        elif move == "echo":
            layers.append(Echo.Params().set(name=f"echo{i}"))
        else:
            layers.append(_dense(f"fc{i}"))
    layers += [AddBack.Params().set(name=f"add_{key}", src=key) for key in kept]
    layers.append(AddBack.Params().set(name="add_raw", src="raw", input_dim=4))
    return layers + [_dense("out", out_dim=OUT, act="none")]


@pytest.mark.parametrize("seed", range(3))
def test_random_structures_give_the_unpipelined_gradients(seed):
    rng = random.Random(seed)
    layers = _random_layers(rng)
    schedule = rng.choice(["one_f_one_b_split", "zb_h1", "zb_h2", "one_f_one_b"])
    k = rng.choice([2, 4]) if len(layers) >= 4 else 2
    m, remat = rng.choice([k, 2 * k]), rng.choice(["always", "never", "except_last"])
    x, target = _data(16, seed=seed)
    want = _step(_sequential(_random_layers(random.Random(seed))), x, target, piped=False)
    pipe = _pipeline(layers, num_stages=k, num_micro_batches=m, remat=remat, schedule=schedule)
    _assert_same(_step(pipe, x, target, piped=True), want)


def test_aliased_keys_on_stage_meshes(reference):
    """Stages on meshes of their own (K=2, a 2-way mesh each): hand-offs move each key separately."""
    x, target, want = reference
    pipe = _pipeline(
        _skips(),
        num_stages=2,
        num_micro_batches=2,
        remat="always",
        schedule="one_f_one_b",
        stage_mesh_shape=[2],
        stage_mesh_axis_names=["model"],
    )
    x_in = pipe.input_mesh.to_layout(x, [None, None])
    target_in = {
        "y": pipe.output_mesh.to_layout(target["y"], [None, None]),
        "w": pipe.output_mesh.to_layout(target["w"], [None]),
    }
    variables = list(pipe.trainable_variables)
    layouts = [dtensor.fetch_layout(v) for v in [x_in] + variables]

    @tf.function
    def step():
        ctx = FPropContext(training=True, step=tf.constant(0), seed=3)
        with tf.GradientTape() as tape:
            tape.watch(x_in)
            per_example = pipe(ctx, {"x": x_in, "raw": x_in}, head=_head, head_inputs=target_in)
            loss = tf.reduce_sum(per_example) / tf.reduce_sum(target_in["w"])
        grads = tape.gradient(loss, [x_in] + variables)
        # returned from a step over two meshes, a gradient needs its layout spelt out
        return loss, [dtensor.relayout(g, layout) for g, layout in zip(grads, layouts)]

    loss, grads = step()
    got = (float(_whole(loss)), _whole(grads[0]), {v.name: _whole(g) for v, g in zip(variables, grads[1:])})
    _assert_same(got, want)


def _whole(t) -> np.ndarray:
    """A DTensor's (or a plain tensor's) full value."""
    if not dtensor.is_dtensor(t):
        return t.numpy()
    layout = dtensor.fetch_layout(t)
    return dtensor.unpack(dtensor.relayout(t, dtensor.Layout.replicated(layout.mesh, t.shape.rank)))[
        0
    ].numpy()
