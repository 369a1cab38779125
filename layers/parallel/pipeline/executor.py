"""The pipeline executor: builds a ``schedule.Schedule``'s units in its order, public APIs only.

One executor runs every schedule. It walks each device's action list and builds each unit: the
forward of micro-batch m on stage s (F), its recompute (R, re-materialization), its full backward
(B), or the backward split in two, the gradient for the stage's input (I) and for its weights (W).
Each unit is built under ``tf.control_dependencies`` on the end of its device's previous unit, so
every device runs its units in the schedule's order inside the one compiled step; tensors pass
between units explicitly (a hand-off to another device is an identity placed there, or a copy onto
another stage mesh, ``stage_mesh.StageMeshes.hand``).

A stage is a sequence of segments (``segment``): a forward keeps each segment's tape (remat: only
the stage's input; R records the tapes again, after the output gradient has arrived). I walks the
segments backwards from the output gradient to the stage's input gradient, keeping the gradients at
each segment's weight cut (``weight_cut``); W asks each segment's tape for its weights' gradient
from the cut, so it repeats nothing of I (without a clean cut, e.g. eagerly, W starts from the
segment's output gradient). W takes only the first segments' weight gradients, as many as keep what
they hold from I to W within a budget (``memory.weight_budgets``, ``segment.choose_deferred``); I
takes the others' in its backward pass, as B does. B does both in one backward pass per segment, so
schedules without W units never look for the cut. The weight gradients are summed over
micro-batches as the W (or B) units come (``segment.WeightSums``).

The whole pipeline is one ``tf.custom_gradient`` op, so the executor, not the tape, owns the
backward order. Two ways to run it, chosen from the schedule:

- deferred (fill_drain: every device runs all its forwards before any backward): the forward pass
  builds the F units; the gradient function, given the gradient of the pipeline's outputs, builds
  every other unit in the schedule's order. Any loss works.
- in-step (1F1B, interleaved, zero bubble: a device runs forwards after backwards): a forward that
  waits for a backward must be built after it, and the backward needs the output gradient, so the
  forward pass builds every unit itself, seeding each micro-batch's last stage with a gradient of
  ones on the head's per-example outputs (``output_grad``). The gradient function scales the
  results by the loss's actual output gradient, which must be one constant c on every
  differentiable head output; anything else fails the step with one clear error.

In eager mode nothing is ordered (ops run as they are built); the gradients are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from layers import precision
from layers.base_layer import FPropContext
from layers.parallel.device_choice import on
from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import segment
from layers.parallel.pipeline.segment import Segment
from layers.parallel.pipeline.stage_mesh import StageMeshes
from layers.parallel.pipeline.step import SplitBackwardOps, Step
from layers.tf_compat import record  # a private TensorFlow module (layers/tf_compat.py)
from params.errors import ConfigError


def runs_forwards_after_backwards(schedule: schedules.Schedule) -> bool:
    """Whether some device runs a forward after a backward unit (then the step runs in-step)."""
    for order in schedule.orders:
        seen_backward = False
        for op in order:
            seen_backward = seen_backward or op.kind != schedules.FORWARD
            if seen_backward and op.kind == schedules.FORWARD:
                return True
    return False


class PipelineExecutor:
    """Runs ``stages`` (per stage, its segments; the head, if any, ends the last one) over M
    micro-batches in ``schedule``'s order on ``devices`` (one per schedule device), or on the stage
    meshes of ``meshes``."""

    def __init__(
        self,
        path: str,
        schedule: schedules.Schedule,
        stages: list[list[Segment]],
        devices: list[str | None],
        remat: list[bool],
        ctx: FPropContext,
        has_head: bool,
        meshes: StageMeshes | None = None,
        batch_dim: int = 0,
        split_ops: SplitBackwardOps | None = None,
        cast_reads: precision.CastReads | None = None,
    ) -> None:
        self.path, self.schedule, self.stages, self.devices = path, schedule, stages, devices
        self.split_ops = split_ops  # where a traced step records its I and W units' ops (profiles)
        self.cast_reads = cast_reads  # a mixed policy's weight reads: the step casts each weight once
        self.batch_dim = batch_dim  # where a stage mesh's data axis splits the hand-offs
        self.remat, self.ctx, self.has_head = remat, ctx, has_head
        self.meshes = meshes or StageMeshes()
        self.in_step = runs_forwards_after_backwards(schedule)
        # Only a schedule with W units needs the weight gradient's cut (B takes both in one go).
        self.splits_weights = any(op.kind == schedules.BACKWARD_WEIGHT for o in schedule.orders for op in o)
        if self.in_step and not has_head:
            raise ConfigError(
                f"{path}: schedule={schedule.name} runs backwards before later forwards, so each "
                "micro-batch's gradient must be known when its backward runs: no loss on the joined "
                "outputs (e.g. a mean of squared errors after the pipeline). Compute the loss per "
                "micro-batch in the last stage (fprop(..., head=...)), as the tasks do, or use "
                "schedule='fill_drain'"
            )

    # The autograd wiring: the whole pipeline is one op on the caller's tape.
    #
    #   micro-batches ─┐                                            ┌─> each micro-batch's outputs
    #   head inputs ───┴─> pipeline(*args) ── forward pass builds ──┘   (joined by the caller)
    #                        │   deferred: the F units              in-step: every unit, the last
    #                        │                                      stage seeded with ones
    #                        ▼
    #   dys ─────────────> grad(*dys, variables)
    #                        deferred: dys seed the last stage, the walk builds R, B, I, W
    #                        in-step:  c = the constant in dys (checked), gradients built already x c
    #                      -> (input gradients of every micro-batch's args, weight gradient sums)
    def __call__(
        self,
        micro: list[list[tf.Tensor]],
        structure: Any,
        head_micro: list[list[tf.Tensor]],
        head_structure: Any,
    ) -> tuple[list[list[tf.Tensor]], Any]:
        """Each micro-batch's flat outputs (the last stage's, or the head's) and their structure."""
        m_count = len(micro)
        n_in, n_head = len(micro[0]), len(head_micro[0]) if head_micro else 0
        box: dict[str, Any] = {}

        def pipeline(*args: tf.Tensor) -> Any:
            ins = [list(args[m * n_in : (m + 1) * n_in]) for m in range(m_count)]
            base = m_count * n_in
            heads = [list(args[base + m * n_head : base + (m + 1) * n_head]) for m in range(m_count)]
            run = Step(self, ins, structure, heads, head_structure)
            run.build(forwards=True, backwards=self.in_step)
            box["structure"] = run.out_structure
            flat = [t for m in range(m_count) for t in run.outputs[m]]
            return flat, lambda *dys, variables=None: self._gradients(run, dys, variables)

        args = [t for m in micro for t in m] + [t for m in head_micro for t in m]
        if self.meshes.meshes:
            flat_out = _across_meshes(pipeline, args)
        else:
            # On the last device: tf.custom_gradient wraps inputs and outputs in one IdentityN, which would
            # otherwise sit on the caller's device (another process, for stages on other tasks).
            with on(self.devices[-1]):
                flat_out = tf.custom_gradient(pipeline)(*args)
        n_out = len(flat_out) // m_count
        outs = [list(flat_out[m * n_out : (m + 1) * n_out]) for m in range(m_count)]
        return outs, box["structure"]

    def _gradients(self, run: Step, dys: Any, variables: list[tf.Variable] | None) -> Any:
        """The pipeline's gradient function: the inputs' and ``variables``' gradients."""
        variables = list(variables or [])
        m_count = len(run.ins)
        n_out = len(run.outputs[0])
        per_m = [list(dys[m * n_out : (m + 1) * n_out]) for m in range(m_count)]
        if self.in_step:
            scale, checks = run.scale_of(per_m)
        else:
            run.seed(per_m)
            run.build(forwards=False, backwards=True)
            scale, checks = None, []
        if self.meshes.meshes and checks:  # a control edge stays on its mesh: the checks guard c
            with tf.control_dependencies(checks):
                scale = tf.identity(scale)
            checks = []
        n_in, n_head = len(run.ins[0]), len(run.heads[0])
        with tf.control_dependencies(checks):
            dxs = [_input_grad(run, m, i, scale) for m in range(m_count) for i in range(n_in)]
            dxs += [_input_grad(run, m, n_in + i, scale) for m in range(m_count) for i in range(n_head)]
            dvs = [_weight_grad(run, v, scale) for v in variables]
        return (dxs, dvs) if variables else dxs


