"""One (stage, micro-batch) of a pipeline as a custom-gradient op, and the order its work runs in.

``StageCall`` runs a stage's forward on one micro-batch now and its backward when the tape asks,
recomputing the forward first under re-materialization. ``BackwardState`` sums each stage's weight
gradients over micro-batches, in the order the schedule runs the backwards, and hands the sums to the
tape once. ``StageOrder`` makes the graph run each stage's forwards and backwards in the order of
``layers.pipeline_schedule.stage_orders``: every unit of work (a forward, or a backward with its
recompute) waits for the end of the stage's previous unit: a forward after a forward through its
inputs (``after``), any other unit through a gate it opens with. The tape builds the
backwards after every forward (and in reverse micro-batch order), so an edge to a unit built earlier
is added to that unit's gate afterwards. That is how 1F1B's "forward m + K - k after backward m" is
enforced inside the one compiled step. Such an edge would close a cycle if micro-batch m's output
gradient depended on a later micro-batch (a loss over the joined outputs rather than per micro-batch
in the last stage): ``StageOrder`` checks that and raises a ConfigError instead.

In eager mode nothing is ordered (ops run as they are called); the gradients are the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from layers import pipeline_schedule as schedules
from layers.base_layer import FPropContext
from layers.pipeline_devices import on
from params.errors import ConfigError

StageFn = Callable[[FPropContext, Any], Any]
SUMS_SCOPE = "weight_gradient_sums"  # the name scope of the sums over micro-batches
Unit = tuple[int, int, str]  # (stage, micro-batch, FORWARD or BACKWARD)


# ------------------------------------------------------------------------------------- the order
class StageOrder:
    """Enforces each stage's order of units in the graph being traced (see the module docstring)."""

    def __init__(self, path: str, schedule: str, num_stages: int, num_micro_batches: int) -> None:
        self._path, self._schedule = path, schedule
        self._enabled = not tf.executing_eagerly()
        self._previous: dict[Unit, Unit] = {}
        for order in schedules.stage_orders(schedule, num_stages, num_micro_batches):
            units = [(op.stage, op.micro_batch, op.kind) for op in order if op.kind != schedules.RECOMPUTE]
            self._previous.update(zip(units[1:], units[:-1]))
        # Whether some forward waits for a backward (1F1B): only then can the order close a cycle.
        self._backward_first = any(
            kind == schedules.FORWARD and before[2] == schedules.BACKWARD
            for (_, _, kind), before in self._previous.items()
        )
        self._ends: dict[Unit, tf.Operation] = {}
        self._waiting: dict[Unit, list[tf.Operation]] = {}
        self._gates: dict[Unit, tf.Operation] = {}
        self._own_ops: set[int] = set()  # gates and ends: the gradient walk does not enter them
        self._forward_outputs: dict[int, Unit] = {}

    @contextlib.contextmanager
    def unit(self, stage: int, micro_batch: int, kind: str) -> Iterator[None]:
        """Every op created inside waits (directly or through its inputs) for the stage's previous unit."""
        if not self._enabled:
            yield
            return
        before = self._previous.get((stage, micro_batch, kind))
        if kind == schedules.FORWARD and (before is None or before[2] == schedules.FORWARD):
            # A stage's forward already takes its inputs after its previous forward's outputs (the
            # data edge of ``after``): a gate would only add executor hops between the stages.
            yield
            return
        end = self._ends.get(before) if before else None
        with tf.control_dependencies([end] if end is not None else []):
            gate = tf.no_op(name="gate")
        self._own_ops.add(gate._id)  # noqa: SLF001
        self._gates[(stage, micro_batch, kind)] = gate
        if before is not None and end is None:
            self._waiting.setdefault(before, []).append(gate)
        with tf.control_dependencies([gate]):
            yield

    def finish(self, stage: int, micro_batch: int, kind: str, tensors: list[Any]) -> None:
        """Marks the unit done once ``tensors`` (its outputs) exist; units waiting for it now wait."""
        if not self._enabled:
            return
        me = (stage, micro_batch, kind)
        deps = [t for t in tensors if t is not None]
        end = tf.group(*deps, name="end") if deps else tf.no_op(name="end")
        self._own_ops.add(end._id)  # noqa: SLF001
        self._ends[me] = end
        if kind == schedules.FORWARD:
            self._forward_outputs.update((t.op._id, me) for t in deps)  # noqa: SLF001
        for gate in self._waiting.pop(me, []):
            gate._add_control_input(end)  # noqa: SLF001 - TF has no public way to order a built op

    def also_wait(self, stage: int, micro_batch: int, kind: str, tensors: list[tf.Tensor]) -> None:
        """Makes the (built) unit wait for ``tensors`` too."""
        gate = self._gates.get((stage, micro_batch, kind)) if self._enabled else None
        if gate is not None:
            for t in tensors:
                gate._add_control_input(t.op)  # noqa: SLF001

    def check_output_gradient(self, micro_batch: int, dys: list[Any]) -> None:
        """Raises a ConfigError if the gradient arriving at the last stage's output of ``micro_batch``
        depends on a later micro-batch's forward: under 1F1B that forward waits for this backward."""
        if not (self._enabled and self._backward_first):
            return
        stack = [d.op for d in dys if d is not None]
        seen: set[int] = set()
        while stack:
            op = stack.pop()
            if op._id in seen or op._id in self._own_ops:  # noqa: SLF001
                continue
            seen.add(op._id)  # noqa: SLF001
            unit = self._forward_outputs.get(op._id)  # noqa: SLF001
            if unit is not None:
                if unit[1] > micro_batch:
                    raise ConfigError(
                        f"{self._path}: schedule={self._schedule} runs micro-batch {micro_batch}'s backward "
                        f"before micro-batch {unit[1]}'s forward, but the gradient reaching micro-batch "
                        f"{micro_batch}'s output depends on micro-batch {unit[1]} (a loss computed on the "
                        "joined outputs, e.g. a mean of squared errors after the pipeline). Compute the "
                        "loss per micro-batch in the last stage (fprop(..., head=...)), as the tasks do, "
                        "or use schedule='fill_drain'"
                    )
                continue
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)


