"""Checks shared by the tasks' tests of a pipelined body: the loss computed per micro-batch in the
pipeline's last stage gives the unpipelined task's metrics and gradients, and really runs there."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from layers.base_layer import FPropContext


def unpipelined_name(name: str) -> str:
    """A pipelined task's variable name as the same task without a pipeline names it."""
    return name.replace(".pipeline.", ".").replace("/pipeline/", "/")


def copy_weights(source, target) -> None:
    """Gives ``target`` (pipelined) the weights of ``source`` (unpipelined) by variable name."""
    by_name = {v.name: v for v in source.variables}
    assert len(by_name) == len(target.variables)
    for v in target.variables:
        v.assign(by_name[unpipelined_name(v.name)])


def metrics_and_grads(task, batch: dict, step: int = 0) -> tuple[dict, dict]:
    """One training forward and backward: ``({metric: (value, weight)}, {variable name: grad})``."""
    metrics, grads, _ = metrics_grads_and_xent_ops(task, batch, step)
    return metrics, grads


def metrics_grads_and_xent_ops(task, batch: dict, step: int = 0) -> tuple[dict, dict, list[tf.Operation]]:
    """``metrics_and_grads`` and the softmax cross-entropy ops of the one step graph it traced and
    ran (``xent_ops`` would trace the step a second time)."""
    variables = task.trainable_variables

    @tf.function(autograph=False)
    def run():
        ctx = FPropContext(training=True, step=step, seed=11)
        with tf.GradientTape() as tape:
            metrics = task.fprop(ctx, batch)
        return metrics, tape.gradient(metrics["loss"][0], variables)

    metrics, grads = run()
    ops = _xent_ops_of(run.get_concrete_function().graph)
    metrics = {name: (float(v), float(w)) for name, (v, w) in metrics.items()}
    named = {}
    for v, g in zip(variables, grads):
        assert g is not None, v.name
        named[unpipelined_name(v.name)] = tf.convert_to_tensor(g).numpy()
    return metrics, named, ops


def assert_same(got: tuple[dict, dict], want: tuple[dict, dict], rtol: float, atol: float) -> None:
    got_metrics, got_grads = got
    want_metrics, want_grads = want
    assert sorted(got_metrics) == sorted(want_metrics)
    for name, (value, weight) in want_metrics.items():
        np.testing.assert_allclose(got_metrics[name], (value, weight), rtol=rtol, atol=atol, err_msg=name)
    assert sorted(got_grads) == sorted(want_grads)
    for name, grad in want_grads.items():
        np.testing.assert_allclose(got_grads[name], grad, rtol=rtol, atol=atol, err_msg=name)


def xent_ops(task, batch: dict) -> list[tf.Operation]:
    """The softmax cross-entropy ops of the task's training step graph."""

    def step():
        with tf.GradientTape() as tape:
            metrics = task.fprop(FPropContext(training=True), batch)
        return tape.gradient(metrics["loss"][0], task.trainable_variables)

    return _xent_ops_of(tf.function(step, autograph=False).get_concrete_function().graph)


def _xent_ops_of(graph) -> list[tf.Operation]:
    ops = []
    for op in graph.get_operations():
        if op.type == "SoftmaxCrossEntropyWithLogits":
            ops.append(op)
        for fn in getattr(op, "_func_graphs", []) or []:
            ops.extend(o for o in fn.get_operations() if o.type == "SoftmaxCrossEntropyWithLogits")
    return ops


def assert_loss_runs_per_micro_batch_in_last_stage(task, batch: dict, k: int, m: int, rows: int) -> None:
    """At least M cross-entropy ops (a recompute adds its own), each on one micro-batch's ``rows``
    (examples, or tokens: the logits are flattened to 2-D), each on the last stage's device."""
    assert_xent_ops_per_micro_batch_in_last_stage(xent_ops(task, batch), k, m, rows)


def assert_xent_ops_per_micro_batch_in_last_stage(ops: list[tf.Operation], k: int, m: int, rows: int) -> None:
    """``assert_loss_runs_per_micro_batch_in_last_stage`` on the ops of a step already traced."""
    assert len(ops) >= m, [op.name for op in ops]
    for op in ops:
        assert op.device.endswith(f"device:CPU:{k - 1}"), (op.name, op.device)
        assert op.inputs[0].shape[0] == rows, (op.name, op.inputs[0].shape)
