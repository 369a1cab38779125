"""Pipeline schedules as data: which unit of work each device runs, in which order.

A ``Schedule`` lists, per device, the ordered units (``Op``) it runs: the forward of micro-batch m on
stage s (F), its recompute (re-materialization: the forward run again before the backward), its full
backward (B), or the backward split in two (Qi et al., zero-bubble pipelining): the gradient for the
stage's input (I, on the critical path) and the gradient for its weights (W, free to fill a bubble).
With ``virtual_stages`` v the model is cut into K*v stages and device d holds stages d, d+K, ...
(interleaved 1F1B). The schedule is the one source of truth: the GPipe executor builds its units in
these orders, ``timeline`` and the simulator lay them out in time, ``memory`` counts what they hold,
and ``torch_format`` reads and writes them.

Families (``SCHEDULES``):

- ``fill_drain`` (GPipe): every forward, then every backward from the last micro-batch to the first.
- ``one_f_one_b`` (1F1B, PipeDream-flush): device d runs K - d forwards, then alternates B and F.
- ``interleaved_1f1b`` (Megatron-LM): 1F1B over v virtual stages per device, M a multiple of K.
- ``one_f_one_b_split``: 1F1B's order with each B split into I and W, W right after its I: the
  gradient leaves for the previous stage after I, so the drain passes only I's back (idle
  (K - 1)(T_F + T_I) per device, 1F1B's less (K - 1) T_W), and every device holds 1F1B's K - d.
- ``zbv`` (ZB-V, ``V_SCHEDULES``): 2K stages in a V (``virtual_stages=2``; device d holds stages d
  and 2K - 1 - d, so the loss's backward starts on the device where the forward ended), B split
  into I and W in Qi et al.'s fixed order (``_zbv``): each device holds at most K whole
  micro-batches, 1F1B's peak.
- ``dualpipe_v`` (DualPipeV, ``V_SCHEDULES``, M >= 2K): the same V in PyTorch's DualPipeV order
  (``_dualpipe_v``): a forward and a full backward paired in the steady state (PyTorch overlaps
  them; here they run one after the other), split backwards at the ends.
- ``zb_h1`` / ``zb_h2`` (zero bubble): B split into I and W; after 1F1B's warm-up each device runs
  an I as soon as its gradient arrives, else a forward while it holds fewer than K (H1: 1F1B's peak)
  or 2K - 1 (H2) micro-batches, else a pending W that fills the bubble. Generated once in unit time,
  then fixed.

What an op waits for (``dependencies``):

- forward (s, m) needs forward (s - 1, m): a stage's input is the previous stage's output;
- a backward (B or I) of (s, m), and the recompute before it, need the backward (B or I) of
  (s + 1, m): the output gradient; the last stage's needs only its own forward (the loss is
  computed in the last stage); W of (s, m) needs I of (s, m).

Everything here is plain Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"
BACKWARD_INPUT, BACKWARD_WEIGHT = "backward_input", "backward_weight"
KINDS = (FORWARD, RECOMPUTE, BACKWARD)
ALL_KINDS = (FORWARD, RECOMPUTE, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
GRADIENT_KINDS = (BACKWARD, BACKWARD_INPUT)  # the units that hand a gradient to the previous stage
CLASSIC = ("fill_drain", "one_f_one_b")
SCHEDULES = ("fill_drain", "one_f_one_b", "one_f_one_b_split", "interleaved_1f1b", "zb_h1", "zb_h2")
# 2K stages in a V: device d holds stages d and 2K - 1 - d (virtual_stages=2)
V_SCHEDULES = ("zbv", "dualpipe_v")
SPLIT_BACKWARD = ("one_f_one_b_split", "zb_h1", "zb_h2", "zbv", "dualpipe_v")
REMAT_POLICIES = ("always", "except_last", "never")
UNIT_COSTS = {FORWARD: 1.0, RECOMPUTE: 1.0, BACKWARD: 2.0, BACKWARD_INPUT: 1.0, BACKWARD_WEIGHT: 1.0}


class ScheduleError(ValueError):
    """A schedule that cannot run, or bad arguments for one; the message names the first problem."""


@dataclasses.dataclass(frozen=True)
class Op:
    """One unit of pipeline work: ``kind`` of micro-batch ``micro_batch`` on stage ``stage``."""

    stage: int
    micro_batch: int
    kind: str


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per device, the ops it runs in order. ``placement[s]`` is the device that holds stage s; empty
    means the looped placement, stage s on device ``s % num_devices`` (a V, as PyTorch's ZBV and
    DualPipeV use, puts stages d and 2K - 1 - d on device d)."""

    name: str
    num_devices: int
    num_micro_batches: int
    virtual_stages: int
    orders: tuple[tuple[Op, ...], ...]
    placement: tuple[int, ...] = ()

    @property
    def num_stages(self) -> int:
        return self.num_devices * self.virtual_stages

    def device_of(self, stage: int) -> int:
        return self.placement[stage] if self.placement else stage % self.num_devices

    def stage_order(self, stage: int) -> list[Op]:
        """Stage ``stage``'s ops in the order its device runs them."""
        return [op for op in self.orders[self.device_of(stage)] if op.stage == stage]


