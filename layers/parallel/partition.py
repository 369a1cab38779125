"""Cutting a sequence of layers into contiguous parts (GPipe stages, local-parallel blocks), and what
each layer costs. ``cut`` is the one partitioner of both; they differ only in the cost they balance.

A cut is given by its stage bounds ``[0, b1, ..., n]``: stage k holds layers ``bounds[k]:bounds[k+1]``.
``balanced_bounds`` picks the cut minimizing the most expensive stage (the pipeline's step time is
set by its slowest stage), exactly, by dynamic programming over prefix sums. Layer costs come from
the parameter count, from FLOPs counted on each layer's traced graph, or from measured time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext
from params.errors import ConfigError

METHODS = ("uniform", "params", "flops", "measured")


# ------------------------------------------------------------------------------------------ cuts
def cut(
    num_layers: int,
    num_parts: int,
    split_points: Sequence[int],
    method: str,
    costs: Callable[[str], Sequence[float]],
) -> list[int]:
    """The bounds of ``num_parts`` parts of ``num_layers`` layers: at ``split_points`` when given,
    else by ``method``: ``uniform`` (equal layer counts), or the cut balancing ``costs(method)`` (one
    cost per layer: parameter bytes, FLOPs or seconds, computed only when needed)."""
    if split_points:
        return bounds_from_split_points(split_points, num_layers)
    if method == "uniform" or num_parts == 1:
        return uniform_bounds(num_layers, num_parts)
    _check_counts(num_layers, num_parts)  # before any cost is estimated
    return balanced_bounds(costs(method), num_parts)


def uniform_bounds(num_layers: int, num_stages: int) -> list[int]:
    """Stages of equal layer count; the first ``num_layers % num_stages`` stages get one more."""
    _check_counts(num_layers, num_stages)
    size, extra = divmod(num_layers, num_stages)
    bounds = [0]
    for k in range(num_stages):
        bounds.append(bounds[-1] + size + (1 if k < extra else 0))
    return bounds


def balanced_bounds(costs: Sequence[float], num_stages: int) -> list[int]:
    """The contiguous cut into ``num_stages`` non-empty stages whose largest stage cost is smallest.

    Exact: ``best[k][i]`` is the smallest possible maximum over the first ``i`` layers cut into ``k``
    stages; O(num_stages * n^2). Among equally good cuts the one with the earliest last bound wins.
    """
    n = len(costs)
    _check_counts(n, num_stages)
    if any(c < 0 or not math.isfinite(c) for c in costs):
        raise ConfigError(f"layer costs must be finite and >= 0, got {list(costs)}")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + float(c))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        # Stage k (1-based) ends at layer i and starts at j; every earlier stage needs a layer.
        for i in range(k, n - (num_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    bounds = [n]
    for k in range(num_stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return bounds[::-1]


def bounds_from_split_points(split_points: Sequence[int], num_layers: int) -> list[int]:
    """``[0, *split_points, num_layers]``, checked to be strictly increasing inside (0, num_layers)."""
    bounds = [0, *[int(s) for s in split_points], num_layers]
    if any(b >= a for a, b in zip(bounds[1:], bounds[:-1])):
        raise ConfigError(
            f"split_points must be strictly increasing layer indices in (0, {num_layers}) so that every "
            f"stage has a layer, got {list(split_points)}"
        )
    return bounds


def stage_sums(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    """The total cost of each stage of a cut."""
    return [float(sum(costs[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]


def _check_counts(num_layers: int, num_stages: int) -> None:
    if num_stages < 1:
        raise ConfigError(f"num_stages must be >= 1, got {num_stages}")
    if num_stages > num_layers:
        raise ConfigError(
            f"num_stages={num_stages} but there are only {num_layers} layers; each stage needs at least "
            f"one layer, so use num_stages <= {num_layers}"
        )


# ----------------------------------------------------------------------------------------- costs
def probes(parent: BaseLayer, layer_params: Sequence[Any], prefix: str = "layer") -> list[BaseLayer]:
    """The layers built outside ``parent``'s children, to estimate their costs: the caller drops them
    and builds the real ones on their devices (initialization is stateless: the same weights)."""
    built = []
    for i, lp in enumerate(layer_params):
        q = lp.copy()
        q.name = lp.name or f"{prefix}_{i}"
        built.append(q.cls(q, parent=parent))
    return built


def layer_costs(
    method: str,
    layers: Sequence[BaseLayer],
    spec: Callable[[bool], Any] | None,
    record: dict[str, list[float]],
) -> list[float]:
    """Each layer's cost under ``method``: ``params`` its parameter bytes, ``flops`` its forward FLOPs
    traced at ``spec(False)``, ``measured`` its forward + backward seconds at ``spec(True)`` (the input
    one part really gets: GPipe a micro-batch, local parallelism the batch). This input is all that
    differs between the two; every cost computed on the way is kept in ``record`` for the report.
    ``spec`` is None when the layer has no ``params.input_shape``, which only ``params`` can do without.
    """
    if method == "params":
        record["param_bytes"] = [float(parameter_bytes(x)) for x in layers]
        return record["param_bytes"]
    if spec is None:
        raise ConfigError(
            f"partition_method={method!r} needs params.input_shape (the shape of one input batch, "
            "e.g. [32, 784])"
        )
    record["flops"] = [float(f) for f in traced_flops(layers, spec(False))]
    if method == "flops":
        return record["flops"]
    record["seconds"] = measured_seconds(layers, spec(True))
    return record["seconds"]


def parameter_bytes(layer: BaseLayer) -> int:
    """Bytes of all the layer's variables."""
    return int(sum(np.prod(v.shape) * v.dtype.size for v in layer.variables))


