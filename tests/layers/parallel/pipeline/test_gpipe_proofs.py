"""Proofs of what the pipeline claims beyond its numbers: every op of stage k, forward and backward,
is placed on device k in the traced step (the micro-batch split's and join's gradients included),
and in a profiled step stage 0's forward of micro-batch m + 1 runs while stage 1's forward of m does."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe

_STAGE_SCOPE = re.compile(r"(?:^|/)stage_(\d+)_micro_batch_(\d+)(_grad)?/")


def _layers(width: int, depth: int):
    return [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=width, output_dim=width, activation="relu")
        for i in range(depth)
    ]


def _pipeline(k: int, m: int, remat: str, width: int = 8, depth: int = 4) -> gpipe.GPipeLayer:
    return (
        gpipe.GPipeLayer.Params()
        .set(name="net", layers=_layers(width, depth), num_stages=k, num_micro_batches=m, remat=remat)
        .instantiate()
    )


def _train_step(pipe: gpipe.GPipeLayer, x: tf.Tensor):
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            tape.watch(x)  # the input's gradient too: it passes the split's gradient
            loss = tf.reduce_mean(tf.square(pipe(FPropContext(training=True), x)))
        *grads, input_grad = tape.gradient(loss, [*pipe.trainable_variables, x])
        for v, g in zip(pipe.trainable_variables, grads):
            v.assign_sub(0.01 * g)
        return loss + 0.0 * tf.reduce_sum(input_grad)

    return step


# --------------------------------------------------------------------------------- placement
def _ops_by_stage(graph: tf.Graph) -> dict[tuple[int, bool], list[tf.Operation]]:
    """The graph's ops under a ``stage_<k>_micro_batch_<m>[_grad]`` scope, by (k, is_backward): a
    recomputing backward opens ``..._grad``; without remat the forward's tape names its gradient ops
    ``gradient_tape/stage_<k>_micro_batch_<m>/...``."""
    found: dict[tuple[int, bool], list[tf.Operation]] = {}
    for op in graph.get_operations():
        match = _STAGE_SCOPE.search(op.name)
        if match:
            backward = bool(match.group(3)) or "gradient_tape/" in op.name
            found.setdefault((int(match.group(1)), backward), []).append(op)
    return found


def _device_of(op: tf.Operation, graph: tf.Graph) -> str:
    """The op's device in the traced graph. A captured variable handle (a resource placeholder) has
    none there and a read of it none either: TensorFlow runs them where the variable lives."""
    if op.device:
        return op.device
    if op.type == "Placeholder" and op.outputs[0].dtype == tf.resource:
        outer = {id(inner.op): external for external, inner in graph.captures}
        return outer[id(op)].device if id(op) in outer else ""
    if op.type == "ReadVariableOp":
        return _device_of(op.inputs[0].op, graph)
    return ""


def _check_placement(k: int, m: int, remat: str) -> None:
    pipe = _pipeline(k, m, remat)
    graph = _train_step(pipe, tf.ones([8, 8])).get_concrete_function().graph
    by_stage = _ops_by_stage(graph)
    for stage in range(k):
        for backward in (False, True):
            ops = by_stage.get((stage, backward), [])
            # Every stage has its own matmuls forward, and backward (its weight gradients at least).
            assert sum(op.type == "MatMul" for op in ops) >= m, (stage, backward, len(ops))
            devices = [(op.name, _device_of(op, graph)) for op in ops]
            wrong = [(name, d) for name, d in devices if not d.endswith(f"device:CPU:{stage}")]
            assert not wrong, (stage, backward, wrong[:5])
    # The split's gradient (a concat of the micro-batches' input gradients) on the first device, the
    # join's (the output gradient cut into micro-batches) on the last.
    for scope, device in (("split_micro_batches_grad/", 0), ("join_micro_batches_grad/", k - 1)):
        ops = [op for op in graph.get_operations() if scope in op.name]
        kinds = {op.type for op in ops}
        assert kinds & {"ConcatV2", "SplitV", "Split"}, (scope, kinds)
        wrong = [(op.name, op.device) for op in ops if not op.device.endswith(f"device:CPU:{device}")]
        assert not wrong, (scope, wrong[:5])


def test_every_op_of_a_stage_is_placed_on_its_device_forward_and_backward():
    for k, m, remat in ((2, 4, "always"), (4, 2, "never"), (2, 2, "except_last")):
        _check_placement(k, m, remat)


# ----------------------------------------------------------------------------------- overlap
def _op_intervals(run) -> dict[tuple[int, int], tuple[int, int]]:
    """Profiles ``run()``; returns each forward (stage, micro-batch)'s first matmul start and last
    matmul end in picoseconds, from the host's op events (named ``<op name>:<op type>``)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        planes = [
            plane
            for path in Path(logdir).rglob("*.xplane.pb")
            for plane in xplane_pb2.XSpace.FromString(path.read_bytes()).planes
        ]
    spans: dict[tuple[int, int], list[int]] = {}
    for plane in planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name, _, kind = names.get(event.metadata_id, "").rpartition(":")
                match = _STAGE_SCOPE.search(name + "/")
                # Only the matmuls: they wait for the data (constants and variable reads need not).
                if not match or match.group(3) or "gradient_tape" in name or "MatMul" not in kind:
                    continue
                start = line.timestamp_ns * 1000 + event.offset_ps
                key = (int(match.group(1)), int(match.group(2)))
                span = spans.setdefault(key, [start, start + event.duration_ps])
                span[0], span[1] = min(span[0], start), max(span[1], start + event.duration_ps)
    return {key: (a, b) for key, (a, b) in spans.items()}


def _overlapping_pairs(intervals: dict, m: int) -> list[int]:
    """The micro-batches m whose stage-1 forward overlaps stage 0's forward of m + 1."""
    pairs = []
    for i in range(m - 1):
        if (0, i + 1) in intervals and (1, i) in intervals:
            (a0, a1), (b0, b1) = intervals[(0, i + 1)], intervals[(1, i)]
            if min(a1, b1) > max(a0, b0):
                pairs.append(i)
    return pairs


OVERLAP_PATIENCE_S = 180


def test_stage_0_runs_micro_batch_m_plus_1_while_stage_1_runs_m():
    """Fill-drain in time: in a profiled training step (K=2, M=4, stages big enough to take a
    while), stage 0's forward of micro-batch m + 1 overlaps stage 1's forward of m. A schedule that
    ran the stages one after another (or all on one device's queue) would show no overlap."""
    m = 4
    pipe = _pipeline(2, m, "never", width=256, depth=4)
    x = tf.constant(np.random.default_rng(0).normal(size=(m * 128, 256)).astype(np.float32))
    step = _train_step(pipe, x)
    step().numpy()  # trace and warm up
    seen = []
    # A loaded machine often starves a thread for whole steps (other tests' processes on both cores):
    # profile up to 40 steps, and on for up to OVERLAP_PATIENCE_S while every step is starved.
    start = time.monotonic()
    while len(seen) < 40 or time.monotonic() - start < OVERLAP_PATIENCE_S:
        intervals = _op_intervals(lambda: step().numpy())
        assert {(s, i) for s in range(2) for i in range(m)} <= set(intervals), sorted(intervals)
        pairs = _overlapping_pairs(intervals, m)
        if pairs:
            return
        seen.append(sorted(intervals.items(), key=lambda item: item[1][0]))
    raise AssertionError(f"no step overlapped the stages' forwards; (stage, micro-batch) spans: {seen[-1]}")