# --------------------------------------------------------------------------- weight-gradient sums
class BackwardState:
    """What the backward passes of one fprop's stages share: the weight-gradient sums.

    The tape calls a stage's gradient functions once per micro-batch, m = M-1 down to 0 (the ordering
    op ``after`` makes it finish micro-batch m + 1 of a stage before m), so micro-batch 0's call hands
    the stage's sums to the tape. Micro-batch 0 is always called when any micro-batch of its stage is:
    ``after`` gives its ordering inputs a zero gradient, which chains every micro-batch of a stage to
    the one before it. So a loss that leaves some micro-batches without a gradient still gets every
    other micro-batch's weight gradients.

    ``ascending`` says in which order the backwards run (1F1B: m = 0 first). The sum is a chain of
    additions in that order, so it advances as each micro-batch's gradient arrives and one running sum
    per weight is alive rather than M gradients.
    """

    def __init__(self, order: StageOrder, ascending: bool) -> None:
        self._order, self._ascending = order, ascending
        self._sums: dict[int, dict[Any, Any]] = {}
        self._parts: dict[int, list[tuple[list[tf.Variable], list[Any]]]] = {}

    def add(self, k: int, m: int, variables: list[tf.Variable], var_grads: list[Any]) -> tuple[list, list]:
        """Returns (the gradients to hand the tape for ``variables``, the tensors that mark this
        backward done)."""
        if self._ascending:
            # This backward is done when its own gradients are (the sums wait for later ones).
            own = [_dense_part(g) for g in var_grads if g is not None]
            parts = self._parts.setdefault(k, [])
            parts.append((variables, var_grads))
            if m > 0:
                return [None] * len(variables), own
            sums: dict[Any, Any] = {}
            for i, (vs, gs) in enumerate(reversed(parts)):  # the tape called m = M-1 first
                _accumulate(sums, vs, gs)
                # The next backward waits for this partial sum: that keeps grappler from folding the
                # chain into one AddN, which would hold every micro-batch's gradient until the last.
                self._order.also_wait(k, i + 1, schedules.BACKWARD, [_dense_part(g) for g in sums.values()])
            del self._parts[k]
            return [sums.get(v.ref()) for v in variables], own
        sums = self._sums.setdefault(k, {})
        _accumulate(sums, variables, var_grads)
        markers = [_dense_part(g) for g in sums.values()]
        if m > 0:
            return [None] * len(variables), markers
        del self._sums[k]
        return [sums.get(v.ref()) for v in variables], markers


def _accumulate(sums: dict[Any, Any], variables: list[tf.Variable], grads: list[Any]) -> None:
    for v, g in zip(variables, grads):
        if g is not None:
            sums[v.ref()] = g if v.ref() not in sums else _add_grads(sums[v.ref()], g)


