"""What the plans' placements cost beyond their layers' timings and hand-offs, measured on this host
for one experiment by training it for real (each term once, cached with the costs: ``ensure``).
Every trial runs in processes the trainer's way (``trial``: malloc's allocator, the plan's threads),
``TRIALS`` times over: the step the median, each process's peak the highest (malloc's peaks vary
from one run to the next by a weight's size or two, and a planner's "fits" must hold). The trials
of one term are trained in turns (``_trials``): the machine's drift over the minutes they take
falls on each alike, so a line through two of them does not carry it.

One process (``measure_process``). The step outside the pipelined stack (the embedding, the loss,
the optimizer's update): the experiment trained as one process, one micro-batch, its step less its
layers' timings: ``rest_seconds``, in the process every plan's trainer runs.
A layer of a unit inside one process's traced step costs more than the layer timed alone (its ops'
dispatch in the step's executor, the micro-batch's slicing and joins): the experiment trained as one
process at the largest M up to 8 (one stage, fill-drain, remat never), its step less its prediction
over the layers of the units on its critical path: ``process_layer_s``, at least 0. (A step can run
below its layers' timings, whose own calls cost something; a negative term fitted there on one
trial carried to other placements as steps predicted up to 29% short, the layers timed in another
session than the trial.)
The two runs' peaks above their predictions give one process's own memory term,
``process_memory``: measured peak = predicted + ``fixed_bytes`` + nodes x ``node_bytes`` (nodes:
the traced step's op count, which M multiplies; either part may be negative where the fixed items
over-count this experiment), so the constants of ``memory`` are corrected on the experiment itself.

A unit a stage process runs goes through TensorFlow's distributed runtime, and a step of stage
processes pays for the trainer's call into every stage task: costs the per-layer timings in one
process (``costs``) and a crossing's time (``grpc_link``) leave out. ``measure`` trains the
experiment as 2 stage processes (fill-drain, remat never) at two numbers of micro-batches, 2 and the
largest up to 8 the batch allows (``trial.measure_plan``: ``TRAIN_STEPS`` steps, the median of the
last ``TIMED_STEPS``), predicts each without these terms, and solves measured = predicted +
``stage_step_s`` + n x ``stage_unit_s`` for a fixed cost a step and a cost per unit (each at least
0), n the units on the plan's critical path (a unit's cost lengthens every unit of the timeline: the
stages' own overlap), or their share of the host's cores where those bound the step (n: the
prediction's growth with the cost). The cost per unit is mostly a crossing's between processes, so
the weight half of a split backward, which hands nothing to another process, does not pay it, nor a
recompute, which reads the stage's own input. Part of the fixed cost comes with each stage task
(the trainer's call into it, its part of the step's graph run by its executor, the processes' turns
on the host's cores): where the plans have deeper pipelines, the deepest, K stage processes at
M = K, trained in turns with the two (or alone by ``measure_tasks`` where the two-stage terms are
cached), gives the fixed cost of each task beyond two, ``stage_task_s`` (at least 0), the two-task
cost staying as measured.
The same trials' stage processes give the optimizer update's temporaries (the clipped gradients,
Adam's intermediate tensors, each the size of a weight), which the per-layer measurements do not
see: ``update_ratio``, the largest over the stage processes of their peak (VmHWM) above its
prediction, over their weights' bytes (at least 0): the largest, as the planner's "fits" must hold
for every process. The plans it trains are two of the planner's own.

Logical devices of one process overlap only partly: their ops run side by side on the host's cores,
but one process dispatches them all. ``measure_devices`` trains 2 stages on logical devices of one
process (fill-drain, remat never, the largest M up to 8) and places its step between the
predictions with the devices overlapping as separate cores would and with them taking turns:
``devices_serial``, the fraction of the way (0 to 1).

A stage on a DTensor mesh of S logical devices costs what the unsharded per-layer measurements do
not see either: DTensor's runtime, the tensors every device of the mesh keeps whole, a graph per
device, the collectives; a pipeline of stage meshes adds the copies between meshes and a runtime
per mesh. ``measure_mesh`` trains the experiment (in one process, fill-drain) as one stage on a
mesh of S at M = 1 (remat never) and the largest M up to 8 the batch allows (remat always), or, for
pipelines of stage meshes, as two stages on meshes of S at the two M of ``micro_batch_counts`` (the
same), and solves the same two equations for the step (``step_s``, ``unit_s``) and, for memory,
measured peak = predicted + ``fixed_bytes`` + nodes x ``node_bytes`` (nodes: the traced step's op
count, which M multiplies). The larger trial re-materializes: a recompute's nodes cost a mesh more
than their count says (measured at 8 x 128, pipeline 2 x mesh 2, M = 8: remat always peaked 6-12%
above a per-node cost fitted on remat never), and a planner's "fits" must hold. A plan uses the
terms of its ``predict.mesh_key``: one stage's, or two stages' for any longer pipeline of S-device
meshes.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from pathlib import Path

from params.errors import UserError
from trainer.planning import candidates, plan_file, predict, trial
from trainer.planning.costs import ModelCosts, Progress, save
from trainer.planning.memory import GRAPH_NODE_BYTES, MIB

TRAIN_STEPS = 8  # a calibration trial's steps, the median of the last TIMED_STEPS its step
TIMED_STEPS = trial.timed_steps(TRAIN_STEPS)
# Each calibration trial is trained that many times (fresh processes each), its step the median
# (on this 2-core machine one plan's step varied by 20 to 45% from one set of processes to the next)
# and every process's peak the highest.
TRIALS = 3
TIMEOUT_S = 300.0
PROBE_UNIT_S = 1e-3  # a unit cost that finds how many units lie on a plan's critical path
STAGE_WHY = "the stage processes' own costs"


@dataclasses.dataclass(frozen=True)
class Target:
    """The experiment the calibrations train: its registry key, gin bindings and pipeline's Params
    key (``costs.pipeline_prefix``), the cores its plans' processes share (``predict``'s
    ``host_cores``), where progress lines go, and how many times each trial is trained."""

    model: str
    bindings: list[str]
    pipeline_prefix: str
    host_cores: int
    progress: Progress
    trials: int = TRIALS


def micro_batch_counts(batch: int) -> list[int]:
    """The two M the calibration trains (one, where the batch allows only one)."""
    ms = [m for m in candidates.divisors(batch) if 2 <= m <= 8]
    return sorted({ms[0], ms[-1]}) if ms else []


def _solve(points: list[tuple[float, float]], floor: float | None = 0.0) -> tuple[float, float]:
    """(fixed, per) with residual = fixed + per x n through the first and last (n, residual) points,
    each at least ``floor`` (None: unbounded)."""
    (n0, r0), (n1, r1) = points[0], points[-1]
    per = (r1 - r0) / (n1 - n0) if abs(n1 - n0) >= 0.5 else 0.0  # else: no unit to tell
    per = per if floor is None else max(per, floor)
    fixed = r0 - per * n0
    return (fixed if floor is None else max(fixed, floor)), per


def _trials(target: Target, costs: ModelCosts, plans: list[candidates.Plan], why: str) -> list[dict]:
    """``plans`` each trained ``target.trials`` times ``TRAIN_STEPS`` steps (``trial.measure_plan``) in
    turns (all of them, then all again: the machine's drift over the minutes they take falls on each
    alike, and a slope between two of them keeps none of it); each one's step the median and each
    process's peak the highest; a failure is a UserError."""
    names = ", ".join(p.name() for p in plans)
    target.progress(f"training {names} {TRAIN_STEPS} steps, {target.trials} time(s) in turns ({why})")
    steps = (TRAIN_STEPS, TIMEOUT_S, TIMED_STEPS)
    batch, threads = costs.batch_size, costs.intra_op_threads
    texts = [plan_file.text(p, target.pipeline_prefix, batch, threads) for p in plans]
    runs: list[list[dict]] = [[] for _ in plans]
    for _ in range(max(target.trials, 1)):
        for plan, text, done in zip(plans, texts, runs):
            stages = plan.num_stages if plan.placement == "stage_processes" else 0
            run = trial.measure_plan(target.model, target.bindings, text, stages, *steps)
            if not run["ok"]:
                raise UserError(f"the calibration run {plan.name()} failed: {run['why']}")
            done.append(run)
    out = []
    for plan, done in zip(plans, runs):
        step = statistics.median(r["step_s"] for r in done)
        peaks_mib = [max(p) for p in zip(*(r["peaks_mib"] for r in done))]
        shown = ", ".join(f"{r['step_s'] * 1e3:.1f}" for r in done)
        target.progress(
            f"{plan.name()}: a step {step * 1e3:.1f} ms (of {shown}), peaks "
            f"{', '.join(f'{p:.0f}' for p in peaks_mib)} MiB"
        )
        out.append({"ok": True, "step_s": step, "peaks_mib": peaks_mib})
    return out


