"""Pipeline schedules as data: which (stage, micro-batch) work each stage does, in which order, and when.

A schedule is, per stage, the ordered list of its ops: a forward, a recompute (re-materialization: the
stage's forward run again in the backward pass) or a backward of one micro-batch. ``stage_orders``
gives that order for GPipe's ``fill_drain`` and for ``one_f_one_b`` (1F1B, PipeDream-flush); then
``timeline`` places every op in time from per-op costs under the pipeline's dependencies:

- forward (k, m) needs forward (k - 1, m): a stage's input is the previous stage's output;
- backward (k, m), and the recompute before it, need backward (k + 1, m): the output gradient; the
  last stage's backward needs only its own forward (the loss is computed in the last stage);
- a stage runs one op at a time, in its order.

``events`` is that timeline in unit clocks (forward 1, backward 2, recompute 1): what the tests check
against the closed forms, and what the simulator and the timeline picture read with real costs.
Everything here is plain Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

FORWARD, RECOMPUTE, BACKWARD = "forward", "recompute", "backward"
KINDS = (FORWARD, RECOMPUTE, BACKWARD)
SCHEDULES = ("fill_drain", "one_f_one_b")
REMAT_POLICIES = ("always", "except_last", "never")
UNIT_COSTS = {FORWARD: 1.0, RECOMPUTE: 1.0, BACKWARD: 2.0}


@dataclasses.dataclass(frozen=True)
class Op:
    """One unit of pipeline work: ``kind`` of micro-batch ``micro_batch`` on stage ``stage``."""

    stage: int
    micro_batch: int
    kind: str


@dataclasses.dataclass(frozen=True)
class Event:
    """An op placed in time: it runs on its stage from ``start`` to ``end``."""

    start: float
    end: float
    stage: int
    micro_batch: int
    kind: str

    @property
    def op(self) -> Op:
        return Op(self.stage, self.micro_batch, self.kind)


def remat_micro_batches(remat: str, num_micro_batches: int) -> list[bool]:
    """Which micro-batches a stage re-materializes under a remat policy. ``except_last`` skips the
    last micro-batch, whose backward comes soonest after its forward."""
    _check_choice("remat", remat, REMAT_POLICIES)
    m_count = _positive("num_micro_batches", num_micro_batches)
    return [remat == "always" or (remat == "except_last" and m < m_count - 1) for m in range(m_count)]


def stage_orders(
    schedule: str, num_stages: int, num_micro_batches: int, remat: str = "never"
) -> list[list[Op]]:
    """Each stage's ops in the order it runs them.

    fill_drain: every forward (m = 0..M-1), then every backward in reverse (m = M-1..0), as GPipe.
    one_f_one_b: stage k first runs min(K - k, M) forwards, then alternates one backward (oldest micro-
    batch first) and one forward until the forwards are done, then the remaining backwards; so stage k
    never holds more than K - k micro-batches between their forward and their backward.
    A re-materialized micro-batch's recompute comes right before its backward.
    """
    _check_choice("schedule", schedule, SCHEDULES)
    k_count = _positive("num_stages", num_stages)
    m_count = _positive("num_micro_batches", num_micro_batches)
    remat_of = remat_micro_batches(remat, m_count)

    def backward(k: int, m: int) -> list[Op]:
        ops = [Op(k, m, RECOMPUTE)] if remat_of[m] else []
        return ops + [Op(k, m, BACKWARD)]

    orders = []
    for k in range(k_count):
        ops: list[Op] = []
        if schedule == "fill_drain":
            ops += [Op(k, m, FORWARD) for m in range(m_count)]
            for m in reversed(range(m_count)):
                ops += backward(k, m)
        else:
            warmup = min(k_count - k, m_count)
            ops += [Op(k, m, FORWARD) for m in range(warmup)]
            for m in range(m_count):
                ops += backward(k, m)
                if warmup + m < m_count:
                    ops.append(Op(k, warmup + m, FORWARD))
        orders.append(ops)
    return orders


def timeline(
    orders: Sequence[Sequence[Op]],
    cost: dict[str, Sequence[float]],
    transfer: float = 0.0,
    alone_speedup: Sequence[float] | None = None,
) -> list[Event]:
    """Places every op in time, as early as its stage and its inputs allow.

    ``cost[kind][k]`` is the duration of one ``kind`` op of stage k; ``transfer`` is added to every
    hand-off between stages (an activation forward, a gradient backward). ``alone_speedup[k]`` (default
    1: every stage owns its device) is how many times faster stage k works while no other stage is
    busy: where the stages' devices share the host's cores, a lone stage's independent ops (a layer's
    input and weight gradients) spread over the idle ones. Returns the events sorted by start time,
    then stage. Raises ValueError if the orders deadlock (an op waits for one that can only run after
    it).
    """
    k_count = len(orders)
    for kind in KINDS:
        if len(cost.get(kind, ())) != k_count:
            raise ValueError(f"cost[{kind!r}] needs one duration per stage ({k_count})")
    if alone_speedup is not None:
        if len(alone_speedup) != k_count or any(not (a >= 1.0) for a in alone_speedup):
            raise ValueError(f"alone_speedup needs a factor >= 1 per stage ({k_count}), got {alone_speedup}")
        if any(a != 1.0 for a in alone_speedup):
            return _shared_timeline(orders, cost, transfer, alone_speedup)
    done: dict[Op, float] = {}
    stage_free = [0.0] * k_count
    position = [0] * k_count
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for k in range(k_count):
            while position[k] < len(orders[k]):
                op = orders[k][position[k]]
                ready = _ready_time(op, k_count, done, transfer)
                if ready is None:
                    break
                start = max(ready, stage_free[k])
                end = start + float(cost[op.kind][k])
                done[op] = end
                stage_free[k] = end
                events.append(Event(start, end, op.stage, op.micro_batch, op.kind))
                position[k] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise _deadlock(orders, position)
    return sorted(events, key=lambda e: (e.start, e.stage))


def _shared_timeline(
    orders: Sequence[Sequence[Op]], cost: dict[str, Sequence[float]], transfer: float, alone: Sequence[float]
) -> list[Event]:
    """``timeline`` where a stage's speed depends on how many stages are busy: an event loop that
    advances to the next finish or hand-off, each running op progressing at 1 / cost (times
    ``alone[k]`` while it is the only one running)."""
    k_count = len(orders)
    done: dict[Op, float] = {}
    position = [0] * k_count
    running: dict[int, list] = {}  # stage -> [op, start, work left as a fraction of the op]
    events: list[Event] = []
    now = 0.0
    while any(position[k] < len(orders[k]) for k in range(k_count)) or running:
        waits = []
        for k in range(k_count):
            if k in running or position[k] >= len(orders[k]):
                continue
            op = orders[k][position[k]]
            ready = _ready_time(op, k_count, done, transfer)
            if ready is not None and ready <= now + 1e-12:
                running[k] = [op, now, 1.0]
                position[k] += 1
            elif ready is not None:
                waits.append(ready - now)
        for k in [k for k, (op, _, _) in running.items() if float(cost[op.kind][k]) <= 0.0]:
            op, start, _ = running.pop(k)  # a free op ends where it starts
            done[op] = now
            events.append(Event(start, now, op.stage, op.micro_batch, op.kind))
        if not running:
            if not waits:
                if any(position[k] < len(orders[k]) for k in range(k_count)):
                    raise _deadlock(orders, position)
                break
            now += min(waits)
            continue
        speed = {
            k: (alone[k] if len(running) == 1 else 1.0) / float(cost[op.kind][k])
            for k, (op, _, _) in running.items()
        }
        step = min([left / speed[k] for k, (_, _, left) in running.items()] + waits)
        now += step
        for k in list(running):
            running[k][2] -= speed[k] * step
            if running[k][2] <= 1e-9:
                op, start, _ = running.pop(k)
                done[op] = now
                events.append(Event(start, now, op.stage, op.micro_batch, op.kind))
    return sorted(events, key=lambda e: (e.start, e.stage))


def _deadlock(orders: Sequence[Sequence[Op]], position: list[int]) -> ValueError:
    stuck = [order[p] for order, p in zip(orders, position) if p < len(order)]
    return ValueError(f"the stage orders deadlock: {stuck} each wait for an op that cannot run")


def _ready_time(op: Op, k_count: int, done: dict[Op, float], transfer: float) -> float | None:
    """When ``op``'s inputs exist, or None if some input is not placed yet."""
    if op.kind == FORWARD:
        if op.stage == 0:
            return 0.0
        dep, hop = Op(op.stage - 1, op.micro_batch, FORWARD), transfer
    elif op.stage == k_count - 1:
        dep, hop = Op(op.stage, op.micro_batch, FORWARD), 0.0
    else:
        dep, hop = Op(op.stage + 1, op.micro_batch, BACKWARD), transfer
    return done[dep] + hop if dep in done else None


