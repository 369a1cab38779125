"""Schedules in torch.distributed.pipelining's format: per-rank action lists and their CSV.

An action is ``<stage><type><micro-batch>``: ``2F0`` (forward of micro-batch 0 on stage 2), ``1B3``
(full backward), ``1I3`` (backward for the input), ``1W3`` (backward for the weights), and the
transfers ``0SEND_F1`` / ``1RECV_F1`` (an activation from stage 0 to stage 1) and ``1SEND_B1`` /
``0RECV_B1`` (a gradient from stage 1 back to stage 0; a transfer action names the stage that sends
or receives). A CSV holds one row per rank, its actions in order, one per cell; an empty cell is
an idle slot (PyTorch writes its ``None`` so), and a refusal names the bad action's rank and column
(1-based, as a spreadsheet shows it). Compute-only lists
(no SEND/RECV) are PyTorch's "compute only" form; ``to_actions(..., with_transfers=True)`` adds the
transfers where the stages sit on different ranks. The placement is read from the rows: stage s runs
on the rank whose row holds its actions (PyTorch's looped placement, s % K, or a V: rank r holds
stages r and 2K - 1 - r, as ZBV zero-bubble and DualPipeV use); every rank holds the same number of
stages. Recomputes are not actions: the GPipe layer adds them from its
remat policy. Plain Python: no TensorFlow, no torch.

Also read:

- ``<stage>REDUCE_GRAD`` (PyTorch's per-stage gradient reduction, no micro-batch): a no-op. The
  executor sums each stage's gradients over its micro-batches inside the step, and a reduction over
  data-parallel replicas belongs to the optimizer, so nothing is left for the action to do. It must
  name a stage its rank holds and come after that stage's last backward.
- ``(aFi;bBj)OVERLAP_F_B`` (DualPipeV's forward and backward meant to overlap): read as its two
  actions, run one after the other in the order written (no overlap).
- PyTorch's older form, where ``B`` followed later by ``W`` of the same unit is the input gradient
  (today's ``I``): such a ``B`` is read as ``I``. A ``B`` with no ``W`` is a full backward.
"""

from __future__ import annotations

import csv
import io
import re
from collections import Counter, defaultdict
from collections.abc import Sequence

from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import timeline
from layers.parallel.pipeline.schedule import Op, Schedule, ScheduleError

_ACTION = re.compile(r"^(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|B|I|W)(\d+)$")
_REDUCE = re.compile(r"^(\d+)REDUCE_GRAD$")
_OVERLAP = re.compile(r"^\((.*)\)OVERLAP_F_B$")
REDUCE_GRAD = "REDUCE_GRAD"
_KIND_OF = {
    "F": schedules.FORWARD,
    "B": schedules.BACKWARD,
    "I": schedules.BACKWARD_INPUT,
    "W": schedules.BACKWARD_WEIGHT,
}
_CODE_OF = {kind: code for code, kind in _KIND_OF.items()}


def to_actions(schedule: Schedule, with_transfers: bool = False) -> list[list[str]]:
    """Each rank's actions (recomputes left out)."""
    last, on = schedule.num_stages - 1, schedule.device_of
    rows: list[list[str]] = []
    for d, order in enumerate(schedule.orders):
        row = []
        for op in order:
            if op.kind == schedules.RECOMPUTE:
                continue
            s, m = op.stage, op.micro_batch
            gradient = op.kind in schedules.GRADIENT_KINDS
            if with_transfers and op.kind == schedules.FORWARD and s > 0 and on(s - 1) != d:
                row.append(f"{s}RECV_F{m}")
            if with_transfers and gradient and s < last and on(s + 1) != d:
                row.append(f"{s}RECV_B{m}")
            row.append(f"{s}{_CODE_OF[op.kind]}{m}")
            if with_transfers and op.kind == schedules.FORWARD and s < last and on(s + 1) != d:
                row.append(f"{s}SEND_F{m}")
            if with_transfers and gradient and s > 0 and on(s - 1) != d:
                row.append(f"{s}SEND_B{m}")
        rows.append(row)
    return rows


