"""A stage's segments under their own tapes: recording them, one backward pass, and which weight
gradients the weight half of a split backward (W) takes.

A stage is a sequence of segments (its layers, and in the last stage the head). ``record`` runs them
on a micro-batch, each under a ``tf.GradientTape`` kept with its flat inputs and outputs
(``TapedSegment``). ``backward`` is one tape call from output gradients to input gradients (and any
other sources: weights, or the weight gradient's cut, ``weight_cut``). ``choose_deferred`` marks the
first segments whose weight gradients W takes within a byte budget (``memory.deferred_segments``);
the input half (I) takes the others' in its backward pass, as a full backward (B) does.
``WeightSums`` adds the micro-batches' weight gradients up as they come.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from layers.base_layer import FPropContext
from layers.parallel.pipeline import memory
from layers.parallel.pipeline.weight_cut import Frontier

Segment = Callable[[FPropContext, Any], Any]
HeadFn = Callable[[FPropContext, Any, Any], Any]
SUMS_SCOPE = "weight_gradient_sums"  # the name scope of the sums over micro-batches


@dataclasses.dataclass
class TapedSegment:
    """One segment's forward on one micro-batch: its tape, flat inputs and outputs, and (after I)
    the gradient arriving at its outputs."""

    tape: tf.GradientTape
    inputs: list[tf.Tensor]
    outputs: list[tf.Tensor]
    output_grads: list[Any] | None = None
    # Per watched variable, the outputs of the ops that first combine it with the activations (a
    # dense layer's product and bias sum): I takes their gradients, and W needs only those and the
    # products' other inputs, not the layer's outputs and output gradients. None: W starts from the
    # segment's outputs.
    frontier: Frontier | None = None
    frontier_grads: list[Any] | None = None
    # Whether W takes this segment's weight gradient (else I does, in its one backward pass, as B).
    deferred: bool = True


def stage_segments(layers: list[Segment], head: HeadFn | None = None) -> list[Segment]:
    """A stage as segments: its ``layers``, and with a ``head`` (last stage) the head last, the
    head's inputs carried beside the activations (``(x, head_inputs)``): the units of its
    backward's input and weight halves."""
    segments: list[Segment] = list(layers)
    if head is None:
        return segments

    def first(ctx: FPropContext, x_and_head_inputs: Any) -> Any:
        x, head_inputs = x_and_head_inputs
        return segments[0](ctx, x), head_inputs

    def middle(layer: Segment) -> Segment:
        return lambda ctx, pair: (layer(ctx, pair[0]), pair[1])

    def run_head(ctx: FPropContext, pair: Any) -> Any:
        return head(ctx, pair[0], pair[1])

    return [first] + [middle(layer) for layer in segments[1:]] + [run_head]


def chain(segments: list[Segment]) -> Segment:
    """``segments`` as one: each applied to the previous one's output."""

    def run(ctx: FPropContext, x: Any) -> Any:
        for segment in segments:
            x = segment(ctx, x)
        return x

    return run


def record(segments: list[Segment], ctx: FPropContext, x: Any, taped: list[TapedSegment] | None) -> Any:
    """``segments`` run in order on the nest ``x``; with ``taped``, each under its own tape,
    appended there."""
    for segment in segments:
        if taped is None:
            x = segment(ctx, x)
            continue
        flat_in = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
        x = tf.nest.pack_sequence_as(x, flat_in)
        with tf.GradientTape(persistent=True, watch_accessed_variables=True) as tape:
            tape.watch([t for t in flat_in if t.dtype.is_floating])
            x = segment(ctx, x)
        flat_out = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
        x = tf.nest.pack_sequence_as(x, flat_out)
        taped.append(TapedSegment(tape, flat_in, flat_out))
    return x


