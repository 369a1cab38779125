"""One traced step of the pipeline executor: the schedule's units, built in its order.

``Step`` walks every device's action list and builds each unit once its inputs exist; what a unit
leaves for the later ones (a stage's inputs and outputs, tapes, gradients) is one ``UnitState`` per
(stage, micro-batch). ``executor.PipelineExecutor`` makes a ``Step`` per trace and reads the input
gradients and the weight sums from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Protocol

import tensorflow as tf

from layers import precision
from layers.base_layer import FPropContext
from layers.parallel.device_choice import on
from layers.parallel.pipeline import memory, output_grad, segment, weight_cut
from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline.segment import Segment, TapedSegment
from layers.parallel.pipeline.stage_mesh import StageMeshes
from params.errors import ConfigError


class SplitBackwardOps:
    """The kind of each op a split backward's I or W unit creates, by op name, recorded while a
    step is traced (``--mode=profile_pipeline`` hands one to the GPipe layer before tracing). The
    tape names a gradient op after its forward op (``gradient_tape/stage_<s>_micro_batch_<m>/...``)
    whatever the scope it is built in, so I and W cannot be told apart by their names alone."""

    def __init__(self) -> None:
        self.kind_of: dict[str, str] = {}


class Pipeline(Protocol):
    """What a ``Step`` reads of its pipeline (``executor.PipelineExecutor`` is one)."""

    path: str
    schedule: schedules.Schedule
    stages: list[list[Segment]]
    devices: list[str | None]
    remat: list[bool]
    ctx: FPropContext
    has_head: bool
    meshes: StageMeshes
    batch_dim: int
    in_step: bool
    splits_weights: bool
    split_ops: SplitBackwardOps | None
    cast_reads: precision.CastReads | None


@dataclasses.dataclass
class UnitState:
    """What the units of one (stage, micro-batch) leave for the later ones."""

    inputs: list[tf.Tensor]  # the stage's input (on the last stage, the head's inputs after it)
    in_structure: Any
    outputs: list[tf.Tensor]
    structure: Any  # the outputs' nest
    taped: list[TapedSegment] | None = None  # the forward's (or R's) tapes until B or W
    output_grads: list[Any] | None = None  # on the last stage: the gradient its backward starts from
    input_grads: list[Any] | None = None  # what B or I handed to the previous stage


class Step:
    """The units of one traced step: per (stage, micro-batch) a ``UnitState``, the weight sums, and the
    end of each device's last unit."""

    def __init__(
        self,
        ex: Pipeline,
        ins: list[list[tf.Tensor]],
        structure: Any,
        heads: list[list[tf.Tensor]],
        head_structure: Any,
    ) -> None:
        self.ex, self.sched = ex, ex.schedule
        self.ins, self.heads = ins, heads
        self.structure, self.head_structure = structure, head_structure
        self.last_stage = self.sched.num_stages - 1
        self.units: dict[tuple[int, int], UnitState] = {}
        self.sums = segment.WeightSums()
        self.budgets = memory.StageBudgets(self.sched)
        self.done: set[schedules.Op] = set()
        self.ends: list[Any] = [None] * self.sched.num_devices
        self.outputs: list[list[tf.Tensor]] = []
        self.out_structure: Any = None
        self.differentiable: list[bool] = []
        # The pipeline's own inputs (the micro-batches, the head's): slices of tensors the step holds
        # anyway, so keeping them costs a stage nothing (``segment.segment_bytes``).
        self.arguments = {id(t) for m in ins + heads for t in m}
        # Under a mixed precision policy each weight is cast once a step, not once a micro-batch.
        self.casts = precision.SharedCasts()

    # The walk. Device d builds its units in its order, each once its inputs exist, and each unit's
    # ops wait for the end of d's previous unit, so the compiled step runs them in the schedule's
    # order. 1F1B, K = 2, M = 3, in unit time (F forward 1, B backward 2; the number is the
    # micro-batch):
    #
    #   time      0   1   2   3   4   5   6   7   8   9  10  11  12
    #   device 0  |F0 |F1 |       |B0     |F2 |B1     |   |B2     |
    #   device 1  |   |F0 |B0     |F1 |B1     |F2 |B2     |
    #
    # A unit's inputs:  F(s, m)         <- the outputs of F(s - 1, m), handed to s's device
    #                   R, B, I (s, m)  <- the input gradient of B or I (s + 1, m), handed back
    #                                      (the last stage: the output gradient, ``output_grad``)
    #                   W(s, m)         <- what I(s, m) left on the tapes (the gradients at the cut)
    def build(self, forwards: bool, backwards: bool) -> None:
        """Builds the wanted units, device by device in order, each once its inputs exist."""
        wanted = [
            [
                op
                for op in order
                if (op.kind == schedules.FORWARD and forwards) or (op.kind != schedules.FORWARD and backwards)
            ]
            for order in self.sched.orders
        ]
        position = [0] * len(wanted)
        while any(p < len(w) for p, w in zip(position, wanted)):
            progressed = False
            for d, order in enumerate(wanted):
                while position[d] < len(order) and self._ready(order[position[d]]):
                    self._unit(d, order[position[d]])
                    position[d] += 1
                    progressed = True
            if not progressed:
                stuck = [o[p] for o, p in zip(wanted, position) if p < len(o)]
                raise ConfigError(
                    f"{self.ex.path}: schedule {self.sched.name} cannot run: {stuck} wait forever"
                )
        if forwards:
            self.outputs = [self.units[(self.last_stage, m)].outputs for m in range(len(self.ins))]
            self.out_structure = self.units[(self.last_stage, 0)].structure

    def _ready(self, op: schedules.Op) -> bool:
        s, m = op.stage, op.micro_batch
        if op.kind == schedules.FORWARD:
            return s == 0 or (s - 1, m) in self.units
        if op.kind == schedules.BACKWARD_WEIGHT:
            return schedules.Op(s, m, schedules.BACKWARD_INPUT) in self.done
        unit = self.units.get((s, m))
        if unit is None:
            return False
        if s == self.last_stage and unit.output_grads is not None:
            return True
        after = self.units.get((s + 1, m))
        return after is not None and after.input_grads is not None

    def _unit(self, d: int, op: schedules.Op) -> None:
        s, m = op.stage, op.micro_batch
        scope = f"stage_{s}_micro_batch_{m}"
        if op.kind == schedules.RECOMPUTE:
            scope += "_grad/recompute"
        elif op.kind != schedules.FORWARD:
            scope += "_grad"
        after = [self.ends[d]] if self.ends[d] is not None else []
        record = self.ex.split_ops is not None and op.kind in (
            schedules.BACKWARD_INPUT,
            schedules.BACKWARD_WEIGHT,
        )
        graph = tf.compat.v1.get_default_graph() if record and not tf.executing_eagerly() else None
        before = len(graph.get_operations()) if graph is not None else 0
        with on(self.ex.devices[d]), tf.name_scope(scope), tf.control_dependencies(after), self._sharing():
            produced = self._build_unit(op)
        if graph is not None:
            self.ex.split_ops.kind_of.update((o.name, op.kind) for o in graph.get_operations()[before:])
        done = [t for t in produced if t is not None]
        if done and not tf.executing_eagerly():
            with on(self.ex.devices[d]):
                self.ends[d] = tf.group(*[segment.dense_part(t) for t in done], name=f"end_{op.kind}")
        self.done.add(op)

    def _build_unit(self, op: schedules.Op) -> list[Any]:
        s, m, kind = op.stage, op.micro_batch, op.kind
        if kind == schedules.FORWARD:
            return self._forward(s, m)
        dys = self._gradient_in(s, m)
        unit = self.units[(s, m)]
        if kind == schedules.RECOMPUTE:
            return self._recompute(s, m, unit, dys)
        if unit.taped is None:  # no remat: the forward's tapes; remat: R recorded them
            raise ConfigError(f"{self.ex.path}: {op} runs before the recompute it needs")
        if kind == schedules.BACKWARD_WEIGHT:
            return self._weights(s, unit)
        return self._inputs(s, unit, dys, weights=kind == schedules.BACKWARD)

    # ----------------------------------------------------------------------------------- units
    def _forward(self, s: int, m: int) -> list[tf.Tensor]:
        if s == 0:
            xs, structure = list(self.ins[m]), self.structure
        else:
            before = self.units[(s - 1, m)]
            xs = [self.ex.meshes.hand(t, s - 1, s, self.ex.batch_dim) for t in before.outputs]
            structure = before.structure
        if s == self.last_stage and self.ex.has_head:
            xs, structure = xs + list(self.heads[m]), (structure, self.head_structure)
        taped = None if self.ex.remat[m] else []
        free = {id(t) for t in xs} & self.arguments
        ys, out_structure = self._run(s, xs, structure, self.ex.ctx.for_micro_batch(m), taped, free)
        unit = self.units[(s, m)] = UnitState(xs, structure, ys, out_structure, taped)
        if s == self.last_stage and self.ex.in_step:
            unit.output_grads = output_grad.ones(ys, self._loss_marks(len(ys)))
        return ys

    def _recompute(self, s: int, m: int, unit: UnitState, dys: list[Any]) -> list[tf.Tensor]:
        """R: the stage's forward again, once the output gradient has arrived, taped."""
        zero = segment.zero_after([d for d in dys if d is not None] or unit.outputs)
        with tf.control_dependencies([zero]):
            xs = [tf.identity(t) for t in unit.inputs]
        ctx = self.ex.ctx.for_micro_batch(m, record_updates=False)
        if (
            not self.ex.meshes.meshes
        ):  # on stage meshes the step may sit on another mesh (and no dropout runs)
            step = tf.cast(self.ex.ctx.step, tf.int64) + tf.cast(zero, tf.int64)
            ctx = dataclasses.replace(ctx, step=step)
        taped: list[TapedSegment] = []
        free = {id(x) for x, t in zip(xs, unit.inputs) if id(t) in self.arguments}
        ys, _ = self._run(s, xs, unit.in_structure, ctx, taped, free)
        unit.taped = taped
        return ys

    def _inputs(self, s: int, unit: UnitState, dys: list[Any], weights: bool = False) -> list[Any]:
        """I: the gradient flowing back through every segment to the stage's input. With ``weights``
        (B), each segment's weight gradients come from the same backward pass and are summed."""
        taped = unit.taped or []
        if s == self.last_stage and not self.differentiable:
            self.differentiable = output_grad.differentiable(taped[-1], len(self.heads[0]))
        if weights:
            unit.taped = None
        grads, produced, summed = dys, [], []
        for piece in reversed(taped):
            piece.output_grads = grads
            pairs = [(y, g) for y, g in zip(piece.outputs, grads) if y.dtype.is_floating and g is not None]
            if not pairs:
                grads = [None] * len(piece.inputs)
                continue
            if weights or not piece.deferred:
                variables = list(piece.tape.watched_variables())
                with segment.after(summed):
                    grads, weight_grads = segment.backward(piece.tape, pairs, piece.inputs, variables)
                summed = self.sums.add(s, variables, weight_grads)
                produced += summed
                continue
            cut = [t for _, ts in piece.frontier or [] for t in ts]
            with segment.after(summed):
                grads, piece.frontier_grads = segment.backward(piece.tape, pairs, piece.inputs, cut)
        unit.input_grads = list(grads)
        return list(grads) + produced

    def _weights(self, s: int, unit: UnitState) -> list[Any]:
        """W: each segment's weight gradient from its output gradient, added to the step's sums."""
        produced: list[Any] = []
        taped, unit.taped = unit.taped or [], None
        for piece in taped:
            if not piece.deferred:  # I took its weight gradient
                continue
            variables = list(piece.tape.watched_variables())
            pairs = [
                (y, g)
                for y, g in zip(piece.outputs, piece.output_grads or [])
                if y.dtype.is_floating and g is not None
            ]
            if not variables or not pairs:
                continue
            with segment.after(produced):
                if piece.frontier is not None and piece.frontier_grads is not None:
                    grads = weight_cut.frontier_weight_grads(piece.tape, piece.frontier, piece.frontier_grads)
                    variables = [v for v, _ in piece.frontier]
                else:
                    ys, gs = zip(*pairs)
                    grads = piece.tape.gradient(list(ys), variables, output_gradients=list(gs))
            produced += self.sums.add(s, variables, grads)
        return produced

    # ------------------------------------------------------------------------------- helpers
    def _sharing(self) -> Any:
        """A unit's reads of cast weights go through the step's one cast of each."""
        reads = self.ex.cast_reads
        return reads.sharing(self.casts) if reads is not None else contextlib.nullcontext()

    def _run(
        self,
        s: int,
        xs: list[tf.Tensor],
        structure: Any,
        ctx: FPropContext,
        taped: list[TapedSegment] | None,
        free: set[int] | frozenset[int],
    ) -> tuple[list[tf.Tensor], Any]:
        """The stage's segments on ``xs``; with ``taped``, each under its own tape, and (split
        backward) which of them W takes, and their cuts (``free``: the ids of the inputs that are the
        pipeline's own)."""
        x = segment.record(self.ex.stages[s], ctx, tf.nest.pack_sequence_as(structure, xs), taped)
        if taped is not None and self.ex.splits_weights:
            segment.choose_deferred(taped, free, lambda kept: self.budgets.budget(s, kept))
            for piece in taped:
                if piece.deferred and not self.ex.meshes.meshes:
                    piece.frontier = weight_cut.weight_frontier(piece.tape, piece.inputs, piece.outputs)
        return [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)], x

    def _gradient_in(self, s: int, m: int) -> list[Any]:
        unit = self.units[(s, m)]
        if s == self.last_stage:
            return unit.output_grads or []
        grads = (self.units[(s + 1, m)].input_grads or [])[: len(unit.outputs)]
        if not unit.outputs:
            return grads
        return [None if g is None else self.ex.meshes.hand(g, s + 1, s, self.ex.batch_dim) for g in grads]

    def _loss_marks(self, n: int) -> list[bool]:
        last = self.units.get((self.last_stage, 0))
        return output_grad.loss_marks(last.structure if last else None, n)

    def seed(self, per_m: list[list[Any]]) -> None:
        """Deferred: the output gradients from the tape (None for an unused output: zeros)."""
        for m, dys in enumerate(per_m):
            self.units[(self.last_stage, m)].output_grads = output_grad.from_tape(self.outputs[m], dys)

    def scale_of(self, per_m: list[list[Any]]) -> tuple[tf.Tensor, list[Any]]:
        """In-step: the loss's output gradient c, and the checks that it is one."""
        reached = self.differentiable or [y.dtype.is_floating for y in self.outputs[0]]
        what = f"{self.ex.path}: schedule={self.sched.name}"
        return output_grad.scale_of(
            what, per_m, self.outputs[0][0].dtype, reached, self._loss_marks(len(reached))
        )