def _input_grad(run: Step, m: int, i: int, scale: Any) -> Any:
    """The gradient of micro-batch ``m``'s input ``i`` (after its own inputs: the head's)."""
    stage, unit = 0, run.units.get((0, m))
    if i >= len(run.ins[m]):  # a head input: the last stage's input after the stage's own
        stage, unit = run.last_stage, run.units.get((run.last_stage, m))
        i = len(unit.inputs) - len(run.heads[m]) + (i - len(run.ins[m])) if unit else i
    grads = unit.input_grads if unit is not None else None
    return _scaled_on(run, stage, grads[i] if grads is not None else None, scale)


def _weight_grad(run: Step, v: tf.Variable, scale: Any) -> Any:
    """``v``'s gradient summed over the micro-batches."""
    g = run.sums.sums.get(v.ref())
    if scale is None and run.ex.meshes.meshes and g is not None:
        # Times one on the stage's mesh, as 1F1B's gradients are times the loss's gradient: left
        # unplaced, DTensor (TensorFlow 2.21) put a fill-drain step's last gradient ops on another
        # stage's mesh once the learner read them ("'tf.Square' op CopyToMeshOp must be used to
        # send data across mesh").
        scale = run.ex.meshes.of(run.last_stage).to_layout(tf.constant(1.0), [])
    return _scaled_on(run, run.sums.stage.get(v.ref(), run.last_stage), g, scale)


