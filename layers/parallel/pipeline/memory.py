"""What a schedule holds: the activation and memory model of a pipelined step.

``held_over_time`` steps each device's holdings through a laid-out step (``timeline.Event``s): a
(stage, micro-batch) is held from its forward's start to its last backward unit's end, weighted by
bytes if given; ``peak_in_flight`` and ``peak_held`` are its maxima. For the split backward (I then
W), ``held_counts``, ``weight_budgets`` and ``deferred_segments`` decide how many of a stage's
segments may leave their weight gradient to W: what the GPipe executor defers.

Everything here is plain Python: no TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence

from layers.parallel.pipeline.schedule import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    GRADIENT_KINDS,
    Op,
    Schedule,
)
from layers.parallel.pipeline.timeline import Event


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


class StageBudgets:
    """Per stage of ``schedule``, the budget from I to W (``weight_budgets``), fixed at the stage's
    first forward: every earlier stage's size is known by then."""

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule
        self.kept: dict[int, int | None] = {}  # per stage, what its forward keeps of a micro-batch
        self.budgets: dict[int, int | None] = {}  # per stage, what a micro-batch may hold from I to W

    def budget(self, stage: int, kept: int | None) -> int | None:
        """Stage ``stage``'s budget, given what its forward keeps (``kept``) when first asked."""
        if stage not in self.budgets:
            self.kept[stage] = kept
            sizes = [self.kept.get(t) for t in range(self.schedule.num_stages)]
            self.budgets[stage] = weight_budgets(self.schedule, sizes)[stage]
        return self.budgets[stage]
