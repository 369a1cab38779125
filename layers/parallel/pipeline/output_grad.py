"""The output gradients a pipeline's last stage starts its backwards from.

Deferred (fill_drain), they are the tape's: the gradient of the pipeline's outputs, given to the
gradient function (``from_tape``). In-step (a device runs forwards after backwards), each
micro-batch's backward is built in the forward pass, before that gradient exists: the last stage
starts from ones on the head's loss outputs (``ones``), and the gradient function finds the one
constant c the loss puts on them (``scale_of``), with checks that fail the step with one clear error
where the loss is not c times the sum of the per-example values.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from layers.parallel.pipeline.segment import TapedSegment


def loss_marks(structure: Any, n: int) -> list[bool]:
    """Which of the last stage's ``n`` flat outputs (nest ``structure``) the loss is made of: the
    head's ``loss`` entry when it returns a dict with one, else every output."""
    if isinstance(structure, dict) and "loss" in structure:
        marks = {key: tf.nest.map_structure(lambda _, k=key: k == "loss", v) for key, v in structure.items()}
        return [bool(x) for x in tf.nest.flatten(marks)]
    return [True] * n


def ones(ys: list[tf.Tensor], marks: list[bool]) -> list[Any]:
    """In-step: ones on the float outputs the loss is made of, zeros on the others (metrics beside
    the loss), None on the rest; the gradient function scales them."""
    return [
        (tf.ones_like(y) if on else tf.zeros_like(y)) if y.dtype.is_floating else None
        for y, on in zip(ys, marks)
    ]


def from_tape(ys: list[tf.Tensor], dys: list[Any]) -> list[Any]:
    """Deferred: the tape's output gradients (None for an unused output: zeros)."""
    return [
        (tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)) if y.dtype.is_floating else None
        for y, d in zip(ys, dys)
    ]


def differentiable(last: TapedSegment, num_head_inputs: int) -> list[bool]:
    """Which of the last segment's outputs carry a gradient back to the activations or weights (a
    count of correct answers times the examples' weights does not). The probe gradients feed
    nothing, so the compiled step prunes them."""
    activations = last.inputs[: len(last.inputs) - num_head_inputs]
    sources = [x for x in activations if x.dtype.is_floating] + list(last.tape.watched_variables())
    out = []
    for y in last.outputs:
        if not y.dtype.is_floating or not sources:
            out.append(False)
            continue
        grads = last.tape.gradient(y, sources)
        out.append(any(g is not None for g in grads))
    return out


def scale_of(
    what: str, per_m: list[list[Any]], dtype: tf.DType, reached: list[bool], marks: list[bool]
) -> tuple[tf.Tensor, list[Any]]:
    """In-step: the loss's output gradient c (one constant on every float output that ``reached``
    a gradient and the loss is made of, ``marks``), and the checks that it is one; ``what`` starts
    their message (the layer and the schedule)."""
    given = [
        (m, i, d) for m, dys in enumerate(per_m) for i, d in enumerate(dys) if reached[i] and d is not None
    ]
    with_c = [g for g in given if marks[g[1]]]
    if not with_c:
        return tf.zeros([], dtype), []
    c = tf.reshape(with_c[0][2], [-1])[0]
    checks = []
    for m, i, d in given:
        d = tf.convert_to_tensor(d)
        want = tf.cast(c, d.dtype) if marks[i] else tf.zeros([], d.dtype)
        off = tf.reduce_max(tf.abs(d - want))
        tol = 1e-5 * tf.abs(tf.cast(c, d.dtype)) + tf.cast(1e-30, d.dtype)
        message = (
            f"{what} runs each micro-batch's backward inside the step's forward, so the loss must be one "
            "constant times the sum of the head's per-example outputs (its 'loss' entry if it returns a "
            f"dict with one; nothing from the others); the gradient of output {i} of micro-batch {m} is "
            "not. Scale the per-example values in the head, or use schedule='fill_drain'"
        )
        checks.append(tf.debugging.assert_less_equal(off, tol, message=message))
    return c, checks
