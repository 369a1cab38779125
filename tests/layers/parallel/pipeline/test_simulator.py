"""The pipeline simulator: predictions from per-stage costs."""

from __future__ import annotations

import pytest

from layers.parallel.pipeline import schedule as ps
from layers.parallel.pipeline import simulator as sim
from layers.parallel.pipeline import timeline as tl


def test_uniform_stages_match_the_closed_form_step_time():
    costs = sim.StageCosts.given([0.002] * 4, [0.004] * 4, [0.002] * 4)
    for schedule in ps.CLASSIC:
        p = sim.simulate(schedule, 8, "never", costs)
        assert p.step_time == pytest.approx((8 + 4 - 1) * 0.006)
        assert p.bubble == pytest.approx(tl.theoretical_bubble(4, 8))
        p = sim.simulate(schedule, 8, "always", costs)
        assert p.step_time == pytest.approx((8 + 4 - 1) * 0.008)


def test_the_slowest_stage_sets_the_pace():
    costs = sim.StageCosts.given([0.001, 0.003])
    p = sim.simulate("fill_drain", 16, "never", costs)
    # 16 micro-batches through the slow stage (3 ms + 6 ms each) plus filling and draining through the
    # fast one: the fast stage's first forward and last backward.
    assert p.step_time == pytest.approx(16 * 0.009 + 0.001 + 0.002)
    assert p.bubble > tl.theoretical_bubble(2, 16)


def test_transfers_lengthen_the_step():
    base = sim.simulate("one_f_one_b", 4, "never", sim.StageCosts.given([0.001] * 2))
    slow = sim.simulate("one_f_one_b", 4, "never", sim.StageCosts.given([0.001] * 2, transfer=0.0005))
    assert slow.step_time > base.step_time
    assert slow.peak_in_flight == base.peak_in_flight == (2, 1)


def test_from_flops_and_scaled():
    costs = sim.StageCosts.from_flops([2e9, 1e9], flops_per_second=1e11)
    assert costs.forward == pytest.approx((0.02, 0.01))
    assert costs.backward == pytest.approx((0.04, 0.02))
    assert costs.recompute == costs.forward
    assert costs.scaled(2.0).backward == pytest.approx((0.08, 0.04))


def test_summary_is_json_ready():
    p = sim.simulate("one_f_one_b", 32, "always", sim.StageCosts.given([0.002] * 8))
    s = p.summary()
    assert s["peak_in_flight"] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert s["theoretical_bubble"] == pytest.approx(7 / 39)
    assert "events" not in s


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: sim.StageCosts((), (), ()), "at least one stage"),
        (lambda: sim.StageCosts.given([1.0, 2.0], [1.0]), "backward has 1 stages"),
        (lambda: sim.StageCosts.given([-1.0]), "forward must be >= 0"),
        (lambda: sim.StageCosts.given([float("nan")]), "forward must be >= 0"),
        (lambda: sim.StageCosts.given([1.0], transfer=-1), "transfer must be >= 0"),
        (lambda: sim.StageCosts.from_flops([1.0], 0.0), "flops_per_second must be > 0"),
        (lambda: sim.relative_error(1.0, 0.0), "measured must be > 0"),
    ],
)
def test_bad_costs_are_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_relative_error():
    assert sim.relative_error(1.1, 1.0) == pytest.approx(0.1)


def test_every_schedule_from_one_set_of_costs():
    """Equal unit costs (F 2 ms, B 4 ms = I 2 + W 2): the closed forms, interleaving's chunks included."""
    costs = sim.StageCosts.given([0.002] * 4, [0.004] * 4)
    want = {
        "fill_drain": tl.theoretical_bubble(4, 8),
        "one_f_one_b": tl.theoretical_bubble(4, 8),
        "zb_h1": 3 / 27,
    }
    for name, bubble in want.items():
        assert sim.simulate(name, 8, "never", costs).bubble == pytest.approx(bubble, abs=1e-9)
    p = sim.simulate("interleaved_1f1b", 8, "never", costs.chunked(2), virtual_stages=2)
    assert p.bubble == pytest.approx(tl.theoretical_bubble(4, 8, 2), abs=1e-9)
    assert p.summary()["virtual_stages"] == 2
    assert p.step_time < sim.simulate("one_f_one_b", 8, "never", costs).step_time