def _elements(shape: tf.TensorShape) -> int | None:
    return shape.num_elements() if shape.rank is not None and shape.is_fully_defined() else None


# Ops that move or describe data but compute nothing worth counting.
_FREE_OPS = frozenset(
    {
        "Const", "Identity", "IdentityN", "Placeholder", "ReadVariableOp", "Reshape", "Shape", "ShapeN",
        "NoOp", "Squeeze", "ExpandDims", "StopGradient", "Cast", "StridedSlice", "Slice", "Pack",
        "Unpack", "ConcatV2", "Split", "SplitV", "Transpose", "Fill", "ZerosLike", "OnesLike", "Range",
        "Size", "Rank", "BroadcastTo", "BroadcastArgs", "StatelessRandomGetKeyCounter",
    }
)  # fmt: skip


def _einsum_flops(op: tf.Operation) -> int | None:
    equation = op.get_attr("equation").decode()
    inputs_spec, _, _ = equation.partition("->")
    sizes: dict[str, int] = {}
    for spec, tensor in zip(inputs_spec.split(","), op.inputs):
        shape = tensor.shape
        if shape.rank is None or not shape.is_fully_defined():
            return None
        named = spec.replace("...", "")
        ellipsis_rank = shape.rank - len(named)
        labels = [f"...{i}" for i in range(ellipsis_rank)] if "..." in spec else []
        head, _, tail = spec.partition("...") if "..." in spec else (spec, "", "")
        labels = list(head) + labels + list(tail)
        for label, dim in zip(labels, shape.as_list()):
            sizes[label] = max(sizes.get(label, 1), dim)
    return (2 if len(op.inputs) > 1 else 1) * math.prod(sizes.values())


def op_flops(op: tf.Operation) -> int:
    """Estimated floating-point operations of one graph op (multiply-add = 2); 0 when unknown."""
    kind = op.type
    if kind in _FREE_OPS or not op.outputs:
        return 0
    out = op.outputs[0]
    n_out = _elements(out.shape)
    if n_out is None:
        return 0
    if kind == "MatMul":
        a = op.inputs[0].shape
        depth = a[0] if op.get_attr("transpose_a") else a[-1]
        return 2 * n_out * int(depth or 0)
    if kind.startswith("BatchMatMul"):
        a = op.inputs[0].shape
        depth = a[-2] if op.get_attr("adj_x") else a[-1]
        return 2 * n_out * int(depth or 0)
    if kind == "Einsum":
        return _einsum_flops(op) or 0
    if kind in ("Conv2D", "Conv3D"):
        window = op.inputs[1].shape.as_list()
        return 2 * n_out * math.prod(window[:-1])
    if kind == "DepthwiseConv2dNative":
        window = op.inputs[1].shape.as_list()
        return 2 * n_out * window[0] * window[1]
    if kind in ("MaxPool", "AvgPool", "MaxPoolV2"):
        return n_out * math.prod(op.get_attr("ksize"))
    if not out.dtype.is_floating:
        return 0
    return n_out


def graph_flops(graph: tf.Graph) -> int:
    """Estimated forward FLOPs of the ops of a traced graph."""
    return sum(op_flops(op) for op in graph.get_operations())


def _spec_of(value: Any) -> Any:
    return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), value)


def _with_batch(spec: Any, batch: int) -> Any:
    def fix(s: tf.TensorSpec) -> tf.TensorSpec:
        dims = [batch if d is None else d for d in s.shape.as_list()]
        return tf.TensorSpec(dims, s.dtype)

    return tf.nest.map_structure(fix, spec)