def events(schedule: str, num_stages: int, num_micro_batches: int, remat: str = "never") -> list[Event]:
    """The schedule in unit clocks (forward 1, recompute 1, backward 2), every stage alike."""
    orders = stage_orders(schedule, num_stages, num_micro_batches, remat)
    return timeline(orders, {kind: [c] * num_stages for kind, c in UNIT_COSTS.items()})


def step_time(evs: Sequence[Event]) -> float:
    return max(e.end for e in evs) - min(e.start for e in evs)


def bubble(evs: Sequence[Event]) -> float:
    """The idle fraction of the step, over all stages: 1 - busy time / (stages x step time)."""
    stages = {e.stage for e in evs}
    busy = sum(e.end - e.start for e in evs)
    return 1.0 - busy / (len(stages) * step_time(evs))


def peak_in_flight(evs: Sequence[Event]) -> list[int]:
    """Per stage, the most micro-batches it holds at once: forward started, backward not finished.
    (Without remat a stage keeps those micro-batches' activations; with it, their stage inputs.)"""
    k_count = max(e.stage for e in evs) + 1
    peaks = []
    for k in range(k_count):
        changes = []
        for e in evs:
            if e.stage == k and e.kind == FORWARD:
                changes.append((e.start, 1))
            elif e.stage == k and e.kind == BACKWARD:
                changes.append((e.end, -1))
        level = peak = 0
        for _, delta in sorted(changes, key=lambda c: (c[0], c[1])):  # a release before an acquire
            level += delta
            peak = max(peak, level)
        peaks.append(peak)
    return peaks


def theoretical_bubble(num_stages: int, num_micro_batches: int) -> float:
    """(K - 1) / (M + K - 1): the bubble of both schedules when every stage costs the same."""
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value
