"""The trainer's progress line: step, loss, speed and time left."""

from __future__ import annotations

import math
import sys


def print_line(line: str) -> None:
    """The trainer's default log: one line to stdout, flushed (a pipe or a log file sees it at once)."""
    print(line, file=sys.stdout, flush=True)


def format_duration(seconds: float) -> str:
    """'42s', '3m07s', '2h05m'; '?' when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def progress_line(
    step: int, max_steps: int, loss: float, steps_per_sec: float, examples_per_sec: float
) -> str:
    """e.g. ``step 200/1000 (20%)  loss 0.4321  41.2 steps/s  1318 examples/s  ETA 19s``."""
    eta = (max_steps - step) / steps_per_sec if steps_per_sec > 0 else float("inf")
    percent = 100.0 * step / max_steps if max_steps else 100.0
    return (
        f"step {step}/{max_steps} ({percent:.0f}%)  loss {loss:.6g}  {steps_per_sec:.1f} steps/s  "
        f"{examples_per_sec:.0f} examples/s  ETA {format_duration(eta)}"
    )