def backward(
    tape: tf.GradientTape, pairs: list[tuple[tf.Tensor, Any]], inputs: list[tf.Tensor], others: list[Any]
) -> tuple[list[Any], list[Any]]:
    """One backward pass through a segment's ``tape`` from its (output, output gradient) ``pairs``:
    the gradient at each position of ``inputs``, and at each of ``others`` (weights, or the weight
    gradient's cut).

    A structure may hold one tensor under several keys (a skip connection keeps the activation it
    branches from). The tape gives such a tensor its whole gradient at every position it is asked
    for, while everything downstream treats the gradients as one per position and sums repeats: a
    previous segment's tape sums the output gradients of a repeated output, ``tf.custom_gradient``
    sums the gradients of a repeated input. So the whole gradient goes to a tensor's first position
    and None (no gradient) to its repeats: the sums downstream count it once."""
    ys, gs = zip(*pairs)
    first: dict[int, int] = {}
    for i, x in enumerate(inputs):
        first.setdefault(id(x), i)
    unique = [x for i, x in enumerate(inputs) if first[id(x)] == i]
    grads = tape.gradient(list(ys), unique + list(others), output_gradients=list(gs))
    by_id = {id(x): g for x, g in zip(unique, grads)}
    input_grads = [by_id[id(x)] if first[id(x)] == i else None for i, x in enumerate(inputs)]
    return input_grads, list(grads[len(unique) :])


def choose_deferred(
    pieces: list[TapedSegment], free: set[int] | frozenset[int], budget: Callable[[int | None], int | None]
) -> None:
    """Marks the stage's segments whose weight gradient W takes: ``deferred_segments`` within
    ``budget`` of what the forward keeps (``segment_bytes``)."""
    kept, held = segment_bytes(pieces, free)
    count = memory.deferred_segments(budget(kept), held)
    for i, piece in enumerate(pieces):
        piece.deferred = i < count


def segment_bytes(
    pieces: list[TapedSegment], free: set[int] | frozenset[int]
) -> tuple[int | None, list[int | None]]:
    """From the static shapes: what the stage's forward keeps of a micro-batch (the float inputs and
    outputs of its segments with weights, each once), and per segment what its W would hold (its
    inputs and its outputs' gradients; 0 without weights). A tensor a segment passes through
    unchanged (the head's inputs on the way to the head) counts for neither, nor do the pipeline's
    own inputs (``free``: slices of the batch, held anyway). None where a size is unknown."""
    kept: dict[int, int | None] = {}
    held: list[int | None] = []
    for piece in pieces:
        if not piece.tape.watched_variables():
            held.append(0)
            continue
        through = {id(t) for t in piece.inputs} & {id(t) for t in piece.outputs}
        tensors = [
            t
            for t in piece.inputs + piece.outputs
            if t.dtype.is_floating and id(t) not in through and id(t) not in free
        ]
        sizes = [_static_bytes(t) for t in tensors]
        kept.update(zip([id(t) for t in tensors], sizes))
        held.append(None if None in sizes else sum(sizes))
    if None in kept.values():
        return None, held
    return sum(int(b or 0) for b in kept.values()), held


def _static_bytes(t: tf.Tensor) -> int | None:
    if not t.shape.is_fully_defined():
        return None
    return int(t.shape.num_elements()) * t.dtype.size


class WeightSums:
    """The step's weight gradients summed over micro-batches, and the stage each came from."""

    def __init__(self) -> None:
        self.sums: dict[Any, Any] = {}
        self.stage: dict[Any, int] = {}

    def add(self, s: int, variables: list[tf.Variable], grads: list[Any]) -> list[Any]:
        """Adds one micro-batch's weight gradients of stage ``s``; the sums it changed."""
        produced = []
        with tf.name_scope(SUMS_SCOPE):  # the sums belong to no one micro-batch
            for v, g in zip(variables, grads):
                if g is None:
                    continue
                key = v.ref()
                self.stage[key] = s
                self.sums[key] = g if key not in self.sums else _add_grads(self.sums[key], g)
                produced.append(self.sums[key])
        return produced


def after(sums: list[Any]) -> Any:
    """A context whose ops wait for ``sums`` (the previous segment's weight-gradient sums): each
    segment's weight gradient is added to the sums before the next segment's gradients are computed,
    so one segment's weight gradient at a time is alive beside the sums (left free, TensorFlow ran a
    stage's products first and kept every segment's weight gradient until the adds)."""
    return tf.control_dependencies([dense_part(t) for t in sums])


def zero_after(tensors: list[tf.Tensor]) -> tf.Tensor:
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


def dense_part(g: Any) -> tf.Tensor:
    return g.values if isinstance(g, tf.IndexedSlices) else g


def scaled(g: Any, scale: Any) -> Any:
    if g is None or scale is None:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices, g.dense_shape)
    return g * tf.cast(scale, g.dtype)