def remat_micro_batches(remat: str, num_micro_batches: int) -> list[bool]:
    """Which micro-batches a stage re-materializes under a remat policy. ``except_last`` skips the
    last micro-batch, whose backward comes soonest after its forward."""
    _check_choice("remat", remat, REMAT_POLICIES)
    m_count = _positive("num_micro_batches", num_micro_batches)
    return [remat == "always" or (remat == "except_last" and m < m_count - 1) for m in range(m_count)]


def check_virtual_stages(schedule: str, virtual_stages: int) -> None:
    """Raises ScheduleError unless ``virtual_stages`` is 1 or the schedule interleaves them (a V
    schedule needs exactly 2)."""
    if schedule in V_SCHEDULES and virtual_stages != 2:
        raise ScheduleError(
            f"schedule={schedule!r} places two stages per device in a V; set virtual_stages=2 "
            f"(got {virtual_stages})"
        )
    if schedule in V_SCHEDULES:
        return
    if virtual_stages > 1 and schedule != "interleaved_1f1b":
        raise ScheduleError(
            f"virtual_stages={virtual_stages} needs schedule='interleaved_1f1b' (got {schedule!r}); set "
            "virtual_stages=1 or schedule='interleaved_1f1b'"
        )


def check_combination(schedule: str, num_devices: int, num_micro_batches: int, virtual_stages: int) -> None:
    """Raises ScheduleError (one line naming the knob and the fix) for a combination that cannot run."""
    _check_choice("schedule", schedule, SCHEDULES + V_SCHEDULES)
    k = _positive("num_stages", num_devices)
    m = _positive("num_micro_batches", num_micro_batches)
    v = _positive("virtual_stages", virtual_stages)
    check_virtual_stages(schedule, v)
    if schedule == "interleaved_1f1b" and v > 1 and m % k:
        raise ScheduleError(
            f"schedule='interleaved_1f1b' needs num_micro_batches ({m}) to be a multiple of num_stages "
            f"({k}); use num_micro_batches={k * max(1, round(m / k))} or virtual_stages=1"
        )
    if schedule == "dualpipe_v" and m < 2 * k:
        raise ScheduleError(
            f"schedule='dualpipe_v' needs num_micro_batches ({m}) of at least 2 x num_stages ({2 * k}), "
            f"one per stage of its V; use num_micro_batches={2 * k}"
        )


