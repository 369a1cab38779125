"""The network between hosts, as the simulator (and a planner) counts it.

A ``Link`` joins two hosts: each message across it costs ``latency + bytes / rate``, and the messages
one host sends another go one after the other (a link carries one message at a time in each
direction; the two directions are independent, as on a full-duplex link). ``rate_mbit`` None is a link
without a limit (no cost but the latency).

- A pipeline's hand-off (a micro-batch's activation forward, its gradient backward) is sent when the
  unit that made it ends; the sender goes on with its next unit meanwhile, and the receiver's unit
  that needs it starts once it has arrived (``timeline``, the simulator's with ``link=``).
- Replicas' gradient all-reduce is a ring's: each of N replicas sends and receives 2(N - 1)/N of the
  gradient bytes, in 2(N - 1) messages (``allreduce_seconds``), after the step's gradients are done
  (``replicas_step``).
- ``crossover_mbit``: the link rate below which the pipeline's step is the shorter of the two.
- ``Link.host_mbit``: the hosts' own work per byte, e.g. fitted on a step over an unlimited link
  (``fit_host_mbit``). A hand-off is streamed (the sender's serialization feeds the wire as it
  goes), so it takes the slower of the host's and the link's rates; a ring's hop is not (a replica
  receives a chunk, sums it, then sends it on), so the all-reduce takes both, one after the other.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline.timeline import Event


@dataclasses.dataclass(frozen=True)
class Link:
    """A link's rate (Mbit/s of payload in each direction; None: no limit) and one-way latency (s).

    ``host_mbit`` (None: free) is the rate at which the hosts' own software moves a message's bytes
    (copies, serialization, a ring's sums: work on the hosts' cores, which no link rate removes): a
    streamed message's byte takes max(1 / rate, 1 / host_mbit), a ring hop's 1 / rate + 1 / host_mbit.
    ``fit_host_mbit`` finds it from one measured step."""

    rate_mbit: float | None = None
    latency_s: float = 0.0
    host_mbit: float | None = None

    def __post_init__(self) -> None:
        for name in ("rate_mbit", "host_mbit"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Link.{name} must be > 0 (or None: no limit), got {value}")
        if not self.latency_s >= 0:
            raise ValueError(f"Link.latency_s must be >= 0 seconds, got {self.latency_s}")

    def busy_seconds(self, num_bytes: float, streamed: bool = True) -> float:
        """How long ``num_bytes`` occupy the link (no latency): ``streamed``, the host's work overlaps
        the wire (the slower rate counts); otherwise the two add (a ring's receive, sum, send)."""
        per_bit = [1 / (r * 1e6) for r in (self.rate_mbit, self.host_mbit) if r is not None]
        if not per_bit:
            return 0.0
        return num_bytes * 8 * (max(per_bit) if streamed else sum(per_bit))

    def seconds(self, num_bytes: float) -> float:
        """One message of ``num_bytes``: latency + bytes / rate."""
        return self.latency_s + self.busy_seconds(num_bytes)


def allreduce_seconds(gradient_bytes: float, replicas: int, link: Link) -> float:
    """A ring all-reduce of ``gradient_bytes`` over ``replicas`` (each sends 2(N - 1)/N of them)."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if replicas == 1:
        return 0.0
    hops = 2 * (replicas - 1)
    return hops * link.latency_s + link.busy_seconds(hops / replicas * gradient_bytes, streamed=False)


def replicas_step(compute_s: float, gradient_bytes: float, replicas: int, link: Link) -> float:
    """A data-parallel step: a replica's forward and backward (``compute_s``), then the all-reduce."""
    return compute_s + allreduce_seconds(gradient_bytes, replicas, link)


def _handoff_to(op: schedules.Op, num_stages: int) -> int | None:
    """The stage that receives what ``op`` makes (None: nothing leaves its stage)."""
    if op.kind == schedules.FORWARD and op.stage + 1 < num_stages:
        return op.stage + 1
    if op.kind in (schedules.BACKWARD, schedules.BACKWARD_INPUT) and op.stage > 0:
        return op.stage - 1
    return None


def timeline(
    orders: Sequence[Sequence[schedules.Op]],
    cost: dict[str, Sequence[float]],
    link: Link,
    handoff_bytes: float,
) -> list[Event]:
    """``schedule.timeline`` with hand-offs over links: every op placed as early as its device and its
    inputs allow, where an input from another device arrives ``link.seconds(handoff_bytes)`` after it
    is sent, sent when its op ends or when the link from that device to this one is free, whichever is
    later. Raises ScheduleError if the orders deadlock."""
    num_stages = max([len(orders)] + [op.stage + 1 for order in orders for op in order])
    for kind in sorted({op.kind for order in orders for op in order}):
        if len(cost.get(kind, ())) != num_stages:
            raise schedules.ScheduleError(f"cost[{kind!r}] needs one duration per stage ({num_stages})")
    device = {op.stage: d for d, order in enumerate(orders) for op in order}
    done: dict[schedules.Op, float] = {}
    arrives: dict[schedules.Op, float] = {}  # a hand-off's arrival on its receiver's device
    link_free: dict[tuple[int, int], float] = {}
    free = [0.0] * len(orders)
    position = [0] * len(orders)
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for d, order in enumerate(orders):
            while position[d] < len(order):
                op = order[position[d]]
                deps = schedules.dependencies(op, num_stages, done)
                if any(dep not in done for dep in deps):
                    break
                ready = max([0.0] + [arrives.get(dep, done[dep]) for dep in deps])
                start = max(ready, free[d])
                end = start + float(cost[op.kind][op.stage])
                done[op] = free[d] = end
                target = _handoff_to(op, num_stages)
                if target is not None and device.get(target, target) != d:
                    path = (d, device.get(target, target))
                    sent = max(end, link_free.get(path, 0.0)) + link.busy_seconds(handoff_bytes)
                    link_free[path] = sent
                    arrives[op] = sent + link.latency_s
                events.append(Event(start, end, op.stage, op.micro_batch, op.kind, d))
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(
                f"device {d} at {order[position[d]]}"
                for d, order in enumerate(orders)
                if position[d] < len(order)
            )
            raise schedules.ScheduleError(f"the schedule deadlocks: {stuck}")
    return sorted(events, key=lambda e: (e.start, e.row))


def crossover_mbit(
    pipeline_s: Callable[[float], float],
    replicas_s: Callable[[float], float],
    low_mbit: float = 1.0,
    high_mbit: float = 1e6,
) -> float | None:
    """The link rate (Mbit/s) where the pipeline's step (``pipeline_s(rate)``) equals the replicas'
    (``replicas_s(rate)``): below it the pipeline is faster. None when one placement wins over the
    whole range. Bisection on the rate's logarithm."""

    def gap(rate: float) -> float:
        return pipeline_s(rate) - replicas_s(rate)

    lo, hi = math.log(low_mbit), math.log(high_mbit)
    if gap(low_mbit) >= 0 or gap(high_mbit) <= 0:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if gap(math.exp(mid)) < 0:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def interpolated_crossover(
    rates: Sequence[float], pipeline_s: Sequence[float], replicas_s: Sequence[float]
) -> float | None:
    """The rate where measured steps cross: the first pair of neighbouring rates (ascending) where
    the pipeline goes from faster to slower, interpolated linearly in log(rate). None if they do not
    cross."""
    points = sorted(zip(rates, pipeline_s, replicas_s))
    for (r0, p0, q0), (r1, p1, q1) in zip(points, points[1:]):
        g0, g1 = p0 - q0, p1 - q1
        if g0 < 0 <= g1:
            share = -g0 / (g1 - g0)
            return math.exp(math.log(r0) + share * (math.log(r1) - math.log(r0)))
    return None


def fit_host_mbit(step_s: Callable[[float | None], float], measured_s: float) -> float | None:
    """The ``host_mbit`` at which the model's step (``step_s(host_mbit)``) equals a measured one; None
    when the measured step is no longer than the model's without any host cost. Bisection on the
    rate's logarithm (0.01 Mbit/s to 10 Tbit/s)."""
    if measured_s <= step_s(None):
        return None
    lo, hi = math.log(1e-2), math.log(1e7)  # slow hosts: long steps; fast: short
    for _ in range(80):
        mid = (lo + hi) / 2
        if step_s(math.exp(mid)) > measured_s:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)
