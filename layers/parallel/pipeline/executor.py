"""The pipeline executor: builds a ``schedule.Schedule``'s units in its order, public APIs only.

One executor runs every schedule. It walks each device's action list and builds each unit: the
forward of micro-batch m on stage s (F), its recompute (R, re-materialization), its full backward
(B), or the backward split in two, the gradient for the stage's input (I) and for its weights (W).
Each unit is built under ``tf.control_dependencies`` on the end of its device's previous unit, so
every device runs its units in the schedule's order inside the one compiled step; tensors pass
between units explicitly (a hand-off to another device is an identity placed there).

A stage is a sequence of segments (its layers, and in the last stage the head). A forward keeps,
per segment, a ``tf.GradientTape`` with its inputs and outputs (remat: only the stage's input; R
records the tapes again, after the output gradient has arrived). I walks the segments backwards
from the output gradient to the stage's input gradient, keeping each segment's output gradient and
the gradients at its cut: the outputs of the ops that first combine a weight with the activations
(a dense layer's product and bias sum), found in the traced graph; W then asks each segment's tape
for its weights' gradient from the cut (a dense layer's: its input times the product's gradient), so
it repeats nothing of I and keeps neither the layer's output nor its output gradient alive (without
a clean cut, e.g. eagerly, W starts from the segment's output gradient). W takes only the first
segments' weight gradients, as many as keep what they hold from I to W within a budget
(``schedule.deferred_segments``, ``schedule.weight_budgets``): what the stage's forward keeps (Qi et
al.'s premise for ZB-H1's 1F1B-sized peak; a dense layer's W reads its input and its product's
gradient, as much as the whole forward keeps of it and more), under ZB-H1 also what leaves the
device within 1F1B's largest peak when the stages keep different bytes (the pipeline's own inputs,
slices of the batch, count for nothing); I takes the others' in its backward pass, as B does. B
does both in one backward pass per segment (input and weight gradients from one tape call), so
schedules without W units never look for the cut. The weight gradients are summed over
micro-batches as the W (or B) units come.

The whole pipeline is one ``tf.custom_gradient`` op, so the executor, not the tape, owns the
backward order. Two ways to run it, chosen from the schedule:

- deferred (fill_drain: every device runs all its forwards before any backward): the forward pass
  builds the F units; the gradient function, given the gradient of the pipeline's outputs, builds
  every other unit in the schedule's order. Any loss works.
- in-step (1F1B, interleaved, zero bubble: a device runs forwards after backwards): a forward that
  waits for a backward must be built after it, and the backward needs the output gradient, so the
  forward pass builds every unit itself, seeding each micro-batch's last stage with a gradient of
  ones on the head's per-example outputs (``fprop(..., head=...)``). The gradient function scales
  the results by the loss's actual output gradient, which must be one constant c on every
  differentiable head output (a loss that is c times the sum of the per-example values, as the
  tasks compute it); anything else fails the step with one clear error.

In eager mode nothing is ordered (ops run as they are built); the gradients are the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import record  # private: listed and checked in trainer/tf_compat.py

from layers.base_layer import FPropContext
from layers.parallel.device_choice import on
from layers.parallel.pipeline import memory
from layers.parallel.pipeline import schedule as schedules
from params.errors import ConfigError

Segment = Callable[[FPropContext, Any], Any]
SUMS_SCOPE = "weight_gradient_sums"  # the name scope of the sums over micro-batches
_GRADIENT_KINDS = (schedules.BACKWARD, schedules.BACKWARD_INPUT)
_MAX_SEGMENT_OPS = 2000  # the most ops the weight gradient's cut looks through in one segment


def runs_forwards_after_backwards(schedule: schedules.Schedule) -> bool:
    """Whether some device runs a forward after a backward unit (then the step runs in-step)."""
    for order in schedule.orders:
        seen_backward = False
        for op in order:
            seen_backward = seen_backward or op.kind != schedules.FORWARD
            if seen_backward and op.kind == schedules.FORWARD:
                return True
    return False


@dataclasses.dataclass
class _Piece:
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
    frontier: list[tuple[tf.Variable, list[tf.Tensor]]] | None = None
    frontier_grads: list[Any] | None = None
    # Whether W takes this segment's weight gradient (else I does, in its one backward pass, as B).
    deferred: bool = True


class PipelineExecutor:
    """Runs ``stages`` (per stage, its segments; the head, if any, ends the last one) over M
    micro-batches in ``schedule``'s order on ``devices`` (one per schedule device)."""

    def __init__(
        self,
        path: str,
        schedule: schedules.Schedule,
        stages: list[list[Segment]],
        devices: list[str | None],
        remat: list[bool],
        ctx: FPropContext,
        has_head: bool,
        meshes: list[Any] | None = None,
        batch_dim: int = 0,
    ) -> None:
        self.path, self.schedule, self.stages, self.devices = path, schedule, stages, devices
        self.batch_dim = batch_dim  # where a stage mesh's data axis splits the hand-offs
        self.remat, self.ctx, self.has_head = remat, ctx, has_head
        self.meshes = list(meshes or [])  # per schedule device, its stage mesh (pipeline x mesh)
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
            run = _Step(self, ins, structure, heads, head_structure)
            run.build(forwards=True, backwards=self.in_step)
            box["structure"] = run.out_structure
            flat = [t for m in range(m_count) for t in run.outputs[m]]

            def grad(*dys: Any, variables: list[tf.Variable] | None = None) -> Any:
                variables = list(variables or [])
                n_out = len(run.outputs[0])
                per_m = [list(dys[m * n_out : (m + 1) * n_out]) for m in range(m_count)]
                if self.in_step:
                    scale, checks = run.scale_of(per_m)
                else:
                    run.seed(per_m)
                    run.build(forwards=False, backwards=True)
                    scale, checks = None, []
                if self.meshes and checks:  # a control edge stays on its mesh: the checks guard c
                    with tf.control_dependencies(checks):
                        scale = tf.identity(scale)
                    checks = []
                with tf.control_dependencies(checks):
                    dxs = [run.input_grad(m, i, scale) for m in range(m_count) for i in range(n_in)]
                    dxs += [run.input_grad(m, n_in + i, scale) for m in range(m_count) for i in range(n_head)]
                    dvs = [run.weight_grad(v, scale) for v in variables]
                return (dxs, dvs) if variables else dxs

            return flat, grad

        args = [t for m in micro for t in m] + [t for m in head_micro for t in m]
        if self.meshes:
            flat_out = _across_meshes(pipeline, args)
        else:
            # On the last device: tf.custom_gradient wraps inputs and outputs in one IdentityN, which would
            # otherwise sit on the caller's device (another process, for stages on other tasks).
            with on(self.devices[-1]):
                flat_out = tf.custom_gradient(pipeline)(*args)
        n_out = len(flat_out) // m_count
        outs = [list(flat_out[m * n_out : (m + 1) * n_out]) for m in range(m_count)]
        return outs, box["structure"]