Point = tuple[float, float, dict, predict.Prediction]


def _against(
    target: Target, plans: list[candidates.Plan], bare: ModelCosts, probed: ModelCosts, why: str
) -> list[Point]:
    """``plans`` trained in turns (``_trials``) and each predicted from ``bare`` (without the terms
    being measured): the units on its critical path (its step's growth to ``probed``, every unit
    ``PROBE_UNIT_S`` longer), its measured step less the prediction, the run, and the prediction."""
    link = (bare.link_bytes_per_s, bare.link_latency_s, target.host_cores)
    points = []
    for plan, run in zip(plans, _trials(target, bare, plans, why)):
        pred = predict.predict(bare, plan, *link)
        units = (predict.predict(probed, plan, *link).step_s - pred.step_s) / PROBE_UNIT_S
        points.append((units, run["step_s"] - pred.step_s, run, pred))
    return points


def _stage_plan(costs: ModelCosts, stages: int, m: int) -> candidates.Plan:
    cut = candidates.split_points(costs, costs.batch_size // m, stages)
    return candidates.Plan("stage_processes", stages, m, "fill_drain", "never", cut)


def _without_stage_terms(costs: ModelCosts) -> tuple[ModelCosts, ModelCosts]:
    """``costs`` without the stage processes' own terms, and the same with the probe's unit cost."""
    bare = dataclasses.replace(costs, stage_step_s=0.0, stage_task_s=0.0, stage_unit_s=0.0, update_ratio=0.0)
    return bare, dataclasses.replace(bare, stage_unit_s=PROBE_UNIT_S)


def _deepest_plan(costs: ModelCosts, stages: int) -> candidates.Plan | None:
    """The trial of ``stage_task_s``: ``stages`` stage processes at the least M of at least ``stages``
    (fill-drain, remat never); None where nothing deeper than two stages can be trained."""
    m = min((x for x in candidates.divisors(costs.batch_size) if x >= stages), default=0)
    if stages <= 2 or not m or costs.num_layers < stages:
        return None
    return _stage_plan(costs, stages, m)


def _task_cost(point: Point, stages: int, step_s: float, unit_s: float) -> float:
    """``stage_task_s`` from the deepest trial's ``point``: residual = ``step_s`` + (``stages`` - 2) x
    task + units x ``unit_s`` (at least 0)."""
    units, residual = point[0], point[1]
    return max((residual - units * unit_s - step_s) / (stages - 2), 0.0)


def measure(target: Target, costs: ModelCosts, deepest: int = 2) -> tuple[float, float, float, float]:
    """(``stage_step_s``, ``stage_unit_s``, ``update_ratio``, ``stage_task_s``) of ``target`` (module
    doc; the fixed cost of two stage tasks' step, and of each task beyond two from ``deepest`` stage
    processes, trained in turns with the two-stage trials; 0 where nothing deeper can be trained);
    zeros where it cannot be pipelined in two stages."""
    counts = micro_batch_counts(costs.batch_size)
    if costs.num_layers < 2 or not counts:
        return 0.0, 0.0, 0.0, 0.0
    deeper = _deepest_plan(costs, deepest)
    plans = [_stage_plan(costs, 2, m) for m in counts] + ([deeper] if deeper else [])
    points = _against(target, plans, *_without_stage_terms(costs), STAGE_WHY)
    two = points[: len(counts)]
    ratios = [
        (peak_mib * MIB - process.total) / process.items["weights"]
        for _, _, run, pred in two
        for process, peak_mib in zip(pred.processes[1:], run["peaks_mib"][1:])  # the stages
    ]
    step_s, unit_s = _solve([(units, residual) for units, residual, _, _ in two])
    task_s = _task_cost(points[-1], deepest, step_s, unit_s) if deeper else 0.0
    return step_s, unit_s, max(max(ratios), 0.0), task_s


def measure_tasks(target: Target, costs: ModelCosts, stages: int) -> float:
    """``stage_task_s`` alone (``measure`` gives it where the stage terms are measured with it): the
    fixed cost of each stage task beyond two, from ``stages`` stage processes (``_deepest_plan``) and
    the calibrated two-stage terms; 0 where nothing deeper than two stages can be trained."""
    deeper = _deepest_plan(costs, stages)
    if deeper is None:
        return 0.0
    (point,) = _against(target, [deeper], *_without_stage_terms(costs), STAGE_WHY)
    return _task_cost(point, stages, costs.stage_step_s, costs.stage_unit_s)


def _memory_point(run: dict, pred: predict.Prediction) -> tuple[float, float]:
    """(graph nodes, bytes its peak lay above the prediction) of a run in one process."""
    process = pred.processes[0]
    nodes = process.items["graph"] / GRAPH_NODE_BYTES["in_process"]
    return nodes, run["peaks_mib"][0] * MIB - process.total


def _one_process(costs: ModelCosts, **terms: float) -> ModelCosts:
    """``costs`` without one process's memory term (nor the update's temporaries, which the term
    holds in one process), with ``terms`` replaced."""
    return dataclasses.replace(costs, process_memory={}, update_ratio=0.0, **terms)


def measure_process(target: Target, costs: ModelCosts) -> tuple[float, float, dict[str, float]]:
    """(``rest_seconds``, ``process_layer_s``, ``process_memory``): one process's terms (module doc).
    ``rest_seconds``: the plain step (one micro-batch, remat never) less its layers' timings;
    ``process_layer_s``: the step at the largest M up to 8 (one stage, fill-drain, remat never) less
    its prediction with that rest, over the layers of the units on its critical path (0 where the
    batch allows one micro-batch only; at least 0, as the rest); the two trained in turns. The
    memory line runs through the two runs' points (``_memory_point``; a fixed part only with one
    run)."""
    counts = micro_batch_counts(costs.batch_size)
    plans = [candidates.Plan("one_process", 1, m, "fill_drain", "never", ()) for m in [1, *counts[-1:]]]
    bare, probed = (_one_process(costs, rest_seconds=0.0, process_layer_s=x) for x in (0.0, PROBE_UNIT_S))
    points = _against(target, plans, bare, probed, "one process's own costs")
    rest = max(points[0][1], 0.0)
    layer = 0.0
    if len(points) > 1:
        layers, residual = points[1][0], points[1][1] - rest  # the rest enters a step whole
        layer = max(residual / layers, 0.0) if layers > 0 else 0.0
    memory_points = [_memory_point(run, pred) for _, _, run, pred in points]
    fixed, per = _solve([memory_points[0], memory_points[-1]], floor=None)
    return rest, layer, {"fixed_bytes": fixed, "node_bytes": per}


def measure_devices(target: Target, costs: ModelCosts) -> float:
    """``devices_serial`` (module doc): 2 stages on logical devices of one process trained at the
    largest M up to 8, where its step falls between the prediction with the devices overlapping
    fully (0) and taking turns (1); 1 where the experiment cannot be pipelined in two stages."""
    counts = micro_batch_counts(costs.batch_size)
    if costs.num_layers < 2 or not counts:
        return 1.0
    m = counts[-1]
    plan = candidates.Plan(
        "logical", 2, m, "fill_drain", "never", candidates.split_points(costs, costs.batch_size // m, 2)
    )
    (run,) = _trials(target, costs, [plan], "how far logical devices overlap")
    link = (costs.link_bytes_per_s, costs.link_latency_s, target.host_cores)
    apart, turns = (
        predict.predict(dataclasses.replace(costs, devices_serial=x), plan, *link).step_s for x in (0.0, 1.0)
    )
    return min(max((run["step_s"] - apart) / (turns - apart), 0.0), 1.0) if turns > apart else 1.0


def measure_mesh(target: Target, costs: ModelCosts, key: str) -> dict[str, float]:
    """The terms of stage meshes ``key`` (``predict.mesh_key``: stages x mesh size; module doc):
    step_s, unit_s, fixed_bytes, node_bytes."""
    stages, size = (int(x) for x in key.split("x"))
    bare = dataclasses.replace(costs, mesh={})
    probe = {"step_s": 0.0, "unit_s": PROBE_UNIT_S, "fixed_bytes": 0.0, "node_bytes": 0.0}
    probed = dataclasses.replace(costs, mesh={key: probe})
    counts = micro_batch_counts(costs.batch_size)
    counts = counts if stages > 1 else [1, *counts[-1:]]
    plans = []
    for m in sorted(set(counts)):
        cut = candidates.split_points(costs, costs.batch_size // m, stages) if stages > 1 else ()
        remat = "always" if m == max(counts) and len(set(counts)) > 1 else "never"
        plans.append(candidates.Plan("pipeline_mesh", stages, m, "fill_drain", remat, cut, stage_mesh=size))
    points = _against(target, plans, bare, probed, "stage meshes' own costs")
    steps = [(units, residual) for units, residual, _, _ in points]
    memory = [_memory_point(run, pred) for _, _, run, pred in points]
    step_s, unit_s = _solve(steps)
    fixed_bytes, node_bytes = _solve(memory)
    return {"step_s": step_s, "unit_s": unit_s, "fixed_bytes": fixed_bytes, "node_bytes": node_bytes}


def ensure(target: Target, costs: ModelCosts, cache: Path, plans: Iterable[candidates.Plan]) -> None:
    """Measures, once, the terms ``plans`` need that ``costs`` lacks (one process's: the step outside
    the stack, a layer's own cost, its memory; the stage processes' for a stage-process plan, and
    their cost a task for deeper ones; ``devices_serial`` for one on several
    logical devices of a process, each ``predict.mesh_key``'s for a mesh plan), saving each to the
    ``cache`` file."""
    plans = list(plans)
    if costs.rest_seconds < 0 or not costs.process_memory:
        costs.rest_seconds, costs.process_layer_s, costs.process_memory = measure_process(target, costs)
        save(costs, cache)
    deepest = max((p.num_stages for p in plans if p.placement == "stage_processes"), default=0)
    if costs.stage_step_s < 0 and deepest:
        costs.stage_step_s, costs.stage_unit_s, costs.update_ratio, task_s = measure(target, costs, deepest)
        if deepest > 2:
            costs.stage_task_s = task_s
        save(costs, cache)
    if costs.stage_task_s < 0 and deepest > 2:
        costs.stage_task_s = measure_tasks(target, costs, deepest)
        save(costs, cache)
    in_process = ("logical", "pipeline_mesh")
    if costs.devices_serial < 0 and any(p.placement in in_process and p.num_stages > 1 for p in plans):
        costs.devices_serial = measure_devices(target, costs)
        save(costs, cache)
    for key in sorted({predict.mesh_key(p) for p in plans if p.placement == "pipeline_mesh"}):
        if key not in costs.mesh:
            costs.mesh[key] = measure_mesh(target, costs, key)
            save(costs, cache)
