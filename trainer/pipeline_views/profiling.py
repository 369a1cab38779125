"""``--mode=profile_pipeline``: a measured picture of one pipelined training step, and its simulation.

Runs the experiment's compiled forward and backward pass (no update: nothing is saved and no
checkpoint is read or changed) once to compile, then once under TensorFlow's profiler. Every op the
GPipe layer emits sits in a name scope ``stage_<k>_micro_batch_<m>`` (forward),
``..._grad/recompute`` (re-materialization) or ``..._grad`` (backward; the tape's own gradient ops
of a stage sit under ``gradient_tape/stage_<k>_micro_batch_<m>``); a split backward's I and W
share those names, so the executor records, while the step is traced, which ops each I and W unit
created (``step.SplitBackwardOps``). Each (stage, micro-batch, kind) becomes one box from its
first op's start to its last op's end, and the simulation takes each stage's median F, R, B, I and
W. The schedule is named as run (``file:<path>`` for a ``schedule_file``). Writes, under the logdir:

- ``pipeline_step.png``: the measured step, one row per stage's device;
- ``pipeline_step_simulated.png``: the simulator's step from the measured per-op costs (each stage's
  median forward, recompute and backward time), drawn the same way, to put side by side;
- ``pipeline_step.json``: both steps' figures and the measured events;
- ``pipeline_step.trace.json`` and ``pipeline_step_simulated.trace.json``: both steps as Chrome/
  Perfetto trace events (``trainer.pipeline_views.trace``: a row per device, flow arrows for the hand-offs,
  a counter of micro-batches held), to open in ui.perfetto.dev side by side;
- an image summary of both under ``<logdir>/pipeline/``, which TensorBoard shows in its Images tab.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import tensorflow as tf

from layers import tf_compat
from layers.base_layer import layers_of_type
from layers.parallel.pipeline import memory, simulator, timeline
from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import segment as stage_segments
from layers.parallel.pipeline.gpipe import GPipeLayer
from layers.parallel.pipeline.step import SplitBackwardOps
from params.errors import ConfigError
from params.hyperparams import Params
from trainer import files, tf_settings
from trainer.pipeline_views import picture as pipeline_picture
from trainer.pipeline_views import trace as pipeline_trace
from trainer.train_step import TrainStep

_SCOPE = re.compile(r"(?:^|/)stage_(\d+)_micro_batch_(\d+)(_grad)?(/recompute)?(?:/|$)")
# Bookkeeping ops that the executor may run long before or after the work (variable reads have no
# inputs, so they run at once): they would stretch a box without doing its work.
_IGNORED_TYPES = {"ReadVariableOp", "_Send", "_Recv", "_HostSend", "_HostRecv", "NoOp", "Const", "Identity"}


def op_events(run: Callable[[], Any]) -> list[tuple[str, float, float]]:
    """Runs ``run`` once under the profiler; returns ``(op name, start s, end s)`` for every op."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(
            logdir, options=tf.profiler.experimental.ProfilerOptions(host_tracer_level=2)
        )
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        planes = [
            plane
            for path in Path(logdir).rglob("*.xplane.pb")
            for plane in tf_compat.xspace_from_bytes(path.read_bytes()).planes
        ]
    out = []
    for plane in planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                name = names.get(event.metadata_id, "")
                if ":" in name:  # ops are "scope/name:Type"; the rest is the runtime's own regions
                    start = line.timestamp_ns * 1e-9 + event.offset_ps * 1e-12
                    out.append((name, start, start + event.duration_ps * 1e-12))
    return out


