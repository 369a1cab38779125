"""The graph cut of a segment's weight gradients: where W (the weight half of a split backward) starts.

Per variable a segment's tape watched, the cut is the outputs of the ops that first combine it with
the segment's inputs (a dense layer's product and bias sum), read from the traced graph through
public ``Tensor.op`` / ``Operation.inputs``. I (the input half) takes the gradients at the cut on its
way to the stage's input; W then asks the tape for each weight's gradient from there
(``frontier_weight_grads``: a dense layer's input times its product's gradient), so it repeats
nothing of I and keeps neither the layer's output nor its output gradient alive.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

Frontier = list[tuple[tf.Variable, list[tf.Tensor]]]
MAX_SEGMENT_OPS = 2000  # the most ops the cut looks through in one segment


def weight_frontier(
    tape: tf.GradientTape, inputs: list[tf.Tensor], outputs: list[tf.Tensor]
) -> Frontier | None:
    """Per variable the segment watched, the outputs of the ops that first combine it with the
    segment's inputs (read from the traced graph: public ``Tensor.op`` / ``Operation.inputs``). None
    (W then starts from the segment's outputs) in eager mode, or where a cut would not be clean: a
    variable the graph does not show, a combining op with several outputs, or one combining op of a
    variable feeding another of the same variable (its gradient would count twice)."""
    variables = list(tape.watched_variables())
    if tf.executing_eagerly() or not variables or not outputs:
        return None
    graph = outputs[0].graph
    handles = {id(ext): internal for ext, internal in getattr(graph, "captures", [])}
    owner: dict[str, int] = {}
    for i, v in enumerate(variables):
        handle = getattr(v, "handle", None)
        internal = handles.get(id(handle))
        if internal is None:
            return None
        owner[internal.name] = i
    starts = {t.name for t in inputs}
    ops: dict[str, tf.Operation] = {}  # the segment: the outputs' ancestors back to its inputs
    stack = [t.op for t in outputs if t.name not in starts]
    while stack:
        op = stack.pop()
        if op.name in ops:
            continue
        ops[op.name] = op
        if len(ops) > MAX_SEGMENT_OPS:  # not one layer's forward (a seed from the backward?): no cut
            return None
        stack += [t.op for t in op.inputs if t.name not in starts]
    active: dict[str, bool] = {}  # op -> computed from the segment's inputs
    reads: dict[str, frozenset[int]] = {}  # op -> the variables it is computed from, inputs aside
    for op in ops.values():
        _classify(op, ops, starts, owner, active, reads)
    combining: dict[int, list[tf.Operation]] = {i: [] for i in range(len(variables))}
    for op in ops.values():
        if not active[op.name]:
            continue
        direct = {owner[t.name] for t in op.inputs if t.name in owner}
        for t in op.inputs:
            if t.op.name in ops and not active[t.op.name]:
                direct |= reads[t.op.name]
        for i in direct:
            combining[i].append(op)
    out = []
    for i, v in enumerate(variables):
        cut = combining[i]
        if not cut or any(len(op.outputs) != 1 or not op.outputs[0].dtype.is_floating for op in cut):
            return None
        if len(cut) > 1 and any(_feeds(a, b, ops) for a in cut for b in cut if a is not b):
            return None
        out.append((v, [op.outputs[0] for op in cut]))
    return out


def _classify(
    op: tf.Operation,
    ops: dict[str, tf.Operation],
    starts: set[str],
    owner: dict[str, int],
    active: dict[str, bool],
    reads: dict[str, frozenset[int]],
) -> None:
    """Fills ``active`` (computed from the segment's inputs) and ``reads`` (the variables an inactive
    op is computed from) for ``op`` and its ancestors in ``ops``, inputs first."""
    order = [op]
    while order:
        top = order[-1]
        pending = [t.op for t in top.inputs if t.op.name in ops and t.op.name not in active]
        if pending:
            order += pending
            continue
        order.pop()
        if top.name in active:
            continue
        active[top.name] = any(t.name in starts or active.get(t.op.name, False) for t in top.inputs)
        found: set[int] = set()
        for t in top.inputs:
            if t.name in owner:
                found.add(owner[t.name])
            elif t.op.name in ops and not active[t.op.name]:
                found |= reads[t.op.name]
        reads[top.name] = frozenset(found)


def _feeds(a: tf.Operation, b: tf.Operation, ops: dict[str, tf.Operation]) -> bool:
    """Whether ``a`` is an ancestor of ``b`` inside the segment ``ops``."""
    seen, stack = set(), [t.op for t in b.inputs]
    while stack:
        op = stack.pop()
        if op is a:
            return True
        if op.name in seen or op.name not in ops:
            continue
        seen.add(op.name)
        stack += [t.op for t in op.inputs]
    return False


def frontier_weight_grads(tape: tf.GradientTape, frontier: Frontier, frontier_grads: list[Any]) -> list[Any]:
    """W from the cut: each variable's gradient from its combining ops' output gradients
    (``frontier_grads``, which I took, in the order of ``frontier``'s tensors), reading only their
    other inputs (a dense layer's input). None for a variable no gradient reached."""
    grads, at = [], 0
    for v, ts in frontier:
        gs = list(frontier_grads[at : at + len(ts)])
        at += len(ts)
        pairs = [(t, g) for t, g in zip(ts, gs) if g is not None]
        if not pairs:
            grads.append(None)
            continue
        ys, dys = zip(*pairs)
        grads.append(tape.gradient(list(ys), v, output_gradients=list(dys)))
    return grads