def from_actions(rows: Sequence[Sequence[str]], name: str = "user") -> Schedule:
    """The schedule the ranks' actions describe, after ``validate`` (empty cells are idle slots)."""
    cells = _validated(rows)
    k = len(cells)
    orders = []
    for row in cells:
        ops = []
        for _, action in row:
            s, code, m = _parse(action)
            if code in _KIND_OF:
                ops.append(Op(s, m, _KIND_OF[code]))
        orders.append(tuple(ops))
    stages = 1 + max(op.stage for order in orders for op in order)
    micro = 1 + max(op.micro_batch for order in orders for op in order)
    placement = tuple(
        next(d for d, order in enumerate(orders) if Op(s, 0, schedules.FORWARD) in order)
        for s in range(stages)
    )
    looped = placement == tuple(s % k for s in range(stages))
    return Schedule(name, k, micro, stages // k, tuple(orders), () if looped else placement)


def validate(rows: Sequence[Sequence[str]]) -> None:
    """Raises ScheduleError naming the first bad action by its rank and column (1-based, as a
    spreadsheet shows the CSV; an ``OVERLAP_F_B`` cell's two actions share theirs): one that does not
    parse, a micro-batch past the schedule's M (the most micro-batches a stage runs forwards of: a
    forward of micro-batch 8 where M = 8 is named at that action), a stage on another rank than the
    one holding most of that stage's actions, a unit twice, a backward before its forward, a W before
    its I, a receive with no send, a missing (stage, micro-batch) unit, or an order that waits
    forever. Empty cells (PyTorch's idle slots) are skipped."""
    _validated(rows)


def _validated(rows: Sequence[Sequence[str]]) -> list[list[tuple[int, str]]]:
    """``validate``, then the rows' actions with their columns (``_cells``)."""
    k = len(rows)
    cells = _cells(rows)
    if k == 0 or not any(cells):
        raise ScheduleError("the schedule has no actions")
    parsed = [[(a, *_parse(a, r, c), c) for c, a in row] for r, row in enumerate(cells)]
    if not any(code != REDUCE_GRAD for row in parsed for _, _, code, _, _ in row):
        raise ScheduleError("the schedule has no compute actions")
    stages = 1 + max(s for row in parsed for _, s, _, _, _ in row)
    micro = 1 + max(m for row in parsed for _, _, code, m, _ in row if code != REDUCE_GRAD)
    _check_stray_micro_batches(parsed)
    if stages % k:
        raise ScheduleError(f"{stages} stages cannot be spread over {k} ranks (each rank holds as many)")
    rank_of = _ranks_of_stages(parsed)
    seen: dict[Op, str] = {}
    sends = {
        (a.replace("SEND", "RECV", 1))
        for row in parsed
        for a, _, code, _, _ in row
        if code.startswith("SEND")
    }
    for r, row in enumerate(parsed):
        for i, (action, s, code, m, c) in enumerate(row):
            where = f"rank {r}, column {c} ({action})"
            if rank_of[s] != r:
                raise ScheduleError(f"{where}: stage {s} runs on rank {rank_of[s]}, not rank {r}")
            if code == REDUCE_GRAD:
                later = [a for a, s2, c2, _, _ in row[i + 1 :] if s2 == s and c2 in ("B", "I", "W")]
                if later:
                    raise ScheduleError(
                        f"{where}: stage {s}'s gradient reduction before its backward {later[0]}"
                    )
                continue
            if code.startswith("RECV"):
                peer = s - 1 if code == "RECV_F" else s + 1
                if f"{peer}{code}{m}" not in sends:
                    raise ScheduleError(
                        f"{where}: a receive with no send ({peer}SEND_{code[-1]}{m} "
                        f"on rank {rank_of.get(peer, '?')})"
                    )
                continue
            if code.startswith("SEND"):
                continue
            op = Op(s, m, _KIND_OF[code])
            if op in seen:
                raise ScheduleError(f"{where}: {action} runs twice")
            if op.kind != schedules.FORWARD and Op(s, m, schedules.FORWARD) not in seen:
                raise ScheduleError(f"{where}: a backward before its forward ({s}F{m})")
            if op.kind == schedules.BACKWARD_WEIGHT and Op(s, m, schedules.BACKWARD_INPUT) not in seen:
                raise ScheduleError(f"{where}: a weight gradient before its input gradient ({s}I{m})")
            seen[op] = where
    held = [sorted(s for s, r in rank_of.items() if r == rank) for rank in range(k)]
    if any(len(h) != stages // k for h in held):
        raise ScheduleError(
            f"each rank must hold {stages // k} of the {stages} stages; the ranks hold "
            + ", ".join(f"rank {r}: {h}" for r, h in enumerate(held))
        )
    for s in range(stages):
        for m in range(micro):
            if Op(s, m, schedules.FORWARD) not in seen:
                raise ScheduleError(
                    f"micro-batch {m} is missing on stage {s}: no {s}F{m} on rank {rank_of.get(s, '?')}"
                )
            full = Op(s, m, schedules.BACKWARD) in seen
            split = Op(s, m, schedules.BACKWARD_INPUT) in seen or Op(s, m, schedules.BACKWARD_WEIGHT) in seen
            if full == split or (split and Op(s, m, schedules.BACKWARD_WEIGHT) not in seen):
                raise ScheduleError(
                    f"micro-batch {m} on stage {s} needs one backward: {s}B{m}, or {s}I{m} then {s}W{m}"
                )
    orders = [[Op(s, m, _KIND_OF[c]) for _, s, c, m, _ in row if c in _KIND_OF] for row in parsed]
    cost = {kind: [1.0] * stages for kind in schedules.ALL_KINDS}
    timeline.timeline(orders, cost)  # raises on an order that waits forever
    return cells


def _check_stray_micro_batches(parsed: Sequence[Sequence[tuple]]) -> None:
    """Raises ScheduleError at the first action of a micro-batch past the schedule's M, the most
    distinct micro-batches any stage runs forwards of (so 0 to M - 1 in a consistent schedule)."""
    forwards: dict[int, set[int]] = {}
    for row in parsed:
        for _, s, code, m, _ in row:
            if code == "F":
                forwards.setdefault(s, set()).add(m)
    count = max((len(ms) for ms in forwards.values()), default=0)
    for r, row in enumerate(parsed):
        for action, _, code, m, c in row:
            if code != REDUCE_GRAD and m >= count:
                raise ScheduleError(
                    f"rank {r}, column {c} ({action}): micro-batch {m} is past the schedule's {count} "
                    f"(0 to {count - 1}: the most micro-batches a stage runs)"
                )


def read_csv(text: str) -> list[list[str]]:
    """The rows of a schedule CSV, each cell stripped (empty cells kept: they hold the columns)."""
    return [[cell.strip() for cell in row] for row in csv.reader(io.StringIO(text)) if row]


def write_csv(rows: Sequence[Sequence[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow(list(row))
    return out.getvalue()


def _ranks_of_stages(parsed: Sequence[Sequence[tuple]]) -> dict[int, int]:
    """Each stage's rank: the one whose row holds most of its actions (the lowest on a tie), so a
    single action moved to another rank is the one reported."""
    counts: dict[int, Counter[int]] = defaultdict(Counter)
    for r, row in enumerate(parsed):
        for _, s, *_ in row:
            counts[s][r] += 1
    return {s: max(sorted(by_rank), key=by_rank.__getitem__) for s, by_rank in counts.items()}


def _cells(rows: Sequence[Sequence[str]]) -> list[list[tuple[int, str]]]:
    """Each rank's actions with their 1-based columns, empty cells left out: an ``OVERLAP_F_B`` cell
    as its actions in order; in PyTorch's older form, a ``B`` whose unit has a ``W`` later on the
    same rank as its ``I``."""
    out = []
    for cells in rows:
        row = [(c, a) for c, cell in enumerate(cells, 1) if cell.strip() for a in _overlapped(cell.strip())]
        actions = [a for _, a in row]
        new = []
        for i, (c, action) in enumerate(row):
            match = _ACTION.match(action)
            if match and match[2] == "B" and f"{match[1]}W{match[3]}" in actions[i + 1 :]:
                action = f"{match[1]}I{match[3]}"
            new.append((c, action))
        out.append(new)
    return out


def _overlapped(cell: str) -> list[str]:
    match = _OVERLAP.match(cell)
    return [a.strip() for a in match[1].split(";")] if match else [cell]


def _parse(action: str, rank: int | None = None, column: int | None = None) -> tuple[int, str, int]:
    """(stage, code, micro-batch); ``REDUCE_GRAD`` has micro-batch -1."""
    match = _ACTION.match(action)
    if match:
        return int(match[1]), match[2], int(match[3])
    reduce = _REDUCE.match(action)
    if reduce:
        return int(reduce[1]), REDUCE_GRAD, -1
    where = f"rank {rank}, column {column}: " if rank is not None else ""
    raise ScheduleError(
        f"{where}{action!r} is not an action TensorPipe runs: <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B>"
        "<micro-batch> (e.g. 2F0) or <stage>REDUCE_GRAD"
    )
