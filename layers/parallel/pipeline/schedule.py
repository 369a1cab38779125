"""Pipeline schedules as data: which unit of work each device runs, in which order, and when.

A ``Schedule`` lists, per device, the ordered units (``Op``) it runs: the forward of micro-batch m on
stage s (F), its recompute (re-materialization: the forward run again before the backward), its full
backward (B), or the backward split in two (Qi et al., zero-bubble pipelining): the gradient for the
stage's input (I, on the critical path) and the gradient for its weights (W, free to fill a bubble).
With ``virtual_stages`` v the model is cut into K*v stages and device d holds stages d, d+K, ...
(interleaved 1F1B). The schedule is the one source of truth: the GPipe executor builds its units in
these orders, the simulator and the pictures lay them out, and ``torch_format`` reads and writes them.

Families (``SCHEDULES``):

- ``fill_drain`` (GPipe): every forward, then every backward from the last micro-batch to the first.
- ``one_f_one_b`` (1F1B, PipeDream-flush): device d runs K - d forwards, then alternates B and F.
- ``interleaved_1f1b`` (Megatron-LM): 1F1B over v virtual stages per device, M a multiple of K.
- ``one_f_one_b_split``: 1F1B's order with each B split into I and W, W right after its I: the
  gradient leaves for the previous stage after I, so the drain passes only I's back (idle
  (K - 1)(T_F + T_I) per device, 1F1B's less (K - 1) T_W), and every device holds 1F1B's K - d.
- ``zb_h1`` / ``zb_h2`` (zero bubble): B split into I and W; after 1F1B's warm-up each device runs
  an I as soon as its gradient arrives, else a forward while it holds fewer than K (H1: 1F1B's peak)
  or 2K - 1 (H2) micro-batches, else a pending W that fills the bubble. Generated once in unit time,
  then fixed.

``timeline`` places every op in time from per-op costs under the pipeline's dependencies:

- forward (s, m) needs forward (s - 1, m): a stage's input is the previous stage's output;
- a backward (B or I) of (s, m), and the recompute before it, need the backward (B or I) of
  (s + 1, m): the output gradient; the last stage's needs only its own forward (the loss is
  computed in the last stage); W of (s, m) needs I of (s, m);
- a device runs one op at a time, in its order; a hand-off between devices costs ``transfer``.

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
SPLIT_BACKWARD = ("one_f_one_b_split", "zb_h1", "zb_h2")
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
class Event:
    """An op placed in time: it runs on its device from ``start`` to ``end``."""

    start: float
    end: float
    stage: int
    micro_batch: int
    kind: str
    device: int = -1  # -1: the stage's own device (one stage per device)

    @property
    def op(self) -> Op:
        return Op(self.stage, self.micro_batch, self.kind)

    @property
    def row(self) -> int:
        """The device the event runs on (its row in a picture)."""
        return self.stage if self.device < 0 else self.device


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Per device, the ops it runs in order; stage s runs on device ``s % num_devices``."""

    name: str
    num_devices: int
    num_micro_batches: int
    virtual_stages: int
    orders: tuple[tuple[Op, ...], ...]

    @property
    def num_stages(self) -> int:
        return self.num_devices * self.virtual_stages

    def device_of(self, stage: int) -> int:
        return stage % self.num_devices

    def stage_order(self, stage: int) -> list[Op]:
        """Stage ``stage``'s ops in the order its device runs them."""
        return [op for op in self.orders[self.device_of(stage)] if op.stage == stage]


def remat_micro_batches(remat: str, num_micro_batches: int) -> list[bool]:
    """Which micro-batches a stage re-materializes under a remat policy. ``except_last`` skips the
    last micro-batch, whose backward comes soonest after its forward."""
    _check_choice("remat", remat, REMAT_POLICIES)
    m_count = _positive("num_micro_batches", num_micro_batches)
    return [remat == "always" or (remat == "except_last" and m < m_count - 1) for m in range(m_count)]


