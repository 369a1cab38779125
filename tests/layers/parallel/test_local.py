"""LocalParallelLayer is local: block k's weights get gradients only from the losses whose window holds
k, a block's forward never waits on any backward pass in the compiled step, the pipelined hand-off
feeds unit k the batch unit k-1 saw one step earlier, and that hand-off is checkpointed state."""

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel import local as lp
from params.errors import ConfigError

BATCH, DIM, CLASSES = 8, 6, 3


def _net(num_blocks=4, window=1, stride=1, pipelined=True, layers_per_block=1, **kwargs):
    n = num_blocks * layers_per_block
    layers = [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=DIM, output_dim=DIM, activation="tanh")
        for i in range(n)
    ]
    heads = [
        lp.PooledSoftmaxHead.Params().set(input_dim=DIM, num_classes=CLASSES) for _ in range(num_blocks - 1)
    ]
    p = lp.LocalParallelLayer.Params().set(
        name="net",
        layers=layers,
        num_blocks=num_blocks,
        aux_heads=heads,
        window=window,
        stride=stride,
        pipelined=pipelined,
        **kwargs,
    )
    net = p.instantiate()
    final = lp.PooledSoftmaxHead.Params().set(name="final", input_dim=DIM, num_classes=CLASSES).instantiate()
    return net, final


def _batch(step):
    rng = np.random.default_rng(step)
    x = tf.constant(rng.normal(size=(BATCH, DIM)).astype(np.float32))
    labels = tf.constant(rng.integers(0, CLASSES, size=BATCH).astype(np.int32))
    return x, {"label": labels, "weight": tf.ones([BATCH])}


def _losses(net, final, ctx, x, targets):
    """(LocalOutput, [loss of block k or None for k < K-1] + [task loss])."""
    out = net(ctx, x, targets)
    task_loss = final(ctx, out.output, out.targets)["loss"][0]
    return out, [m["loss"][0] if m is not None else None for m in out.aux[:-1]] + [task_loss]


def _train_step(net, final, lr=0.1):
    variables = list(net.trainable_variables) + list(final.trainable_variables)

    @tf.function(autograph=False)
    def step(x, targets, global_step):
        ctx = FPropContext(training=True, step=global_step)
        with tf.GradientTape() as tape:
            out, losses = _losses(net, final, ctx, x, targets)
            loss = lp.loss_with_local_gradient(losses[-1], out)
        grads = tape.gradient(loss, variables)
        for g, v in zip(grads, variables):
            if g is not None:
                v.assign_sub(lr * g)
        ctx.apply_updates()
        return loss, out.output, out.targets["label"]

    return step


def _run(net, final, steps, lr=0.1, start=0):
    step = _train_step(net, final, lr)
    outs = []
    for t in range(start, start + steps):
        x, targets = _batch(t)
        outs.append(step(x, targets, tf.constant(t, tf.int64)))
    return outs


@pytest.mark.parametrize(
    "window,stride,pipelined",
    [(1, 1, True), (2, 1, True), (2, 2, True), (1, 1, False), (2, 1, False), (3, 1, True)],
)
def test_block_gradients_come_only_from_losses_whose_window_holds_it(window, stride, pipelined):
    net, final = _net(num_blocks=4, window=window, stride=stride, pipelined=pipelined)
    _run(net, final, steps=4)  # fills the pipeline (all hand-offs hold real activations)
    x, targets = _batch(100)
    ctx = FPropContext(training=True, step=100)
    with tf.GradientTape(persistent=True) as tape:
        out, losses = _losses(net, final, ctx, x, targets)
    assert [float(v) for v in out.valid] == [1.0] * 4
    for j, loss in enumerate(losses):
        assert (loss is not None) == net.has_loss[j]
        if loss is None:
            continue
        for k in range(4):
            grads = tape.gradient(loss, net.block_variables(k))
            norm = sum(float(tf.reduce_sum(tf.abs(g))) for g in grads if g is not None)
            if k in net.window_of(j):
                assert norm > 0, (j, k)
            else:
                assert all(g is None for g in grads) or norm == 0.0, (j, k, norm)
    # Every block is trained by some loss.
    assert set().union(*[net.window_of(j) for j in range(4)]) == set(range(4))


