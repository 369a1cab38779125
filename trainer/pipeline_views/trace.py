"""A pipelined step as Chrome/Perfetto trace events (JSON): open it in ui.perfetto.dev or chrome://tracing.

One row (thread) per device; every unit (forward, recompute, backward, input or weight gradient of a
micro-batch on a stage) is a complete event ("X") at its start with its duration; a hand-off between
devices (an activation forward, a gradient backward) is a flow arrow ("s" to "f") from the producer's
end to the consumer's start; a counter track ("C") follows the activation bytes each device holds
(a (stage, micro-batch) is held from its forward's start to the end of its last backward unit).
Measured steps (``--mode=profile_pipeline``) and simulated ones (``tools.pipeline_sim --trace``) are
written the same way, so the two can be opened side by side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from layers.parallel.pipeline import memory, timeline
from layers.parallel.pipeline import schedule as schedules


def trace_events(
    events: Sequence[timeline.Event],
    num_stages: int,
    title: str,
    activation_bytes: Sequence[float] | None = None,
    row_labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The trace of ``events`` (seconds) as a JSON-ready dict; ``activation_bytes[s]`` is what one
    micro-batch's activations on stage s weigh (default 1 each: the counter counts them)."""
    if not events:
        raise ValueError("no events to trace")
    t0 = min(e.start for e in events)
    rows = max(e.row for e in events) + 1
    labels = list(row_labels) if row_labels is not None else [f"device {d}" for d in range(rows)]
    out: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": title}}]
    for d in range(rows):
        out.append({"ph": "M", "pid": 0, "tid": d, "name": "thread_name", "args": {"name": labels[d]}})
        out.append({"ph": "M", "pid": 0, "tid": d, "name": "thread_sort_index", "args": {"sort_index": d}})

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    by_op = {e.op: e for e in events}
    for e in sorted(events, key=lambda e: (e.start, e.row)):
        out.append(
            {
                "ph": "X",
                "pid": 0,
                "tid": e.row,
                "name": f"{e.kind} m{e.micro_batch} s{e.stage}",
                "cat": e.kind,
                "ts": us(e.start),
                "dur": round((e.end - e.start) * 1e6, 3),
                "args": {"stage": e.stage, "micro_batch": e.micro_batch, "kind": e.kind},
            }
        )
    flow = 0
    s_count = max(num_stages, max(e.stage for e in events) + 1)
    for e in events:
        for dep in schedules.dependencies(e.op, s_count, by_op):
            src = by_op.get(dep)
            if src is None or src.row == e.row:
                continue
            flow += 1
            name = "activation" if e.kind == schedules.FORWARD else "gradient"
            out.append({"ph": "s", "pid": 0, "tid": src.row, "id": flow, "name": name, "cat": "transfer",
                        "ts": us(src.end)})  # fmt: skip
            out.append({"ph": "f", "bp": "e", "pid": 0, "tid": e.row, "id": flow, "name": name,
                        "cat": "transfer", "ts": us(e.start)})  # fmt: skip
    weight = list(activation_bytes) if activation_bytes is not None else None
    counter = "activation bytes" if weight is not None else "micro-batches held"
    for d, steps in enumerate(memory.held_over_time(events, weight)):
        for t, level in steps:
            out.append({"ph": "C", "pid": 0, "tid": d, "name": f"{counter} device {d}", "ts": us(t),
                        "args": {counter: level}})  # fmt: skip
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write(path: str, trace: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(trace, f)
