"""The Transformer LM family the capacity and plan benchmarks climb: ``lm.synthetic.GPipeTransformerLM``
at (layers, width) rungs, each rung larger than the last, the knobs every rung shares, and the search
for the largest rung that fits (``gallop``)."""

from __future__ import annotations

from collections.abc import Callable

LADDER = [
    (8, w)
    for w in (128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1152, 1280, 1536, 1792, 2048)
]
QUICK_LADDER = [(4, 32), (8, 64)]  # 4 layers and more: a layer for each stage of gpipe_k4
BASE = {"num_heads": 4, "seq_length": 128, "batch_size": 8, "warmup_steps": 1, "max_steps": 10}


def gallop(count: int, attempt: Callable[[int], str | None]) -> tuple[int, str | None]:
    """The largest index below ``count`` for which ``attempt(i)`` succeeds (returns None; else the
    reason it failed), -1 for none, and the failure that bounds it (None: the last index succeeds).
    Index i + 1 needs at least the memory of i, so the search gallops up (1, 2, 4, 8, ... above the
    largest success) until an attempt fails, then bisects between the two: an answer at index n costs
    about 2 log2(n) attempts instead of n."""
    fits, fails, step, failure = -1, count, 1, None
    while fails - fits > 1:
        i = min(fits + step, fails - 1) if failure is None else (fits + fails) // 2
        why = attempt(i)
        if why is None:
            fits, step = i, step * 2
        else:
            fails, failure = i, why
    return fits, failure
