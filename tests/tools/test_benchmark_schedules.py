"""``python -m tools.benchmark schedules``: one JSON line per schedule, measured beside its prediction."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from layers.parallel.pipeline import schedule as schedules
from tools import benchmark
from tools.benchmarks import schedules as schedules_benchmark

REPO_ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "name",
    "schedule",
    "step_s",
    "predicted_step_s",
    "peak_activation_bytes",
    "predicted_peak_activation_bytes",
}


def test_it_is_listed_and_its_helpers_are_not():
    assert "schedules" in benchmark.available()
    assert "harness" not in benchmark.available()


def test_total_held_peak_sums_the_devices_at_one_instant():
    evs = [
        schedules.Event(0, 1, 0, 0, schedules.FORWARD, 0),
        schedules.Event(1, 2, 1, 0, schedules.FORWARD, 1),
        schedules.Event(2, 4, 1, 0, schedules.BACKWARD, 1),
        schedules.Event(4, 6, 0, 0, schedules.BACKWARD, 0),
    ]
    # Stage 0 holds 1 from 0 to 6, stage 1 holds 10 from 1 to 4: both at once from 1 to 4.
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0]) == 11.0
    # Weight-gradient sums from the end of each stage's B: stage 1's 5 from 4, stage 0's 7 from 6,
    # when stage 0's activation (1) is released: 5 + 7.
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0], sums=[0.0, 5.0]) == 11.0
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0], sums=[7.0, 5.0]) == 12.0


def test_zero_bubble_schedules_hold_what_w_reads_between_i_and_w():
    """A stage of 4 dense layers on 512 rows of 512: 5 MiB from F to I (its input and each layer's
    output); from I to W, 2 MiB per layer whose weight gradient W takes (its input and the gradient
    of its product): the first 2, as many as fit in the 5 MiB (I takes the others')."""
    mib = 2**20
    assert schedules_benchmark.held_bytes(4, 512, 512) == 5 * mib
    assert schedules_benchmark.deferred_layers(4, 512, 512) == 2
    assert schedules_benchmark.weight_held_bytes(4, 512, 512) == 4 * mib
    assert schedules_benchmark.deferred_layers(1, 512, 512) == 1
    assert schedules_benchmark.sums_bytes(4, 512) == 4 * (512 * 512 + 512) * 4


def test_figures_from_measured_costs_have_the_issue_fields():
    args = schedules_benchmark._parse(["--quick"])
    chunks = [1, 2]
    times = {name: {"best": 0.01, "median": 0.011} for name, _ in schedules_benchmark.SCHEDULES}
    times["alone"] = {"best": 0.002, "median": 0.002}
    for depth in chunks:
        for step, seconds in zip(schedules_benchmark.COST_STEPS, (0.001, 0.002, 0.003)):
            times[f"cost_{depth}_{step}"] = {"best": seconds * depth, "median": seconds * depth}
    peaks = {
        name: {"peak_bytes": 3000, "resident_bytes": 1000, "held_bytes": [2500, 1900, 2000]}
        for name, _ in schedules_benchmark.SCHEDULES
    }
    measured = {"times": times, "peaks": peaks, "chunks": chunks}
    lines = schedules_benchmark.figures(args, measured)
    assert [f["schedule"] for f in lines] == [name for name, _ in schedules_benchmark.SCHEDULES]
    for f in lines:
        assert FIELDS <= set(f) and f["name"] == "schedule"
        assert f["peak_activation_bytes"] == 2000  # the median step's
        assert f["peak_activation_bytes_per_step"] == [2500, 1900, 2000]
    interleaved = next(f for f in lines if f["schedule"] == "interleaved_1f1b")
    assert interleaved["virtual_stages"] == 2


@pytest.mark.slow
def test_quick_run_prints_one_line_per_schedule():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "schedules", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [line["schedule"] for line in lines] == [name for name, _ in schedules_benchmark.SCHEDULES]
    for line in lines:
        assert FIELDS <= set(line) and line["name"] == "schedule"
        assert line["step_s"] > 0 and line["predicted_step_s"] > 0 and line["loadavg_1m"] >= 0
        assert line["micro_batches"] == schedules_benchmark.QUICK_MICRO_BATCHES