# ------------------------------------------------------------------------------------ the stage op
@dataclasses.dataclass
class StageCall:
    """One (stage, micro-batch) as a custom-gradient op: forward now, backward when the tape asks."""

    fn: StageFn
    ctx: FPropContext
    m: int
    k: int
    device: str | None
    remat: bool
    state: BackwardState
    order: StageOrder
    last: bool = False  # the last stage: its output gradient comes from outside the pipeline

    def __call__(
        self, xs: list[tf.Tensor], structure: Any, after_outputs: list[tf.Tensor] | None = None
    ) -> tuple[list[tf.Tensor], Any]:
        """Runs the forward on ``xs`` (packed as ``structure``). The first ``len(after_outputs)`` of
        ``xs`` are taken only after ``after_outputs`` (the stage's previous micro-batch) exist."""
        box: dict[str, Any] = {}

        @tf.custom_gradient
        def stage(*args: tf.Tensor) -> Any:
            args = list(args)
            fwd_ctx = self.ctx.for_micro_batch(self.m)
            if self.remat:
                tape = None
                y = self.fn(fwd_ctx, tf.nest.pack_sequence_as(structure, args))
            else:
                with tf.GradientTape(persistent=True) as tape:
                    tape.watch([a for a in args if a.dtype.is_floating])
                    y = self.fn(fwd_ctx, tf.nest.pack_sequence_as(structure, args))
            ys = [tf.convert_to_tensor(v) for v in tf.nest.flatten(y)]
            box["structure"] = y

            def grad(*dys: tf.Tensor, variables: list[tf.Variable] | None = None) -> Any:
                variables = list(variables or [])
                if self.last:
                    self.order.check_output_gradient(self.m, list(dys))
                with on(self.device), tf.name_scope(f"stage_{self.k}_micro_batch_{self.m}_grad"):
                    with self.order.unit(self.k, self.m, schedules.BACKWARD):
                        dys = [tf.zeros_like(y) if d is None else tf.identity(d) for y, d in zip(ys, dys)]
                        if self.remat:
                            grads = self._recompute_grads(args, dys, variables, structure)
                        else:
                            grads = _gradients(tape, ys, dys, args + variables)
                        dxs, dvs = grads[: len(args)], grads[len(args) :]
                    with tf.name_scope(SUMS_SCOPE):  # the sums belong to no one micro-batch
                        dvs, done = self.state.add(self.k, self.m, variables, dvs)
                    self.order.finish(self.k, self.m, schedules.BACKWARD, dxs + done)
                return (dxs, dvs) if variables else dxs

            return ys, grad

        with self.order.unit(self.k, self.m, schedules.FORWARD):
            if after_outputs:
                n = len(after_outputs)
                xs = after(xs[:n], after_outputs) + xs[n:]
            ys = list(stage(*xs))
        self.order.finish(self.k, self.m, schedules.FORWARD, ys)
        return ys, box["structure"]

    def _recompute_grads(
        self, args: list[tf.Tensor], dys: list[tf.Tensor], variables: list[tf.Variable], structure: Any
    ) -> list[Any]:
        # The zero depends on the output gradient: the recompute starts only once it arrives, and its
        # ops differ from the forward's, so grappler cannot merge them back into one (which would keep
        # the activations alive after all).
        zero = _zero_after(dys)
        with tf.control_dependencies([zero]):
            xs = [tf.identity(a) for a in args]
        step = tf.cast(self.ctx.step, tf.int64) + tf.cast(zero, tf.int64)
        ctx = dataclasses.replace(self.ctx.for_micro_batch(self.m, record_updates=False), step=step)
        with tf.GradientTape() as tape, tf.name_scope("recompute"):
            tape.watch([x for x in xs if x.dtype.is_floating])
            tape.watch(variables)
            y = self.fn(ctx, tf.nest.pack_sequence_as(structure, xs))
        ys = [tf.convert_to_tensor(v) for v in tf.nest.flatten(y)]
        return _gradients(tape, ys, dys, xs + variables)


def _gradients(tape: tf.GradientTape, ys: list[tf.Tensor], dys: list[tf.Tensor], sources: list[Any]) -> list:
    pairs = [(y, d) for y, d in zip(ys, dys) if y.dtype.is_floating]
    if not pairs:
        return [None] * len(sources)
    targets, grads = zip(*pairs)
    return tape.gradient(list(targets), sources, output_gradients=list(grads))