class _Step:
    """The units of one traced step: what each built unit left for the later ones."""

    def __init__(
        self,
        ex: PipelineExecutor,
        ins: list[list[tf.Tensor]],
        structure: Any,
        heads: list[list[tf.Tensor]],
        head_structure: Any,
    ) -> None:
        self.ex, self.sched = ex, ex.schedule
        self.ins, self.heads = ins, heads
        self.structure, self.head_structure = structure, head_structure
        self.last_stage = self.sched.num_stages - 1
        self.stage_in: dict[tuple[int, int], list[tf.Tensor]] = {}
        self.stage_out: dict[tuple[int, int], list[tf.Tensor]] = {}
        self.structures: dict[tuple[int, int], Any] = {}
        self.pieces: dict[tuple[int, int], list[_Piece]] = {}
        self.in_grads: dict[tuple[int, int], list[Any]] = {}
        self.out_grads: dict[tuple[int, int], list[Any]] = {}
        self.sums: dict[Any, Any] = {}
        self.sum_vars: dict[Any, tf.Variable] = {}
        self.var_stage: dict[Any, int] = {}
        self.done: set[schedules.Op] = set()
        self.position = [0] * self.sched.num_devices
        self.ends: list[Any] = [None] * self.sched.num_devices
        self.outputs: list[list[tf.Tensor]] = []
        self.out_structure: Any = None
        self.differentiable: list[bool] = []
        # The pipeline's own inputs (the micro-batches, the head's): slices of tensors the step holds
        # anyway, so keeping them costs a stage nothing (``_segment_bytes``).
        self.arguments = {id(t) for m in ins + heads for t in m}
        self.kept_bytes: dict[int, int | None] = {}  # per stage, what its forward keeps of a micro-batch
        self.budgets: dict[int, int | None] = {}  # per stage, what a micro-batch may hold from I to W

    # ------------------------------------------------------------------------------- the walk
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
            self.outputs = [self.stage_out[(self.last_stage, m)] for m in range(len(self.ins))]
            self.out_structure = self.structures[(self.last_stage, 0)]

    def _ready(self, op: schedules.Op) -> bool:
        s, m = op.stage, op.micro_batch
        if op.kind == schedules.FORWARD:
            return s == 0 or (s - 1, m) in self.stage_out
        if op.kind == schedules.BACKWARD_WEIGHT:
            return schedules.Op(s, m, schedules.BACKWARD_INPUT) in self.done
        if (s, m) not in self.stage_out:
            return False
        return s == self.last_stage and (s, m) in self.out_grads or (s + 1, m) in self.in_grads

    def _unit(self, d: int, op: schedules.Op) -> None:
        s, m = op.stage, op.micro_batch
        scope = f"stage_{s}_micro_batch_{m}"
        if op.kind == schedules.RECOMPUTE:
            scope += "_grad/recompute"
        elif op.kind != schedules.FORWARD:
            scope += "_grad"
        after = [self.ends[d]] if self.ends[d] is not None else []
        with on(self.ex.devices[d]), tf.name_scope(scope), tf.control_dependencies(after):
            produced = self._build_unit(op)
        done = [t for t in produced if t is not None]
        if done and not tf.executing_eagerly():
            with on(self.ex.devices[d]):
                self.ends[d] = tf.group(*[_dense_part(t) for t in done], name=f"end_{op.kind}")
        self.done.add(op)

    def _build_unit(self, op: schedules.Op) -> list[Any]:
        s, m, kind = op.stage, op.micro_batch, op.kind
        if kind == schedules.FORWARD:
            return self._forward(s, m)
        if kind == schedules.RECOMPUTE:
            return self._record(s, m, self._gradient_in(s, m), recompute=True)
        dys = self._gradient_in(s, m)
        if (s, m) not in self.pieces:  # no remat: the forward's tapes; remat: R recorded them
            raise ConfigError(f"{self.ex.path}: {op} runs before the recompute it needs")
        if kind == schedules.BACKWARD_WEIGHT:
            return self._weights(s, m)
        return self._inputs(s, m, dys, weights=kind == schedules.BACKWARD)

    # ----------------------------------------------------------------------------------- units
    def _forward(self, s: int, m: int) -> list[tf.Tensor]:
        if s == 0:
            xs, structure = list(self.ins[m]), self.structure
        else:
            xs = [self._hand(t, s - 1, s) for t in self.stage_out[(s - 1, m)]]
            structure = self.structures[(s - 1, m)]
        if s == self.last_stage and self.ex.has_head:
            xs, structure = xs + list(self.heads[m]), (structure, self.head_structure)
        self.stage_in[(s, m)] = xs
        if self.ex.remat[m]:
            ys, out_structure = self._run(s, m, xs, structure, self._ctx(m), None)
        else:
            pieces: list[_Piece] = []
            free = {id(t) for t in xs} & self.arguments
            ys, out_structure = self._run(s, m, xs, structure, self._ctx(m), pieces, free)
            self.pieces[(s, m)] = pieces
        self.stage_out[(s, m)] = ys
        self.structures[(s, m)] = out_structure
        if s == self.last_stage and self.ex.in_step:
            self._seed_ones(m, ys)
        return ys

    def _record(self, s: int, m: int, dys: list[Any], recompute: bool) -> list[tf.Tensor]:
        """R: the stage's forward again, once the output gradient has arrived, taped."""
        zero = _zero_after([d for d in dys if d is not None] or self.stage_out[(s, m)])
        with tf.control_dependencies([zero]):
            xs = [tf.identity(t) for t in self.stage_in[(s, m)]]
        ctx = self.ex.ctx.for_micro_batch(m, record_updates=False)
        if not self.ex.meshes:  # on stage meshes the step may sit on another mesh (and no dropout runs)
            step = tf.cast(self.ex.ctx.step, tf.int64) + tf.cast(zero, tf.int64)
            ctx = dataclasses.replace(ctx, step=step)
        structure = self.structures.get((s - 1, m), self.structure) if s else self.structure
        if s == self.last_stage and self.ex.has_head:
            structure = (structure, self.head_structure)
        pieces: list[_Piece] = []
        free = {id(x) for x, t in zip(xs, self.stage_in[(s, m)]) if id(t) in self.arguments}
        ys, _ = self._run(s, m, xs, structure, ctx, pieces, free)
        self.pieces[(s, m)] = pieces
        return ys

    def _inputs(self, s: int, m: int, dys: list[Any], weights: bool = False) -> list[Any]:
        """I: the gradient flowing back through every segment to the stage's input. With ``weights``
        (B), each segment's weight gradients come from the same backward pass and are summed."""
        if s == self.last_stage and not self.differentiable:
            self.differentiable = self._differentiable(self.pieces[(s, m)][-1], len(self.heads[m]))
        grads, produced, summed = dys, [], []
        pieces = self.pieces.pop((s, m)) if weights else self.pieces[(s, m)]
        for piece in reversed(pieces):
            piece.output_grads = grads
            pairs = [(y, g) for y, g in zip(piece.outputs, grads) if y.dtype.is_floating and g is not None]
            if not pairs:
                grads = [None] * len(piece.inputs)
                continue
            if weights or not piece.deferred:
                variables = list(piece.tape.watched_variables())
                with _after(summed):
                    grads, weight_grads = _backward(piece.tape, pairs, piece.inputs, variables)
                summed = self._add_to_sums(s, variables, weight_grads)
                produced += summed
                continue
            cut = [t for _, ts in piece.frontier or [] for t in ts]
            with _after(summed):
                grads, piece.frontier_grads = _backward(piece.tape, pairs, piece.inputs, cut)
        self.in_grads[(s, m)] = list(grads)
        return list(grads) + produced

    def _weights(self, s: int, m: int) -> list[Any]:
        """W: each segment's weight gradient from its output gradient, added to the step's sums."""
        produced: list[Any] = []
        for piece in self.pieces.pop((s, m)):
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
            with _after(produced):
                if piece.frontier is not None and piece.frontier_grads is not None:
                    grads = _frontier_weight_grads(piece)
                    variables = [v for v, _ in piece.frontier]
                else:
                    ys, gs = zip(*pairs)
                    grads = piece.tape.gradient(list(ys), variables, output_gradients=list(gs))
            produced += self._add_to_sums(s, variables, grads)
        return produced

    def _add_to_sums(self, s: int, variables: list[tf.Variable], grads: list[Any]) -> list[Any]:
        """Adds one micro-batch's weight gradients to the step's sums; the sums it changed."""
        produced = []
        with tf.name_scope(SUMS_SCOPE):  # the sums belong to no one micro-batch
            for v, g in zip(variables, grads):
                if g is None:
                    continue
                key = v.ref()
                self.var_stage[key] = s
                self.sums[key] = g if key not in self.sums else _add_grads(self.sums[key], g)
                produced.append(self.sums[key])
        return produced

    # ------------------------------------------------------------------------------- helpers
    def _mesh(self, s: int) -> Any:
        return self.ex.meshes[s % len(self.ex.meshes)] if self.ex.meshes else None

    def _hand(self, t: Any, src: int, dst: int) -> Any:
        """Stage ``src``'s tensor handed to stage ``dst``: an identity on dst's device, or a copy onto
        dst's mesh."""
        if not self.ex.meshes:
            return tf.identity(t)
        src_mesh, dst_mesh = self._mesh(src), self._mesh(dst)
        if src_mesh is dst_mesh:
            return tf.identity(t)
        moved = src_mesh.move_to(tf.convert_to_tensor(t), dst_mesh)
        return dst_mesh.split_batch(moved, self.ex.batch_dim)  # replicas keep their rows (a data axis)

    def _ctx(self, m: int) -> FPropContext:
        return self.ex.ctx.for_micro_batch(m)

    def _run(
        self,
        s: int,
        m: int,
        xs: list[tf.Tensor],
        structure: Any,
        ctx: FPropContext,
        pieces: list[_Piece] | None,
        free: set[int] | frozenset[int] = frozenset(),
    ) -> tuple[list[tf.Tensor], Any]:
        """The stage's segments on ``xs``; with ``pieces``, each under its own tape (``free``: the ids
        of the inputs that are the pipeline's own)."""
        x: Any = tf.nest.pack_sequence_as(structure, xs)
        for segment in self.ex.stages[s]:
            if pieces is None:
                x = segment(ctx, x)
                continue
            flat_in = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
            x = tf.nest.pack_sequence_as(x, flat_in)
            with tf.GradientTape(persistent=True, watch_accessed_variables=True) as tape:
                tape.watch([t for t in flat_in if t.dtype.is_floating])
                x = segment(ctx, x)
            flat_out = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
            x = tf.nest.pack_sequence_as(x, flat_out)
            pieces.append(_Piece(tape, flat_in, flat_out))
        if pieces is not None and self.ex.splits_weights:
            _choose_deferred(pieces, free, lambda kept: self._weight_budget(s, kept))
            for piece in pieces:
                if piece.deferred and not self.ex.meshes:
                    piece.frontier = _weight_frontier(piece.tape, piece.inputs, piece.outputs)
        return [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)], x

    def _weight_budget(self, s: int, kept: int | None) -> int | None:
        """Stage ``s``'s budget from I to W (``schedule.weight_budgets``), fixed at its first forward:
        every earlier stage's size is known by then."""
        if s not in self.budgets:
            self.kept_bytes[s] = kept
            sizes = [self.kept_bytes.get(t) for t in range(self.sched.num_stages)]
            self.budgets[s] = memory.weight_budgets(self.sched, sizes)[s]
        return self.budgets[s]

    def _gradient_in(self, s: int, m: int) -> list[Any]:
        if s == self.last_stage:
            return self.out_grads[(s, m)]
        grads = self.in_grads[(s + 1, m)][: len(self.stage_out[(s, m)])]
        ys = self.stage_out[(s, m)]
        return [None if g is None else self._hand(g, s + 1, s) for g in grads] if ys else grads

    def _seed_ones(self, m: int, ys: list[tf.Tensor]) -> None:
        """In-step: the last stage's output gradient is ones on the float outputs the loss is made of
        (the head's ``loss`` entry when it returns a dict with one, else every float output), zero on
        the others (metrics beside the loss); the gradient function scales it."""
        seeded = self._seeded(len(ys))
        self.out_grads[(self.last_stage, m)] = [
            (tf.ones_like(y) if on else tf.zeros_like(y)) if y.dtype.is_floating else None
            for y, on in zip(ys, seeded)
        ]

    def _seeded(self, n: int) -> list[bool]:
        structure = self.structures.get((self.last_stage, 0))
        if isinstance(structure, dict) and "loss" in structure:
            marks = {
                key: tf.nest.map_structure(lambda _, k=key: k == "loss", v) for key, v in structure.items()
            }
            return [bool(x) for x in tf.nest.flatten(marks)]
        return [True] * n

    def seed(self, per_m: list[list[Any]]) -> None:
        """Deferred: the output gradients from the tape (None for an unused output: zeros)."""
        for m, dys in enumerate(per_m):
            ys = self.outputs[m]
            self.out_grads[(self.last_stage, m)] = [
                (tf.zeros_like(y) if d is None else tf.convert_to_tensor(d)) if y.dtype.is_floating else None
                for y, d in zip(ys, dys)
            ]

    def scale_of(self, per_m: list[list[Any]]) -> tuple[tf.Tensor, list[Any]]:
        """In-step: the loss's output gradient c (one constant on every float output that reaches a
        gradient), and the checks that it is one."""
        reached = self._reaching_outputs()
        seeded = self._seeded(len(reached))
        given = [
            (m, i, d)
            for m, dys in enumerate(per_m)
            for i, d in enumerate(dys)
            if reached[i] and d is not None
        ]
        with_c = [g for g in given if seeded[g[1]]]
        if not with_c:
            return tf.zeros([], self.outputs[0][0].dtype), []
        c = tf.reshape(with_c[0][2], [-1])[0]
        checks = []
        for m, i, d in given:
            d = tf.convert_to_tensor(d)
            want = tf.cast(c, d.dtype) if seeded[i] else tf.zeros([], d.dtype)
            off = tf.reduce_max(tf.abs(d - want))
            tol = 1e-5 * tf.abs(tf.cast(c, d.dtype)) + tf.cast(1e-30, d.dtype)
            checks.append(
                tf.debugging.assert_less_equal(
                    off,
                    tol,
                    message=(
                        f"{self.ex.path}: schedule={self.sched.name} runs each micro-batch's backward inside "
                        "the step's forward, so the loss must be one constant times the sum of the head's "
                        "per-example outputs (its 'loss' entry if it returns a dict with one; nothing from "
                        f"the others); the gradient of output {i} of micro-batch {m} is not. Scale the "
                        "per-example values in the head, or use schedule='fill_drain'"
                    ),
                )
            )
        return c, checks

    def _reaching_outputs(self) -> list[bool]:
        return self.differentiable or [y.dtype.is_floating for y in self.outputs[0]]

    @staticmethod
    def _differentiable(piece: _Piece, num_head_inputs: int) -> list[bool]:
        """Which of the last segment's outputs carry a gradient back to the activations or weights (a
        count of correct answers times the examples' weights does not). The probe gradients feed
        nothing, so the compiled step prunes them."""
        activations = piece.inputs[: len(piece.inputs) - num_head_inputs]
        sources = [x for x in activations if x.dtype.is_floating] + list(piece.tape.watched_variables())
        out = []
        for y in piece.outputs:
            if not y.dtype.is_floating or not sources:
                out.append(False)
                continue
            grads = piece.tape.gradient(y, sources)
            out.append(any(g is not None for g in grads))
        return out

    def input_grad(self, m: int, i: int, scale: Any) -> Any:
        stage, grads = 0, self.in_grads.get((0, m))
        if i >= len(self.ins[m]):  # a head input: the last stage's input after the stage's own
            stage, grads = self.last_stage, self.in_grads.get((self.last_stage, m))
            i = len(self.stage_in[(self.last_stage, m)]) - len(self.heads[m]) + (i - len(self.ins[m]))
        g = grads[i] if grads is not None else None
        return self._scaled_on(stage, g, scale)

    def weight_grad(self, v: tf.Variable, scale: Any) -> Any:
        g = self.sums.get(v.ref())
        if scale is None and self.ex.meshes and g is not None:
            # Times one on the stage's mesh, as 1F1B's gradients are times the loss's gradient: left
            # unplaced, DTensor (TensorFlow 2.21) put a fill-drain step's last gradient ops on another
            # stage's mesh once the learner read them ("'tf.Square' op CopyToMeshOp must be used to
            # send data across mesh").
            scale = self._mesh(self.last_stage).to_layout(tf.constant(1.0), [])
        return self._scaled_on(self.var_stage.get(v.ref(), self.last_stage), g, scale)

    def _scaled_on(self, s: int, g: Any, scale: Any) -> Any:
        """In-step: stage ``s``'s gradient ``g`` times the loss's output gradient, on the stage's
        device. Unplaced, the product would run on the caller's device (the trainer's process, for
        stages on other tasks), and every weight gradient would cross the network twice a step."""
        if g is None or scale is None:
            return g
        device = None if self.ex.meshes else self.ex.devices[self.sched.device_of(s)]
        with on(device):
            return _scaled(g, self._hand(scale, self.last_stage, s))


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


