"""torch.distributed.pipelining's seven schedule classes as the CSV text its ``_dump_csv`` writes,
made here so the tests need no PyTorch.

The text format is PyTorch's: ``csv.writer``'s default dialect (cells joined by commas, rows ended
by ``\\r\\n``), one row per rank, one action per cell as ``_Action`` prints it (``2F0``, ``1B3``,
``1I3``, ``1W3``, ``0REDUCE_GRAD``, ``(1F4;2B1)OVERLAP_F_B``), and an empty cell where the rank is
idle (its ``None``). The orders follow each class's shape: GPipe and 1F1B one stage per rank, each
stage's ``REDUCE_GRAD`` last; Interleaved1F1B (Megatron-LM's order), LoopedBFS (every forward of a
rank's first stage, then its second, then the backwards in reverse) and InterleavedZeroBubble (the
interleaved order with each B split into I and a W deferred behind the next unit) two stages per
rank, looped; ZBVZeroBubble and DualPipeV two per rank in a V, DualPipeV's forward-then-backward
pairs written as one ``OVERLAP_F_B`` cell. Idle cells open each rank's row as PyTorch staggers
them: rank r's first r cells.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from layers.parallel.pipeline import schedule as ps

CLASSES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
_CODE = {ps.FORWARD: "F", ps.BACKWARD: "B", ps.BACKWARD_INPUT: "I", ps.BACKWARD_WEIGHT: "W"}


def stages_per_rank(name: str) -> int:
    return 1 if name in ("GPipe", "1F1B") else 2


def actions(name: str, k: int, m: int) -> list[list[str | None]]:
    """Each rank's cells for schedule class ``name`` at K ranks and M micro-batches."""
    if name == "GPipe":
        orders = [[ps.Op(r, b, ps.FORWARD) for b in range(m)] + [ps.Op(r, b, ps.BACKWARD) for b in range(m)]
                  for r in range(k)]  # fmt: skip
    elif name == "1F1B":
        orders = [list(o) for o in ps.build("one_f_one_b", k, m).orders]
    elif name == "Interleaved1F1B":
        orders = [list(o) for o in ps.build("interleaved_1f1b", k, m, virtual_stages=2).orders]
    elif name == "LoopedBFS":
        orders = [_looped_bfs(r, k, m) for r in range(k)]
    elif name == "InterleavedZeroBubble":
        orders = [_deferred_w(o) for o in ps.build("interleaved_1f1b", k, m, virtual_stages=2).orders]
    elif name == "ZBVZeroBubble":
        orders = [list(o) for o in ps.build("zbv", k, m, virtual_stages=2).orders]
    elif name == "DualPipeV":
        orders = [list(o) for o in ps.build("dualpipe_v", k, m, virtual_stages=2).orders]
    else:
        raise ValueError(f"unknown schedule class {name!r}")
    rows: list[list[str | None]] = []
    for r, order in enumerate(orders):
        cells = [None] * r + _cells(order, overlap=name == "DualPipeV")
        if name in ("GPipe", "1F1B"):
            cells.append(f"{r}REDUCE_GRAD")
        rows.append(cells)
    return rows


def dump_csv(rows: Sequence[Sequence[str | None]]) -> str:
    """``rows`` as PyTorch's ``_dump_csv`` writes them (``csv.writer``, ``None`` as an empty cell)."""
    out = io.StringIO()
    writer = csv.writer(out)
    for row in rows:
        writer.writerow(row)
    return out.getvalue()


def _cells(order: Sequence[ps.Op], overlap: bool) -> list[str | None]:
    """The ops as cells; with ``overlap``, a forward followed at once by a full backward of the
    rank's other stage as one ``OVERLAP_F_B`` cell."""
    out: list[str | None] = []
    i = 0
    while i < len(order):
        op = order[i]
        text = f"{op.stage}{_CODE[op.kind]}{op.micro_batch}"
        nxt = order[i + 1] if i + 1 < len(order) else None
        if overlap and op.kind == ps.FORWARD and nxt and nxt.kind == ps.BACKWARD and nxt.stage != op.stage:
            out.append(f"({text};{nxt.stage}B{nxt.micro_batch})OVERLAP_F_B")
            i += 2
            continue
        out.append(text)
        i += 1
    return out


def _looped_bfs(r: int, k: int, m: int) -> list[ps.Op]:
    stages = [r, r + k]
    ops = [ps.Op(s, b, ps.FORWARD) for s in stages for b in range(m)]
    return ops + [ps.Op(s, b, ps.BACKWARD) for s in reversed(stages) for b in reversed(range(m))]


def _deferred_w(order: Sequence[ps.Op]) -> list[ps.Op]:
    """Each B as I, its W one unit later (after the next op, or at the end)."""
    out: list[ps.Op] = []
    pending: list[ps.Op] = []
    for op in order:
        if op.kind != ps.BACKWARD:
            out.append(op)
            out += pending
            pending = []
            continue
        out += pending
        out.append(ps.Op(op.stage, op.micro_batch, ps.BACKWARD_INPUT))
        pending = [ps.Op(op.stage, op.micro_batch, ps.BACKWARD_WEIGHT)]
    return out + pending