# ------------------------------------------------------------------- ops with their own gradients
def after(xs: list[tf.Tensor], deps: list[tf.Tensor]) -> list[tf.Tensor]:
    """``xs``, available only once ``deps`` are. Gradients pass straight through to ``xs``; the
    floating ``deps`` get a zero gradient: the tape then finishes the ops that consume ``xs`` before
    those producing ``deps``, and reaches the producers of ``deps`` whenever it reaches ``xs``'s
    consumers (``BackwardState`` relies on both)."""
    n = len(xs)

    @tf.custom_gradient
    def after_deps(*args: tf.Tensor) -> Any:
        with tf.control_dependencies(args[n:]):
            out = [tf.identity(a) for a in args[:n]]

        def grad(*dys: tf.Tensor) -> list:
            return list(dys) + [_zeros_for(d) for d in args[n:]]

        return out, grad

    return list(after_deps(*xs, *deps))


def split_with_grad_on(device: str | None, x: tf.Tensor, num: int, axis: int) -> list[tf.Tensor]:
    """``tf.split(x, num, axis)`` whose gradient (the parts' gradients concatenated) runs on
    ``device``: the first stage's, not wherever the tape happens to be."""

    @tf.custom_gradient
    def split(x: tf.Tensor) -> Any:
        def grad(*dys: Any) -> tf.Tensor:
            with on(device), tf.name_scope("split_micro_batches_grad"):
                parts = tf.split(tf.zeros_like(x), num, axis=axis) if any(d is None for d in dys) else []
                dense = [tf.convert_to_tensor(d) if d is not None else parts[i] for i, d in enumerate(dys)]
                return tf.concat(dense, axis=axis)

        return tf.split(x, num, axis=axis), grad

    if not x.dtype.is_floating:
        return tf.split(x, num, axis=axis)
    return list(split(x))


def concat_with_grad_on(device: str | None, parts: list[tf.Tensor], axis: int) -> tf.Tensor:
    """``tf.concat(parts, axis)`` whose gradient (the output gradient split back into micro-batches)
    runs on ``device``: the last stage's. The split sizes are static where the shapes are, so a
    part's gradient does not wait for the other parts' forwards (1F1B relies on it)."""
    if not parts[0].dtype.is_floating:
        return tf.concat(parts, axis=axis)

    @tf.custom_gradient
    def concat(*parts: tf.Tensor) -> Any:
        def grad(dy: Any) -> list[tf.Tensor]:
            with on(device), tf.name_scope("join_micro_batches_grad"):
                static = [p.shape[axis] if p.shape.rank is not None else None for p in parts]
                if all(s is not None for s in static):
                    sizes = [int(s) for s in static]
                else:
                    sizes = tf.stack([tf.shape(p)[axis] for p in parts])
                return tf.split(tf.convert_to_tensor(dy), sizes, axis=axis, num=len(parts))

        return tf.concat(parts, axis=axis), grad

    return concat(*parts)


# ----------------------------------------------------------------------------------------- helpers
def _zeros_for(t: tf.Tensor) -> tf.Tensor | None:
    """A zero gradient for ``t`` that does not keep ``t`` alive (None for non-float tensors)."""
    if not t.dtype.is_floating:
        return None
    if t.shape.is_fully_defined():
        return tf.zeros(t.shape, t.dtype)
    return tf.zeros_like(t)


def _zero_after(tensors: list[tf.Tensor]) -> tf.Tensor:
    """A float32 zero computed from ``tensors[0]``'s data, after all ``tensors`` exist."""
    with tf.control_dependencies(list(tensors[1:])):
        elem = tf.reduce_max(tf.cast(tf.reshape(tensors[0], [-1])[:1], tf.float32))
    return tf.where(tf.math.is_finite(elem), elem * 0.0, 0.0)


def _add_grads(a: Any, b: Any) -> Any:
    if isinstance(a, tf.IndexedSlices) or isinstance(b, tf.IndexedSlices):
        a, b = (x if isinstance(x, tf.IndexedSlices) else _as_slices(x) for x in (a, b))
        return tf.IndexedSlices(
            tf.concat([a.values, b.values], 0), tf.concat([a.indices, b.indices], 0), a.dense_shape
        )
    return a + b


def _as_slices(x: tf.Tensor) -> tf.IndexedSlices:
    return tf.IndexedSlices(x, tf.range(tf.shape(x)[0]), tf.shape(x, out_type=tf.int64))


def _dense_part(g: Any) -> tf.Tensor:
    return g.values if isinstance(g, tf.IndexedSlices) else g