def build(
    schedule: str, num_devices: int, num_micro_batches: int, remat: str = "never", virtual_stages: int = 1
) -> Schedule:
    """The schedule ``schedule`` for K devices, M micro-batches and v virtual stages per device."""
    check_combination(schedule, num_devices, num_micro_batches, virtual_stages)
    k, m, v = num_devices, num_micro_batches, virtual_stages
    if schedule == "fill_drain":
        orders = [
            [Op(d, b, FORWARD) for b in range(m)] + [Op(d, b, BACKWARD) for b in reversed(range(m))]
            for d in range(k)
        ]
    elif schedule == "one_f_one_b" or (schedule == "interleaved_1f1b" and v == 1):
        orders = [_one_f_one_b(d, k, m) for d in range(k)]
    elif schedule == "interleaved_1f1b":
        orders = [_interleaved(d, k, m, v) for d in range(k)]
    elif schedule == "zbv":
        orders = _zbv(k, m)
    elif schedule == "dualpipe_v":
        orders = _dualpipe_v(k, m)
    elif schedule == "one_f_one_b_split":
        orders = [_split(_one_f_one_b(d, k, m)) for d in range(k)]
    else:
        orders = _zero_bubble(k, m, h2=schedule == "zb_h2")
    remat_of = remat_micro_batches(remat, m)
    with_remat = tuple(tuple(_with_recompute(order, remat_of)) for order in orders)
    placement = v_placement(k) if schedule in V_SCHEDULES else ()
    return Schedule(schedule, k, m, v, with_remat, placement)


def v_placement(num_devices: int) -> tuple[int, ...]:
    """The device of each of 2K stages in a V: stages d and 2K - 1 - d on device d."""
    return tuple(s if s < num_devices else 2 * num_devices - 1 - s for s in range(2 * num_devices))


def with_remat(schedule: Schedule, remat: str) -> Schedule:
    """``schedule`` (e.g. read from a file) with a recompute before each re-materialized backward."""
    remat_of = remat_micro_batches(remat, schedule.num_micro_batches)
    plain = [[op for op in order if op.kind != RECOMPUTE] for order in schedule.orders]
    orders = tuple(tuple(_with_recompute(order, remat_of)) for order in plain)
    return dataclasses.replace(schedule, orders=orders)


def stage_orders(
    schedule: str, num_stages: int, num_micro_batches: int, remat: str = "never"
) -> list[list[Op]]:
    """Each device's ops in order, one stage per device (``build(...).orders`` as lists)."""
    return [list(order) for order in build(schedule, num_stages, num_micro_batches, remat).orders]


def _with_recompute(order: Sequence[Op], remat_of: list[bool]) -> list[Op]:
    out = []
    for op in order:
        if op.kind in GRADIENT_KINDS and remat_of[op.micro_batch]:
            out.append(Op(op.stage, op.micro_batch, RECOMPUTE))
        out.append(op)
    return out


def _one_f_one_b(d: int, k: int, m: int) -> list[Op]:
    warmup = min(k - d, m)
    ops = [Op(d, b, FORWARD) for b in range(warmup)]
    for b in range(m):
        ops.append(Op(d, b, BACKWARD))
        if warmup + b < m:
            ops.append(Op(d, warmup + b, FORWARD))
    return ops


def _split(order: Sequence[Op]) -> list[Op]:
    """``order`` with each full backward B replaced by I then W (the same work, in two units)."""
    out = []
    for op in order:
        if op.kind == BACKWARD:
            out += [
                Op(op.stage, op.micro_batch, BACKWARD_INPUT),
                Op(op.stage, op.micro_batch, BACKWARD_WEIGHT),
            ]
        else:
            out.append(op)
    return out