def input_spec(shape: Sequence[int | None], dtype: str) -> tf.TensorSpec:
    """The TensorSpec of a pipeline input; a None (batch) dimension becomes 1."""
    if not shape or any(d is not None and (not isinstance(d, int) or d <= 0) for d in shape):
        raise ConfigError(f"input_shape must be a list of positive ints (None allowed), got {shape!r}")
    try:
        tf_dtype = tf.as_dtype(dtype)
    except TypeError:
        raise ConfigError(f"input_dtype must be a TensorFlow dtype name, got {dtype!r}") from None
    return tf.TensorSpec([1 if d is None else d for d in shape], tf_dtype)


def _trace(layer: BaseLayer, ctx: FPropContext, spec: Any) -> tf.types.experimental.ConcreteFunction:
    fn = tf.function(lambda x: layer(ctx, x), autograph=False)
    try:
        return fn.get_concrete_function(spec)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{layer.path}: cannot trace on input {spec}: {first_line}") from None


def traced_flops(layers: Sequence[BaseLayer], spec: Any) -> list[int]:
    """Forward FLOPs of each layer, each traced once on the previous layer's output spec (an unknown
    dimension counts as 1; give the micro-batch's shape to count one micro-batch)."""
    ctx = FPropContext(training=True, record_updates=False)
    spec = _with_batch(spec, 1)
    flops = []
    for layer in layers:
        concrete = _trace(layer, ctx, spec)
        flops.append(graph_flops(concrete.graph))
        spec = _with_batch(_spec_of(concrete.structured_outputs), 1)
    return flops


def measured_seconds(layers: Sequence[BaseLayer], spec: Any, repeats: int = 5) -> list[float]:
    """Median wall time of each layer's forward + backward on a random input of ``spec`` (give the
    micro-batch's shape: a layer's time is not proportional to its batch size; an unknown dimension
    counts as 1)."""
    ctx = FPropContext(training=True, record_updates=False)
    spec = _with_batch(spec, 1)
    seconds = []
    for layer in layers:
        x = tf.nest.map_structure(_random_like, spec)

        def step(x, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch([t for t in tf.nest.flatten(x) if t.dtype.is_floating])
                y = layer(ctx, x)
                total = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in tf.nest.flatten(y)])
            sources = layer.trainable_variables + tuple(t for t in tf.nest.flatten(x) if t.dtype.is_floating)
            grads = tape.gradient(total, sources) if sources else []
            return y, [g for g in grads if g is not None]

        fn = tf.function(step, autograph=False)
        y, _ = fn(x)
        for _ in range(2):
            tf.nest.map_structure(lambda t: t.numpy(), fn(x))
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), fn(x))
            times.append(time.perf_counter() - start)
        seconds.append(statistics.median(times))
        spec = _spec_of(y)
    return seconds


def _random_like(spec: tf.TensorSpec) -> tf.Tensor:
    if spec.dtype.is_integer:
        return tf.zeros(spec.shape, spec.dtype)
    return tf.random.stateless_uniform(spec.shape, [1, 2], dtype=tf.float32, minval=-1.0, maxval=1.0)


# ---------------------------------------------------------------------------------------- report
def _count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def format_report(
    title: str,
    names: Sequence[str],
    bounds: Sequence[int],
    devices: Sequence[str | None],
    num_params: Sequence[int],
    costs: dict[str, Sequence[float]],
) -> str:
    """A table of stages: device, layers, parameters and each cost column, with each stage's share."""
    num_stages = len(bounds) - 1
    header = ["stage", "device", "layers", "params"] + [f"{name} (share)" for name in costs]
    rows = []
    for k in range(num_stages):
        a, b = bounds[k], bounds[k + 1]
        layer_text = f"{a}-{b - 1} " if b - a > 1 else f"{a} "
        layer_text += ",".join(names[a:b])
        row = [str(k), devices[k] or "(default)", layer_text, _count(sum(num_params[a:b]))]
        for values in costs.values():
            total = sum(values) or 1.0
            stage = sum(values[a:b])
            row.append(f"{_count(stage)} ({100.0 * stage / total:.0f}%)")
        rows.append(row)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [title]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for name, values in costs.items():
        sums = stage_sums(values, bounds)
        mean = sum(sums) / num_stages
        if mean > 0:
            lines.append(f"{name}: slowest stage / mean stage = {max(sums) / mean:.3f}")
    return "\n".join(lines)