def check_combination(schedule: str, num_devices: int, num_micro_batches: int, virtual_stages: int) -> None:
    """Raises ScheduleError (one line naming the knob and the fix) for a combination that cannot run."""
    _check_choice("schedule", schedule, SCHEDULES)
    k = _positive("num_stages", num_devices)
    m = _positive("num_micro_batches", num_micro_batches)
    v = _positive("virtual_stages", virtual_stages)
    if v > 1 and schedule != "interleaved_1f1b":
        raise ScheduleError(
            f"virtual_stages={v} needs schedule='interleaved_1f1b' (got {schedule!r}); set virtual_stages=1 "
            "or schedule='interleaved_1f1b'"
        )
    if schedule == "interleaved_1f1b" and v > 1 and m % k:
        raise ScheduleError(
            f"schedule='interleaved_1f1b' needs num_micro_batches ({m}) to be a multiple of num_stages "
            f"({k}); use num_micro_batches={k * max(1, round(m / k))} or virtual_stages=1"
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
    elif schedule == "one_f_one_b_split":
        orders = [_split(_one_f_one_b(d, k, m)) for d in range(k)]
    else:
        orders = _zero_bubble(k, m, h2=schedule == "zb_h2")
    remat_of = remat_micro_batches(remat, m)
    with_remat = tuple(tuple(_with_recompute(order, remat_of)) for order in orders)
    return Schedule(schedule, k, m, v, with_remat)


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


# ------------------------------------------------------------------------------------ the timeline
def _devices(orders: Sequence[Sequence[Op]]) -> dict[int, int]:
    return {op.stage: d for d, order in enumerate(orders) for op in order}


def _num_stages(orders: Sequence[Sequence[Op]]) -> int:
    return max([len(orders)] + [op.stage + 1 for order in orders for op in order])


def timeline(
    orders: Sequence[Sequence[Op]],
    cost: dict[str, Sequence[float]],
    transfer: float = 0.0,
    alone_speedup: Sequence[float] | None = None,
) -> list[Event]:
    """Places every op in time, as early as its device and its inputs allow.

    ``orders[d]`` is device d's ops; ``cost[kind][s]`` is the duration of one ``kind`` op of stage s;
    ``transfer`` is added to every hand-off between devices (an activation forward, a gradient
    backward). ``alone_speedup[d]`` (default 1: every device is its own) is how many times faster
    device d works while no other device is busy: where the devices share the host's cores, a lone
    stage's independent ops spread over the idle ones. Returns the events sorted by start time, then
    device. Raises ScheduleError if the orders deadlock (an op waits for one that runs after it).
    """
    k_count = len(orders)
    s_count = _num_stages(orders)
    used = {op.kind for order in orders for op in order}
    for kind in sorted(set(KINDS) | used):
        if len(cost.get(kind, ())) != s_count:
            raise ScheduleError(f"cost[{kind!r}] needs one duration per stage ({s_count})")
    if alone_speedup is not None:
        if len(alone_speedup) != k_count or any(not (a >= 1.0) for a in alone_speedup):
            raise ScheduleError(
                f"alone_speedup needs a factor >= 1 per stage ({k_count}), got {alone_speedup}"
            )
        if any(a != 1.0 for a in alone_speedup):
            return _shared_timeline(orders, cost, transfer, alone_speedup)
    device = _devices(orders)
    done: dict[Op, float] = {}
    free = [0.0] * k_count
    position = [0] * k_count
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d in range(k_count):
            while position[d] < len(orders[d]):
                op = orders[d][position[d]]
                ready = _ready_time(op, s_count, done, transfer, device)
                if ready is None:
                    break
                start = max(ready, free[d])
                end = start + float(cost[op.kind][op.stage])
                done[op] = end
                free[d] = end
                events.append(Event(start, end, op.stage, op.micro_batch, op.kind, d))
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise _deadlock(orders, position)
    return sorted(events, key=lambda e: (e.start, e.row))


def _shared_timeline(
    orders: Sequence[Sequence[Op]], cost: dict[str, Sequence[float]], transfer: float, alone: Sequence[float]
) -> list[Event]:
    """``timeline`` where a device's speed depends on how many devices are busy: an event loop that
    advances to the next finish or hand-off, each running op progressing at 1 / cost (times
    ``alone[d]`` while it is the only one running)."""
    k_count = len(orders)
    s_count = _num_stages(orders)
    device = _devices(orders)
    done: dict[Op, float] = {}
    position = [0] * k_count
    running: dict[int, list] = {}  # device -> [op, start, work left as a fraction of the op]
    events: list[Event] = []
    now = 0.0
    while any(position[d] < len(orders[d]) for d in range(k_count)) or running:
        waits = []
        for d in range(k_count):
            if d in running or position[d] >= len(orders[d]):
                continue
            op = orders[d][position[d]]
            ready = _ready_time(op, s_count, done, transfer, device)
            if ready is not None and ready <= now + 1e-12:
                running[d] = [op, now, 1.0]
                position[d] += 1
            elif ready is not None:
                waits.append(ready - now)
        free_ops = [d for d, (op, _, _) in running.items() if float(cost[op.kind][op.stage]) <= 0.0]
        for d in free_ops:
            op, start, _ = running.pop(d)  # a free op ends where it starts
            done[op] = now
            events.append(Event(start, now, op.stage, op.micro_batch, op.kind, d))
        if free_ops:  # what waited on them may start now: look again before advancing the clock
            continue
        if not running:
            if not waits:
                if any(position[d] < len(orders[d]) for d in range(k_count)):
                    raise _deadlock(orders, position)
                break
            now += min(waits)
            continue
        speed = {
            d: (alone[d] if len(running) == 1 else 1.0) / float(cost[op.kind][op.stage])
            for d, (op, _, _) in running.items()
        }
        step = min([left / speed[d] for d, (_, _, left) in running.items()] + waits)
        now += step
        for d in list(running):
            running[d][2] -= speed[d] * step
            if running[d][2] <= 1e-9:
                op, start, _ = running.pop(d)
                done[op] = now
                events.append(Event(start, now, op.stage, op.micro_batch, op.kind, d))
    return sorted(events, key=lambda e: (e.start, e.row))


def _deadlock(orders: Sequence[Sequence[Op]], position: list[int]) -> ScheduleError:
    stuck = [order[p] for order, p in zip(orders, position) if p < len(order)]
    return ScheduleError(f"the stage orders deadlock: {stuck} each wait for an op that cannot run")


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


def _ready_time(
    op: Op, s_count: int, done: dict[Op, float], transfer: float, device: dict[int, int]
) -> float | None:
    """When ``op``'s inputs exist, or None if some input is not placed yet."""
    ready = 0.0
    for dep in dependencies(op, s_count, done):
        if dep not in done:
            return None
        hop = transfer if device.get(dep.stage, dep.stage) != device.get(op.stage, op.stage) else 0.0
        ready = max(ready, done[dep] + hop)
    return ready


def events(
    schedule: str, num_stages: int, num_micro_batches: int, remat: str = "never", virtual_stages: int = 1
) -> list[Event]:
    """The schedule in unit clocks (forward 1, recompute 1, backward 2 = input 1 + weight 1, each
    divided by ``virtual_stages``: a device's work per micro-batch stays the same)."""
    sched = build(schedule, num_stages, num_micro_batches, remat, virtual_stages)
    s_count = sched.num_stages
    cost = {kind: [c / virtual_stages] * s_count for kind, c in UNIT_COSTS.items()}
    return timeline(sched.orders, cost)


def step_time(evs: Sequence[Event]) -> float:
    return max(e.end for e in evs) - min(e.start for e in evs)


def bubble(evs: Sequence[Event]) -> float:
    """The idle fraction of the step, over all devices: 1 - busy time / (devices x step time)."""
    rows = {e.row for e in evs}
    busy = sum(e.end - e.start for e in evs)
    return 1.0 - busy / (len(rows) * step_time(evs))


def held_over_time(
    evs: Sequence[Event],
    weight: Sequence[float] | None = None,
    after_input: Sequence[float] | None = None,
    sums: Sequence[float] | None = None,
) -> list[list[tuple[float, float]]]:
    """Per device, (time, level) steps of what it holds: a (stage, micro-batch) is held from its
    forward's start to the end of its last backward unit (B, or W), weighted by ``weight[stage]``
    (default 1: a count).

    With ``after_input``, a micro-batch whose backward is split weighs ``after_input[stage]`` from
    the end of its I to the end of its W instead: what W reads (for a dense layer, its input and its
    output gradient) rather than what the forward kept. With ``sums``, ``sums[stage]`` (the stage's
    weight-gradient sums over micro-batches) is held from the end of the stage's first B or W on."""
    rows = max(e.row for e in evs) + 1
    last_backward: dict[tuple[int, int], Event] = {}
    input_end: dict[tuple[int, int], float] = {}
    first_sum: dict[int, Event] = {}
    for e in evs:
        key = (e.stage, e.micro_batch)
        if e.kind in (BACKWARD, BACKWARD_WEIGHT):
            if key not in last_backward or e.end > last_backward[key].end:
                last_backward[key] = e
            if e.stage not in first_sum or e.end < first_sum[e.stage].end:
                first_sum[e.stage] = e
        if e.kind == BACKWARD_INPUT:
            input_end[key] = e.end
    changes: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
    for e in evs:
        if e.kind != FORWARD:
            continue
        key = (e.stage, e.micro_batch)
        w = 1.0 if weight is None else float(weight[e.stage])
        changes[e.row].append((e.start, w))
        end = last_backward.get(key)
        if end is None:
            continue
        if after_input is not None and key in input_end and end.kind == BACKWARD_WEIGHT:
            a = float(after_input[e.stage])
            changes[e.row].append((input_end[key], a - w))
            w = a
        changes[e.row].append((end.end, -w))
    for stage, e in first_sum.items() if sums is not None else ():
        changes[e.row].append((e.end, float(sums[stage])))
    out = []
    for row in changes:
        level, steps = 0.0, []
        for t, delta in sorted(row, key=lambda c: (c[0], c[1])):  # a release before an acquire
            level += delta
            steps.append((t, level))
        out.append(steps)
    return out


def peak_in_flight(evs: Sequence[Event]) -> list[int]:
    """Per device, the most (stage, micro-batch) pairs it holds at once: forward started, last
    backward unit not finished. (Without remat a device keeps their activations; with it, their
    stage inputs.)"""
    return [int(round(max([lv for _, lv in steps] + [0.0]))) for steps in held_over_time(evs)]


def peak_held(
    evs: Sequence[Event],
    weight: Sequence[float],
    after_input: Sequence[float] | None = None,
    sums: Sequence[float] | None = None,
) -> list[float]:
    """Per device, the most bytes it holds at once (``held_over_time``'s weights, e.g. activation
    bytes per stage and micro-batch)."""
    return [max([lv for _, lv in steps] + [0.0]) for steps in held_over_time(evs, weight, after_input, sums)]


def deferred_segments(budget_bytes: int | None, weight_held_bytes: list[int | None]) -> int:
    """How many of a stage's first segments leave their weight gradient to W: as many as keep what
    they hold from I to W (``weight_held_bytes``, per segment in forward order; 0 for a segment
    without weights, None where unknown) within ``budget_bytes`` (``weight_budgets``: at most what
    the stage's forward keeps).

    Qi et al.'s ZB-H1 promises 1F1B's peak on the premise that a micro-batch between I and W weighs
    no more than after its forward (W reads a subset of what B reads). Where W's reads are as big as
    the activations (a dense layer's: its input and its product's gradient, twice what its forward
    keeps), deferring every weight gradient breaks that premise; the segments past the budget take
    theirs in I (one backward pass, as B: the same work, only not deferrable). The first segments
    defer: I reaches them last, so what the others would hold is freed as I goes. An unknown size
    or budget defers everything."""
    if budget_bytes is None or any(b is None for b in weight_held_bytes):
        return len(weight_held_bytes)
    held, count = 0, 0
    for b in weight_held_bytes:
        held += int(b or 0)
        if held > budget_bytes:
            break
        count += 1
    return count


def held_counts(order: Sequence[Op]) -> list[tuple[int, int]]:
    """At each forward's start in a device's ``order``: how many micro-batches the device then holds
    between their forward and their I (or B), this one included, and how many between their I and
    their W. A device's holdings grow only when a forward starts, so these are its fullest instants."""
    forward_held: set[tuple[int, int]] = set()
    weight_held: set[tuple[int, int]] = set()
    counts = []
    for op in order:
        key = (op.stage, op.micro_batch)
        if op.kind == FORWARD:
            forward_held.add(key)
            counts.append((len(forward_held), len(weight_held)))
        elif op.kind in GRADIENT_KINDS:
            forward_held.discard(key)
            if op.kind == BACKWARD_INPUT:
                weight_held.add(key)
        elif op.kind == BACKWARD_WEIGHT:
            weight_held.discard(key)
    return counts


def weight_budgets(schedule: Schedule, kept_bytes: Sequence[int | None]) -> list[int | None]:
    """Per stage, the most bytes one micro-batch may hold from its I to its W (the budget of
    ``deferred_segments``), from what each stage's forward keeps of a micro-batch (``kept_bytes``;
    None: not known, e.g. a stage not traced yet).

    Every schedule: what the stage's forward keeps (Qi et al.'s premise). ZB-H1 promises more, 1F1B's
    peak: no device holds more than 1F1B's fullest (K - d micro-batches on device d, whatever each
    weighs). Since ZB-H1 holds up to K on every device, where stages keep different bytes (the last
    also the head's and a received input, the first nothing of the batch it reads) its later devices
    would pass it; so there a micro-batch between I and W may hold only what is left under that peak
    at the device's fullest instants (``held_counts``: f awaiting their I, w their W): (peak - f x
    kept) / w. The peak is 1F1B's over the stages whose sizes are known (the executor learns a
    stage's when it traces its first forward, after every earlier stage's), so a budget is never
    above the one all sizes would give. Devices holding several stages keep the premise's budget."""
    budgets = [None if b is None else int(b) for b in kept_bytes]
    if schedule.name != "zb_h1" or schedule.virtual_stages != 1:
        return budgets
    k, m = schedule.num_devices, schedule.num_micro_batches
    known = [(s, b) for s, b in enumerate(budgets) if b is not None]
    peak = max([min(k - schedule.device_of(s), m) * b for s, b in known] + [0])
    for s, kept in known:
        order = schedule.orders[schedule.device_of(s)]
        if any(op.stage != s for op in order):
            continue
        for forward_count, weight_count in held_counts(order):
            if weight_count:
                budgets[s] = min(budgets[s], max(0, (peak - forward_count * kept) // weight_count))
    return budgets


def theoretical_bubble(num_stages: int, num_micro_batches: int, virtual_stages: int = 1) -> float:
    """(K - 1) / (v M + K - 1): fill-drain's and 1F1B's bubble (v = 1) and interleaved 1F1B's, when
    every stage costs the same."""
    return (num_stages - 1) / (virtual_stages * num_micro_batches + num_stages - 1)


def zb_h1_bubble_time(
    num_stages: int, forward: float, backward_input: float, backward_weight: float
) -> float:
    """ZB-H1's idle time per device: (K - 1)(T_F + T_B - T_W) (Qi et al., 2023)."""
    return (num_stages - 1) * (forward + backward_input - backward_weight)


def one_f_one_b_split_bubble_time(num_stages: int, forward: float, backward_input: float) -> float:
    """``one_f_one_b_split``'s idle time per device: (K - 1)(T_F + T_I), 1F1B's (K - 1)(T_F + T_I +
    T_W) less (K - 1) T_W. Derived here (the simulator checks it): the last device runs F, I, W back
    to back, M (T_F + T_I + T_W) after the fill's K - 1 forwards; its last I's gradient then passes
    K - 1 input gradients back (1F1B passes K - 1 whole backwards), and the first device's last W
    ends the step. ZB-H1, holding K micro-batches on every device, saves (K - 1) T_W more by moving
    W into the bubbles."""
    return (num_stages - 1) * (forward + backward_input)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ScheduleError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScheduleError(f"{name} must be an int >= 1, got {value!r}")
    return value
