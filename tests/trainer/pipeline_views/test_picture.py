"""The pipeline timeline picture: a PNG with one row per stage and one coloured box per op."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from layers.parallel.pipeline import schedule as ps
from layers.parallel.pipeline import simulator as sim
from layers.parallel.pipeline import timeline as tl
from trainer.pipeline_views import picture as pipeline_picture


def _image(png: bytes) -> Image.Image:
    return Image.open(io.BytesIO(png)).convert("RGB")


def test_draws_a_box_of_each_kind_on_each_stage_row():
    p = sim.simulate("fill_drain", 4, "always", sim.StageCosts.given([0.002, 0.003, 0.002]))
    img = _image(pipeline_picture.draw_png(p.events, "test", ["/device:CPU:0", "b", "c"]))
    assert img.size[0] == 1200
    rows = 3
    for k in range(rows):
        y = (
            pipeline_picture._TOP
            + k * (pipeline_picture._ROW + pipeline_picture._GAP)
            + pipeline_picture._ROW // 2
        )
        seen = {
            img.getpixel((x, y)) for x in range(pipeline_picture._LEFT, img.size[0] - pipeline_picture._RIGHT)
        }
        for kind in ps.KINDS:
            assert pipeline_picture.COLORS[kind] in seen, (k, kind)


def test_boxes_sit_where_the_events_are():
    evs = [tl.Event(0.0, 0.5, 0, 0, ps.FORWARD), tl.Event(0.5, 1.0, 0, 0, ps.BACKWARD)]
    img = _image(pipeline_picture.draw_png(evs, "two ops", width=1000))
    y = pipeline_picture._TOP + 4
    plot = 1000 - pipeline_picture._LEFT - pipeline_picture._RIGHT
    assert img.getpixel((pipeline_picture._LEFT + plot // 4, y)) == pipeline_picture.COLORS[ps.FORWARD]
    assert img.getpixel((pipeline_picture._LEFT + 3 * plot // 4, y)) == pipeline_picture.COLORS[ps.BACKWARD]


def test_bad_input():
    with pytest.raises(ValueError, match="no events"):
        pipeline_picture.draw_png([], "x")
    with pytest.raises(ValueError, match="1 row labels for 2 stages"):
        pipeline_picture.draw_png(tl.events("fill_drain", 2, 2), "x", ["only one"])
