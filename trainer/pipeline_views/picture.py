"""A picture of a pipelined step: one row per stage's device, one box per (stage, micro-batch) op.

Forward boxes are blue, recomputes orange, backwards green; each box carries its micro-batch number,
and the time axis is in milliseconds. The same drawing serves a measured step (events read from a
profile) and a simulated one (``layers.parallel.pipeline.simulator``), so the two can be put side by side.
Drawn with Pillow (already a dependency of TensorBoard's stack): PNG bytes out.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import timeline

COLORS = {
    schedules.FORWARD: (66, 133, 244),
    schedules.RECOMPUTE: (251, 140, 0),
    schedules.BACKWARD: (52, 168, 83),
    schedules.BACKWARD_INPUT: (0, 137, 123),
    schedules.BACKWARD_WEIGHT: (171, 71, 188),
}
_ROW, _GAP, _LEFT, _RIGHT, _TOP, _AXIS = 34, 8, 150, 24, 44, 54


def draw_png(
    events: Sequence[timeline.Event],
    title: str,
    row_labels: Sequence[str] | None = None,
    width: int = 1200,
) -> bytes:
    """The timeline of ``events`` (start/end in seconds) as PNG bytes.

    ``row_labels`` names each device's row; by default ``stage k`` (one stage per device), or the
    device and the stages it holds (virtual stages, a V). Each box
    shows its micro-batch (and, with virtual stages, ``m/s`` with its stage).
    """
    if not events:
        raise ValueError("no events to draw")
    k_count = max(e.row for e in events) + 1
    interleaved = any(e.stage != e.row for e in events)
    held = [sorted({e.stage for e in events if e.row == k}) for k in range(k_count)]
    default = [
        f"device {k} (stages {','.join(map(str, held[k]))})" if interleaved else f"stage {k}"
        for k in range(k_count)
    ]
    labels = list(row_labels) if row_labels is not None else default
    if len(labels) != k_count:
        raise ValueError(f"{len(labels)} row labels for {k_count} stages")
    t0 = min(e.start for e in events)
    span = max(e.end for e in events) - t0 or 1.0
    height = _TOP + k_count * (_ROW + _GAP) + _AXIS
    image = Image.new("RGB", (width, height), "white")
    pen = ImageDraw.Draw(image)
    font, small = _font(14), _font(11)
    plot = width - _LEFT - _RIGHT

    def x_of(t: float) -> float:
        return _LEFT + (t - t0) / span * plot

    pen.text((_LEFT, 10), title, fill="black", font=font)
    for k, label in enumerate(labels):
        y = _TOP + k * (_ROW + _GAP)
        pen.rectangle([_LEFT, y, _LEFT + plot, y + _ROW], fill=(245, 245, 245))
        pen.text((8, y + _ROW // 2 - 7), label[:22], fill="black", font=small)
    for e in events:
        y = _TOP + e.row * (_ROW + _GAP)
        x0, x1 = x_of(e.start), max(x_of(e.end), x_of(e.start) + 1)
        pen.rectangle([x0, y + 2, x1, y + _ROW - 2], fill=COLORS[e.kind], outline="white")
        text = f"{e.micro_batch}/{e.stage}" if interleaved else str(e.micro_batch)
        if x1 - x0 >= 8 * len(text) + 2:
            pen.text(((x0 + x1) / 2, y + _ROW / 2), text, fill="white", font=small, anchor="mm")
    _axis(pen, small, t0, span, plot, _TOP + k_count * (_ROW + _GAP))
    _legend(pen, small, width, height)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _axis(
    pen: ImageDraw.ImageDraw, font: ImageFont.ImageFont, t0: float, span: float, plot: int, y: int
) -> None:
    pen.line([_LEFT, y, _LEFT + plot, y], fill="black")
    step = _tick_step(span * 1e3)
    tick = 0.0
    while tick <= span * 1e3 + 1e-9:
        x = _LEFT + tick / (span * 1e3) * plot
        pen.line([x, y, x, y + 4], fill="black")
        pen.text((x, y + 6), f"{tick:g}", fill="black", font=font, anchor="mt")
        tick += step
    pen.text((_LEFT + plot, y + 22), "ms", fill="black", font=font, anchor="rt")


def _legend(pen: ImageDraw.ImageDraw, font: ImageFont.ImageFont, width: int, height: int) -> None:
    x = _LEFT
    for kind, color in COLORS.items():
        pen.rectangle([x, height - 16, x + 12, height - 4], fill=color)
        pen.text((x + 16, height - 17), kind, fill="black", font=font)
        x += 130


def _tick_step(span_ms: float) -> float:
    """A round tick spacing giving 5 to 10 ticks."""
    raw = span_ms / 8
    base = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if base * mult >= raw:
            return base * mult
    return base * 10


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()