def _interleaved(d: int, k: int, m: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved order: virtual micro-batch i is micro-batch ``(i // (K v)) K + i % K``
    on chunk ``(i // K) % v`` (reversed for backwards); ``2 (K - d - 1) + (v - 1) K`` warm-up forwards,
    then one forward and one backward at a time."""
    total = m * v

    def unit(i: int, kind: str) -> Op:
        chunk = (i // k) % v
        if kind == BACKWARD:
            chunk = v - 1 - chunk
        return Op(chunk * k + d, (i // (k * v)) * k + i % k, kind)

    warmup = min(2 * (k - d - 1) + (v - 1) * k, total)
    ops = [unit(i, FORWARD) for i in range(warmup)]
    for j in range(total - warmup):
        ops += [unit(warmup + j, FORWARD), unit(j, BACKWARD)]
    ops += [unit(j, BACKWARD) for j in range(total - warmup, total)]
    return ops


def _zero_bubble(k: int, m: int, h2: bool) -> list[list[Op]]:
    """ZB-H1 / ZB-H2 by a greedy walk in unit time (F = I = W = 1). Device d first runs ``warm``
    forwards (K - d, as 1F1B warms up; H2: 2(K - d) - 1) and no more before its first I (Qi et al.,
    2023); then, in this priority, an I whose gradient has arrived, a forward while it holds fewer
    than ``limit`` micro-batches between forward and W (K, 1F1B's peak; H2: 2K - 1), a pending W."""
    limit = 2 * k - 1 if h2 else k
    warm = [2 * (k - d) - 1 if h2 else k - d for d in range(k)]
    done: set[Op] = set()
    orders: list[list[Op]] = [[] for _ in range(k)]
    nf, ni, nw = [0] * k, [0] * k, [0] * k
    while len(done) < 3 * k * m:
        finished = []
        for d in range(k):
            f, i, w = nf[d], ni[d], nw[d]
            grad_in = Op(d, i, FORWARD) if d == k - 1 else Op(d + 1, i, BACKWARD_INPUT)
            ready = {
                BACKWARD_INPUT: i < f and grad_in in done,
                FORWARD: f < m
                and f - w < limit
                and (i > 0 or f < warm[d])  # 1F1B's warm-up: no more forwards before the first I
                and (d == 0 or Op(d - 1, f, FORWARD) in done),
                BACKWARD_WEIGHT: w < i,
            }
            priority = (FORWARD, BACKWARD_INPUT) if f - i < warm[d] else (BACKWARD_INPUT, FORWARD)
            for kind in (*priority, BACKWARD_WEIGHT):
                if ready[kind]:
                    counter = {FORWARD: nf, BACKWARD_INPUT: ni, BACKWARD_WEIGHT: nw}[kind]
                    op = Op(d, counter[d], kind)
                    counter[d] += 1
                    orders[d].append(op)
                    finished.append(op)
                    break
        if not finished:  # cannot happen: the last device can always make progress
            raise ScheduleError(f"zero-bubble generation stalled at K={k}, M={m}")
        done.update(finished)
    return orders


class _DeviceOrder:
    """One device's order as it is written: each unit takes the next micro-batch of its stage and
    kind (a B counts as that stage's next I), and an I queues its W for ``weight``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.count: dict[tuple[int, str], int] = {}
        self.weights: list[Op] = []

    @staticmethod
    def _key(stage: int, kind: str) -> tuple[int, str]:
        return stage, BACKWARD_INPUT if kind == BACKWARD else kind

    def next(self, stage: int, kind: str) -> int:
        return self.count.get(self._key(stage, kind), 0)

    def add(self, stage: int, kind: str) -> None:
        m = self.next(stage, kind)
        self.ops.append(Op(stage, m, kind))
        self.count[self._key(stage, kind)] = m + 1
        if kind == BACKWARD_INPUT:
            self.weights.append(Op(stage, m, BACKWARD_WEIGHT))

    def weight(self) -> None:
        """The oldest pending W, if any."""
        if self.weights:
            self.ops.append(self.weights.pop(0))


def _zbv(k: int, m: int) -> list[list[Op]]:
    """ZB-V (Qi et al., 2024, "Pipeline Parallelism with Controllable Memory"; PyTorch's
    ScheduleZBVZeroBubble) on the V placement: device d holds stage d (its "first") and 2K - 1 - d
    (its "last"). Device d warms up with 2(K - d) - 1 forwards of its first stage, then d pairs of
    (last, first) forwards, then K - d times a forward of its last stage with its I and W; in the
    steady state it alternates (forward, I, W) on its first stage and on its last; it cools down with
    d pairs of I (first, last), then K - d times (I, W) of its first stage, then the W left. Each
    device holds at most 2K (stage, micro-batch) pairs, K micro-batches of a whole device: 1F1B's
    peak. The order is built for max(M, 2K - 1) micro-batches and the units past M left out."""
    total = max(m, 2 * k - 1)
    return [[op for op in _zbv_device(d, 2 * k - 1 - d, k, total) if op.micro_batch < m] for d in range(k)]


def _zbv_device(first: int, last: int, k: int, total: int) -> list[Op]:
    d, order = first, _DeviceOrder()
    f, i, w = FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT
    for _ in range(2 * (k - d) - 1):
        order.add(first, f)
    for _ in range(d):
        order.add(last, f)
        order.add(first, f)
    for _ in range(k - d):
        for kind in (f, i, w):
            order.add(last, kind)
    while order.next(last, f) < order.next(first, f) or order.next(first, f) < total:
        if order.next(first, f) < total:
            order.add(first, f)
        order.add(first, i)
        order.add(first, w)
        for kind in (f, i, w):
            order.add(last, kind)
    for _ in range(d):
        order.add(first, i)
        order.add(last, i)
    for _ in range(k - d):
        order.add(first, i)
        order.add(first, w)
    for s in (last, first):
        while order.next(s, w) < order.next(s, i):
            order.add(s, w)
    return order.ops


def _dualpipe_v(k: int, m: int) -> list[list[Op]]:
    """DualPipeV (DeepSeek's DualPipe folded into a V, as PyTorch's ScheduleDualPipeV orders it) for
    M >= 2K. Device d holds its first stage d and its last 2K - 1 - d; in order it runs
    2(K - d - 1) forwards of its first stage; d + 1 pairs of forwards (first, last); K - d - 1 times
    an I of its last stage, a pending W and a forward of its last; M - 2K + d + 1 times the pairs
    (forward first, B last) and (forward last, B first), which PyTorch overlaps (OVERLAP_F_B) and
    TensorPipe runs as two units, forward first; K - d - 1 times a B of its last stage and the pair
    (forward last, B first); d + 1 pairs of backwards (last, first), full B for the first half and
    I from the middle on; K - d - 1 times a pending W and a backward of its first stage; the W left.
    A W runs in the order its I's ran."""
    return [_dualpipe_v_device(d, 2 * k - 1 - d, k, m) for d in range(k)]


def _dualpipe_v_device(first: int, last: int, k: int, m: int) -> list[Op]:
    d, order = first, _DeviceOrder()
    for _ in range(2 * (k - d - 1)):
        order.add(first, FORWARD)
    for _ in range(d + 1):
        order.add(first, FORWARD)
        order.add(last, FORWARD)
    for _ in range(k - d - 1):
        order.add(last, BACKWARD_INPUT)
        order.weight()
        order.add(last, FORWARD)
    for _ in range(m - 2 * k + d + 1):
        for forward, backward in ((first, last), (last, first)):  # PyTorch's OVERLAP_F_B pairs
            order.add(forward, FORWARD)
            order.add(backward, BACKWARD)
    for _ in range(k - d - 1):
        order.add(last, BACKWARD)
        order.add(last, FORWARD)
        order.add(first, BACKWARD)
    split = False
    for j in range(d + 1):
        middle = j == (d + 1) // 2
        split = split or (middle and d % 2 == 1)
        order.add(last, BACKWARD_INPUT if split else BACKWARD)
        split = split or (middle and d % 2 == 0)
        order.add(first, BACKWARD_INPUT if split else BACKWARD)
    for _ in range(k - d - 1):
        order.weight()
        order.add(first, BACKWARD_INPUT if split else BACKWARD)
    while order.weights:
        order.weight()
    return order.ops


def dependencies(op: Op, num_stages: int, done: dict[Op, float] | set[Op]) -> list[Op]:
    """The ops ``op`` waits for (one of the gradient kinds, whichever ``done`` holds)."""
    if op.kind == FORWARD:
        return [] if op.stage == 0 else [Op(op.stage - 1, op.micro_batch, FORWARD)]
    if op.kind == BACKWARD_WEIGHT:
        return [Op(op.stage, op.micro_batch, BACKWARD_INPUT)]
    if op.stage == num_stages - 1:
        return [Op(op.stage, op.micro_batch, FORWARD)]
    for kind in GRADIENT_KINDS:
        dep = Op(op.stage + 1, op.micro_batch, kind)
        if dep in done:
            return [dep]
    return [Op(op.stage + 1, op.micro_batch, BACKWARD)]


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ScheduleError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(f"{name} must be an int >= 1, got {value!r}")
    return value