def _scaled_on(run: Step, s: int, g: Any, scale: Any) -> Any:
    """In-step: stage ``s``'s gradient ``g`` times the loss's output gradient, on the stage's
    device. Unplaced, the product would run on the caller's device (the trainer's process, for
    stages on other tasks), and every weight gradient would cross the network twice a step."""
    if g is None or scale is None:
        return g
    ex = run.ex
    device = None if ex.meshes.meshes else ex.devices[ex.schedule.device_of(s)]
    with on(device):
        return segment.scaled(g, ex.meshes.hand(scale, run.last_stage, s, ex.batch_dim))


def run_in_order(
    stages: list[list[Segment]],
    where: tuple[list[str | None], StageMeshes, int],
    ctx: FPropContext,
    inputs: tuple[list[list[tf.Tensor]], Any],
    head_inputs: tuple[list[list[tf.Tensor]], Any] | None = None,
) -> tuple[list[list[tf.Tensor]], Any]:
    """Without a schedule (inference, or one stage and one micro-batch without remat): each
        micro-batch through the ``stages`` in order, no custom gradient. ``where``: each stage's device,
        the stage meshes and the batch dimension; ``inputs`` and ``head_inputs``: the micro-batches'
        flat tensors and their nest (``head_inputs`` None: no head; else the last stage ends with it and
    takes them after its own inputs). Returns each micro-batch's flat outputs and their nest."""
    devices, meshes, batch_dim = where
    micro, structure = inputs
    has_head, last = head_inputs is not None, len(stages) - 1
    head_micro, head_structure = head_inputs or ([[] for _ in micro], None)
    current = list(micro)
    structures = [structure] * len(micro)
    for m in range(len(micro)):
        for k, stage in enumerate(stages):
            with_head = k == last and has_head
            with on(devices[k]), tf.name_scope(f"stage_{k}_micro_batch_{m}"):
                if meshes.meshes and k:  # onto this stage's mesh
                    current[m] = [meshes.hand(t, k - 1, k, batch_dim) for t in current[m]]
                s_in = (structures[m], head_structure) if with_head else structures[m]
                xs_in = current[m] + head_micro[m] if with_head else current[m]
                y = segment.chain(stage)(ctx.for_micro_batch(m), tf.nest.pack_sequence_as(s_in, xs_in))
            current[m], structures[m] = [tf.convert_to_tensor(v) for v in tf.nest.flatten(y)], y
    return current, structures[0]


def _across_meshes(fn: Callable[..., Any], args: list[tf.Tensor]) -> list[tf.Tensor]:
    """``tf.custom_gradient(fn)(*args)`` for a pipeline over several DTensor meshes: custom_gradient
    joins inputs, outputs and variables in one IdentityN, which DTensor refuses across meshes; this
    records the same gradient function on the tape with one identity per output instead."""
    args = [tf.convert_to_tensor(a) for a in args]
    with record.VariableWatcher() as watcher:
        outs, grad_fn = fn(*args)
    variables = sorted({v.ref() for v in watcher.watched_variables()}, key=lambda r: r.deref().name)
    variables = [r.deref() for r in variables]
    reads = [v.read_value() for v in variables]
    results = [tf.identity(o) for o in outs]

    def backward(*dys: Any) -> list[Any]:
        if variables:
            dxs, dvs = grad_fn(*dys, variables=variables)
        else:
            dxs, dvs = grad_fn(*dys), []
        return list(dxs) + list(dvs)

    record.record_operation("PipelineAcrossMeshes", results, args + reads, backward)
    return results