def _scaled(g: Any, scale: Any) -> Any:
    if g is None or scale is None:
        return g
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values * tf.cast(scale, g.values.dtype), g.indices, g.dense_shape)
    return g * tf.cast(scale, g.dtype)


def _backward(
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


# ------------------------------------------------------------------- ops with their own gradients
def split_with_grad_on(
    device: str | None, x: tf.Tensor, num: int, axis: int, replicas: int = 1
) -> list[tf.Tensor]:
    """``num`` micro-batches of ``x`` along ``axis`` whose gradient (the parts' gradients joined)
    runs on ``device``: the first stage's, not wherever the tape happens to be. With ``replicas``
    (a stage mesh's data axis splits the batch), see ``micro_batches``."""

    @tf.custom_gradient
    def split(x: tf.Tensor) -> Any:
        def grad(*dys: Any) -> tf.Tensor:
            with on(device), tf.name_scope("split_micro_batches_grad"):
                parts = (
                    micro_batches(tf.zeros_like(x), num, axis, replicas)
                    if any(d is None for d in dys)
                    else []
                )
                dense = [tf.convert_to_tensor(d) if d is not None else parts[i] for i, d in enumerate(dys)]
                return joined_micro_batches(dense, axis, replicas)

        return micro_batches(x, num, axis, replicas), grad

    if not x.dtype.is_floating:
        return micro_batches(x, num, axis, replicas)
    return list(split(x))


def concat_with_grad_on(
    device: str | None, parts: list[tf.Tensor], axis: int, replicas: int = 1
) -> tf.Tensor:
    """The micro-batches ``parts`` joined along ``axis`` (``tf.concat``; with ``replicas``, the
    inverse of ``micro_batches``), whose gradient (the output gradient split back into
    micro-batches) runs on ``device``: the last stage's. The split sizes are static where the shapes
    are, so a part's gradient does not wait for the other parts' forwards (1F1B relies on it)."""
    if not parts[0].dtype.is_floating:
        return joined_micro_batches(parts, axis, replicas)

    @tf.custom_gradient
    def concat(*parts: tf.Tensor) -> Any:
        def grad(dy: Any) -> list[tf.Tensor]:
            with on(device), tf.name_scope("join_micro_batches_grad"):
                dy = tf.convert_to_tensor(dy)
                if replicas > 1:
                    return micro_batches(dy, len(parts), axis, replicas)
                static = [p.shape[axis] if p.shape.rank is not None else None for p in parts]
                if all(s is not None for s in static):
                    sizes = [int(s) for s in static]
                else:
                    sizes = tf.stack([tf.shape(p)[axis] for p in parts])
                return tf.split(dy, sizes, axis=axis, num=len(parts))

        return joined_micro_batches(parts, axis, replicas), grad

    return concat(*parts)


def micro_batches(x: tf.Tensor, num: int, axis: int, replicas: int = 1) -> list[tf.Tensor]:
    """``x`` split into ``num`` equal micro-batches along ``axis``. One replica: consecutive rows
    (``tf.split``). ``replicas`` R > 1 (a data axis of a stage mesh splits the batch into R
    consecutive blocks, one per replica; DTensor cannot split along a split dimension): micro-batch
    m takes the m-th of ``num`` consecutive slices of every replica's block, so each replica splits
    only the rows it holds and a micro-batch is split over the replicas as the batch was. Every
    row is in exactly one micro-batch, so sums over the batch are unchanged."""
    if replicas == 1:
        return tf.split(x, num, axis=axis)
    shape = x.shape.as_list()
    rows, rest = shape[axis], shape[axis + 1 :]
    if rows is None or rows % (replicas * num) or any(d is None for d in shape):
        raise ValueError(
            f"a batch of {rows} rows does not split into {replicas} replicas x {num} micro-batches"
        )
    blocks = tf.reshape(x, shape[:axis] + [replicas, num, rows // (replicas * num)] + rest)
    perm = list(range(len(shape) + 2))
    perm[axis], perm[axis + 1] = axis + 1, axis
    parts = tf.unstack(tf.transpose(blocks, perm), axis=axis)
    return [tf.reshape(p, shape[:axis] + [rows // num] + rest) for p in parts]


def joined_micro_batches(parts: list[tf.Tensor], axis: int, replicas: int = 1) -> tf.Tensor:
    """The batch that ``micro_batches(..., replicas)`` split into ``parts``, rows in their order."""
    if replicas == 1:
        return tf.concat(parts, axis=axis)
    shape = parts[0].shape.as_list()
    num, rows, rest = len(parts), shape[axis], shape[axis + 1 :]
    stacked = tf.reshape(tf.stack(parts, axis=axis), shape[:axis] + [num, replicas, rows // replicas] + rest)
    perm = list(range(len(shape) + 2))
    perm[axis], perm[axis + 1] = axis + 1, axis
    return tf.reshape(tf.transpose(stacked, perm), shape[:axis] + [rows * num] + rest)


# ------------------------------------------------------------------------- the weight gradient's cut
def _weight_frontier(
    tape: tf.GradientTape, inputs: list[tf.Tensor], outputs: list[tf.Tensor]
) -> list[tuple[tf.Variable, list[tf.Tensor]]] | None:
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
        if len(ops) > _MAX_SEGMENT_OPS:  # not one layer's forward (a seed from the backward?): no cut
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


def _frontier_weight_grads(piece: _Piece) -> list[Any]:
    """W from the cut: each variable's gradient from its combining ops' output gradients (which I
    took), reading only their other inputs (a dense layer's input)."""
    grads, at = [], 0
    for v, ts in piece.frontier or []:
        gs = list((piece.frontier_grads or [])[at : at + len(ts)])
        at += len(ts)
        pairs = [(t, g) for t, g in zip(ts, gs) if g is not None]
        if not pairs:
            grads.append(None)
            continue
        ys, dys = zip(*pairs)
        grads.append(piece.tape.gradient(list(ys), v, output_gradients=list(dys)))
    return grads


# ------------------------------------------------------------------------ which weight gradients W takes
def _choose_deferred(
    pieces: list[_Piece], free: set[int] | frozenset[int], budget: Callable[[int | None], int | None]
) -> None:
    """Marks the stage's segments whose weight gradient W takes: ``deferred_segments`` within
    ``budget`` of what the forward keeps (``_segment_bytes``)."""
    kept, held = _segment_bytes(pieces, free)
    count = memory.deferred_segments(budget(kept), held)
    for i, piece in enumerate(pieces):
        piece.deferred = i < count


def _segment_bytes(
    pieces: list[_Piece], free: set[int] | frozenset[int]
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


# ----------------------------------------------------------------------------------------- helpers
def _zeros_for(t: tf.Tensor) -> tf.Tensor | None:
    """A zero gradient for ``t`` that does not keep ``t`` alive (None for non-float tensors)."""
    if not t.dtype.is_floating:
        return None
    if t.shape.is_fully_defined():
        return tf.zeros(t.shape, t.dtype)
    return tf.zeros_like(t)


def _after(sums: list[Any]) -> Any:
    """A context whose ops wait for ``sums`` (the previous segment's weight-gradient sums): each
    segment's weight gradient is added to the sums before the next segment's gradients are computed,
    so one segment's weight gradient at a time is alive beside the sums (left free, TensorFlow ran a
    stage's products first and kept every segment's weight gradient until the adds)."""
    return tf.control_dependencies([_dense_part(t) for t in sums])


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