def pipeline_events(
    ops: Iterable[tuple[str, float, float]], split_kinds: dict[str, str] | None = None
) -> list[timeline.Event]:
    """One event per (stage, micro-batch, kind) found in the ops' name scopes, times from the first.
    A backward op named in ``split_kinds`` (``step.SplitBackwardOps.kind_of``: the ops each I and W unit
    created) counts as that unit's kind, so a split backward's I and W are boxes of their own.

    The weight-gradient sums over micro-batches belong to no one box. A box spans its ops, less
    stragglers: ops with no input from the pipeline (a random key, a
    shape) run whenever the executor likes, often at the very start of the step, and would stretch
    a box over time the stage spent elsewhere (see ``_trimmed``).
    """
    groups: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    for name, start, end in ops:
        scope, _, op_type = name.rpartition(":")
        matches = list(_SCOPE.finditer(scope))
        if not matches or op_type in _IGNORED_TYPES or stage_segments.SUMS_SCOPE in scope.split("/"):
            continue
        match = matches[-1]  # the innermost: the tape nests a backward under its forward op's scope
        # A recompute's own gradient ops are named gradient_tape/stage_k_micro_batch_m_grad/recompute/.
        if "gradient_tape" in scope.split("/") or (match[3] and not match[4]):
            kind = (split_kinds or {}).get(scope, schedules.BACKWARD)
        else:
            kind = schedules.RECOMPUTE if match[4] else schedules.FORWARD
        groups.setdefault((int(match[1]), int(match[2]), kind), []).append((start, end))
    if not groups:
        return []
    spans = {key: _trimmed(sorted(intervals)) for key, intervals in groups.items()}
    t0 = min(s for s, _ in spans.values())
    evs = [timeline.Event(s - t0, e - t0, k, m, kind) for (k, m, kind), (s, e) in spans.items()]
    return sorted(evs, key=lambda e: (e.start, e.stage))


def _trimmed(intervals: list[tuple[float, float]], share: float = 0.1) -> tuple[float, float]:
    """The span of ``intervals`` (sorted by start) without a head or tail of ops that hold at most
    ``share`` of their busy time and sit across the widest gap of the group from the rest."""
    busy = sum(e - s for s, e in intervals) or 1.0

    def cut(items: list[tuple[float, float]]) -> int:
        best, best_gap, done, reach = 0, 0.0, 0.0, items[0][1]
        for i in range(1, len(items)):
            done += items[i - 1][1] - items[i - 1][0]
            if done > share * busy:
                break
            gap = items[i][0] - reach
            if gap > best_gap:
                best, best_gap = i, gap
            reach = max(reach, items[i][1])
        return best

    head = cut(intervals)
    rest = intervals[head:]
    mirrored = sorted((-e, -s) for s, e in rest)
    tail = cut(mirrored)
    kept = mirrored[tail:]
    return -max(neg_start for _, neg_start in kept), -min(neg_end for neg_end, _ in kept)


def measured_costs(evs: list[timeline.Event], num_stages: int) -> simulator.StageCosts:
    """Each stage's median op duration per kind (a kind the step never ran costs 0)."""

    def median(kind: str, k: int) -> float:
        durations = [e.end - e.start for e in evs if e.stage == k and e.kind == kind]
        return statistics.median(durations) if durations else 0.0

    # A stage whose backward was split has I and W boxes (``pipeline_events``' split_kinds): its B
    # is their sum where it ran no full backward; one without I or W takes half its B for each.
    per_kind = {kind: [median(kind, k) for k in range(num_stages)] for kind in schedules.ALL_KINDS}
    inputs, weights = per_kind[schedules.BACKWARD_INPUT], per_kind[schedules.BACKWARD_WEIGHT]
    backward = [b or i + w for b, i, w in zip(per_kind[schedules.BACKWARD], inputs, weights)]
    split = [i > 0 or w > 0 for i, w in zip(inputs, weights)]
    return simulator.StageCosts.given(
        per_kind[schedules.FORWARD],
        backward,
        per_kind[schedules.RECOMPUTE],
        backward_input=[i if s else b / 2 for i, s, b in zip(inputs, split, backward)],
        backward_weight=[w if s else b / 2 for w, s, b in zip(weights, split, backward)],
    )