def _ancestors(op, seen=None):
    seen = set() if seen is None else seen
    stack = [op]
    while stack:
        cur = stack.pop()
        for parent in [t.op for t in cur.inputs] + list(cur.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return seen


@pytest.mark.parametrize("window", [1, 2])
def test_a_block_forward_never_waits_on_a_backward_in_the_compiled_step(window):
    net, final = _net(num_blocks=2, window=window, layers_per_block=2)
    step = _train_step(net, final)
    x, targets = _batch(0)
    graph = step.get_concrete_function(x, targets, tf.constant(0, tf.int64)).graph
    ops = graph.get_operations()
    grad_ops = {op.name for op in ops if op.name.startswith("gradient_tape/")}
    assert grad_ops
    checked = 0
    for k in range(2):
        forward = [op for op in ops if f"block_{k}/" in op.name and op.name not in grad_ops]
        assert forward
        for op in forward:
            assert not (_ancestors(op) & grad_ops), (op.name, sorted(_ancestors(op) & grad_ops)[:3])
            checked += 1
    assert checked > 10
    if window == 1:  # the units of a pipelined step are independent: nothing stops them overlapping
        for k in range(2):
            others = {op.name for op in ops if f"block_{1 - k}/" in op.name}
            for op in ops:
                if f"block_{k}/" in op.name and op.name not in grad_ops:
                    assert not (_ancestors(op) & others), op.name
    # The check can fail: the weight updates do wait on backward passes.
    updates = [op for op in ops if op.type == "AssignSubVariableOp"]
    assert updates and all(_ancestors(op) & grad_ops for op in updates)


def test_pipelined_unit_k_works_on_the_batch_unit_k_minus_1_took_a_step_earlier():
    net, final = _net(num_blocks=2, layers_per_block=2)
    outs = _run(net, final, steps=4, lr=0.0)  # fixed weights: each output is a plain forward
    ctx = FPropContext(training=False)
    for t in range(1, 4):
        x_prev, targets_prev = _batch(t - 1)
        expected = net(ctx, x_prev, targets_prev).output
        np.testing.assert_allclose(outs[t][1].numpy(), expected.numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(outs[t][2].numpy(), targets_prev["label"].numpy())
    assert int(net.vars["filled"].numpy()) == 1


def test_the_first_steps_fill_the_pipeline():
    net, final = _net(num_blocks=3)
    x, targets = _batch(0)
    step = _train_step(net, final)
    valid = []
    for t in range(4):
        ctx = FPropContext(training=True, step=t)
        out = net(ctx, x, targets)
        valid.append([float(v) for v in out.valid])
        step(x, targets, tf.constant(t, tf.int64))
    assert valid == [[1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]]


def test_the_hand_off_is_checkpointed_so_resuming_is_bit_identical(tmp_path):
    net, final = _net(num_blocks=3, window=2)
    _run(net, final, steps=6)
    reference = [v.numpy() for v in net.variables]

    net1, final1 = _net(num_blocks=3, window=2)
    _run(net1, final1, steps=3)
    ckpt = tf.train.Checkpoint(net=net1, final=final1)
    path = ckpt.write(str(tmp_path / "ckpt"))
    assert any("handoff" in name for name, _ in tf.train.list_variables(path))

    net2, final2 = _net(num_blocks=3, window=2)
    _run(net2, final2, steps=1, lr=0.0, start=50)  # creates the state; its values are overwritten
    tf.train.Checkpoint(net=net2, final=final2).read(path).assert_consumed()
    _run(net2, final2, steps=3, start=3)
    resumed = [v.numpy() for v in net2.variables]
    assert len(resumed) == len(reference)
    for a, b in zip(reference, resumed):
        np.testing.assert_array_equal(a, b)


def test_evaluation_runs_the_blocks_in_order_on_the_batch():
    net, final = _net(num_blocks=2, layers_per_block=2)
    x, targets = _batch(0)
    out = net(FPropContext(training=False), x, targets)
    y = x
    for layer in net.block_layers(0) + net.block_layers(1):
        y = layer(FPropContext(training=False), y)
    np.testing.assert_allclose(out.output.numpy(), y.numpy(), rtol=1e-6)
    assert out.aux[0] is not None and set(out.aux[0]) == {"loss", "accuracy"}
    assert set(lp.aux_metrics(out)) == {"block0_aux_loss", "block0_aux_accuracy"}


def test_the_reported_loss_is_the_task_loss():
    net, final = _net(num_blocks=2)
    _run(net, final, steps=2)
    x, targets = _batch(7)
    ctx = FPropContext(training=True)
    out, losses = _losses(net, final, ctx, x, targets)
    assert float(lp.loss_with_local_gradient(losses[-1], out)) == float(losses[-1])
    assert float(lp.objective(losses[-1], out)) == pytest.approx(float(losses[0] + losses[1]), rel=1e-6)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(window=1, stride=2), "stride=2 > window=1"),
        (dict(aux_heads=[]), "aux_heads has 0 entries for 4 blocks"),
        (dict(devices=["/device:CPU:0"]), "lists 1 devices for 4 blocks"),
        (dict(num_blocks=9), "num_stages=9 but there are only 4 layers"),
        (dict(partition_method="flops"), "needs params.input_shape"),
    ],
)
def test_bad_settings_are_one_line_config_errors(overrides, message):
    net_kwargs = {k: v for k, v in overrides.items() if k in ("window", "stride")}
    extra = {k: v for k, v in overrides.items() if k not in ("window", "stride")}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as e:
        if "aux_heads" in extra or "num_blocks" in extra:
            p = lp.LocalParallelLayer.Params().set(
                name="net",
                layers=[
                    core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=DIM, output_dim=DIM)
                    for i in range(4)
                ],
                num_blocks=extra.get("num_blocks", 4),
                aux_heads=extra.get("aux_heads", []),
            )
            p.instantiate()
        else:
            _net(**net_kwargs, **extra)
    assert "\n" not in str(e.value) and str(e.value).startswith("net")


def test_blocks_reuse_gpipe_partitioning_and_devices():
    layers = [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=DIM, output_dim=width, activation="tanh")
        for i, width in enumerate([DIM, DIM, DIM])
    ]
    layers.append(core.ProjectionLayer.Params().set(name="wide", input_dim=DIM, output_dim=DIM * 40))
    head = lp.PooledSoftmaxHead.Params().set(input_dim=DIM, num_classes=CLASSES)
    p = lp.LocalParallelLayer.Params().set(
        name="net",
        layers=layers,
        num_blocks=2,
        partition_method="flops",
        input_shape=[None, DIM],
        aux_heads=[head],
    )
    net = p.instantiate()
    assert net.block_bounds == [0, 3, 4]  # the wide layer costs more than the other three together
    assert net.devices == ["/device:CPU:0", "/device:CPU:1"]
    assert net.block_variables(1)[0].device.endswith("CPU:1")
    assert net.head_variables(0)[0].device.endswith("CPU:0")
    report = net.partition_report()
    assert "4 layers in 2 blocks (window=1, stride=1, pipelined)" in report and "flops" in report
