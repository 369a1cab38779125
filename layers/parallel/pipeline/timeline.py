"""A schedule laid out in time: each op placed as early as its device and its inputs allow.

``timeline`` places every op of per-device orders from per-op costs under the pipeline's
dependencies (``schedule.dependencies``); a device runs one op at a time, in its order, and a
hand-off between devices costs ``transfer``. ``events`` does it in unit clocks; ``step_time`` and
``bubble`` read a laid-out step; the closed forms (``theoretical_bubble`` and the split schedules'
idle times) are what the layouts are checked against.

Everything here is plain Python: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from layers.parallel.pipeline.schedule import KINDS, UNIT_COSTS, Op, ScheduleError, build, dependencies


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
    total = len(rows) * step_time(evs)
    return 1.0 - busy / total if total > 0 else 0.0  # units of no duration: nothing waits


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