def run(root: Params, logdir: str, log: Callable[[str], None]) -> int:
    """Profiles one step of ``root``'s experiment and writes the pictures; see the module doc."""
    tf_settings.configure(root.cluster)
    step = TrainStep(root.task, root.input.train)
    pipelines = layers_of_type(step.task, GPipeLayer)
    if not pipelines:
        raise ConfigError(
            f"{root.model} has no GPipe layer: --mode=profile_pipeline pictures a pipelined step "
            "(e.g. image.digits.GPipeConvNet)"
        )
    pipeline = pipelines[0]
    compiled = step.gradients_function()
    split_ops = pipeline.split_backward_ops = SplitBackwardOps()  # while tracing: each I's, W's ops
    try:
        compiled()  # compile and warm up outside the profile
    finally:
        pipeline.split_backward_ops = None
    ops = op_events(lambda: tf.nest.map_structure(lambda t: t.numpy(), compiled()))
    evs = pipeline_events(ops, split_ops.kind_of)
    if not evs:
        raise ConfigError(f"the profile of {root.model}'s step holds no pipeline ops")
    k_count, s_count = pipeline.num_devices, pipeline.num_stages
    m_count = 1 + max(e.micro_batch for e in evs)
    sched = pipeline.schedule_for(m_count)
    evs = [dataclasses.replace(e, device=sched.device_of(e.stage)) for e in evs]
    labels = [f"device {k}: {d or 'default device'}" for k, d in enumerate(pipeline.devices)]
    remat, schedule = pipeline.params.remat, sched.name
    prediction = simulator.simulate(sched, m_count, remat, measured_costs(evs, s_count))
    measured = {
        "step_time_s": timeline.step_time(evs),
        "bubble": timeline.bubble(evs),
        "peak_in_flight": memory.peak_in_flight(evs),
    }
    title = f"{root.model}: K={k_count}, M={m_count}, remat={remat}, {schedule}"
    pngs = {
        "pipeline_step.png": pipeline_picture.draw_png(evs, f"{title} (measured)", labels),
        "pipeline_step_simulated.png": pipeline_picture.draw_png(
            prediction.events, f"{title} (simulated from the measured op times)", labels
        ),
    }
    tf.io.gfile.makedirs(logdir)
    for name, png in pngs.items():
        with tf.io.gfile.GFile(files.join(logdir, name), "wb") as f:
            f.write(png)
    traces = {
        "pipeline_step.trace.json": pipeline_trace.trace_events(
            evs, s_count, f"{title} (measured)", None, labels
        ),
        "pipeline_step_simulated.trace.json": pipeline_trace.trace_events(
            prediction.events, s_count, f"{title} (simulated)", None, labels
        ),
    }
    for name, trace in traces.items():
        files.write_text_atomic(files.join(logdir, name), json.dumps(trace) + "\n")
    record = {
        "model": root.model,
        "num_stages": k_count,
        "virtual_stages": pipeline.params.virtual_stages,
        "num_micro_batches": m_count,
        "remat": remat,
        "schedule": schedule,
        "measured": measured,
        "simulated": prediction.summary(),
        "prediction_error": simulator.relative_error(prediction.step_time, measured["step_time_s"]),
        "events": [e.__dict__ for e in evs],
    }
    files.write_text_atomic(files.join(logdir, "pipeline_step.json"), files.to_json(record) + "\n")
    writer = tf.summary.create_file_writer(files.join(logdir, "pipeline"))
    with writer.as_default(step=int(step.global_step.numpy())):
        for name, png in pngs.items():
            tf.summary.image(name.removesuffix(".png"), tf.io.decode_png(png)[tf.newaxis], max_outputs=1)
    writer.close()
    log(
        f"profile_pipeline: {title}: measured step {measured['step_time_s'] * 1e3:.1f} ms, bubble "
        f"{measured['bubble']:.2f}; simulated {prediction.step_time * 1e3:.1f} ms "
        f"({record['prediction_error']:.0%} off); wrote {files.join(logdir, 'pipeline_step.png')}"
    )
    return 0
