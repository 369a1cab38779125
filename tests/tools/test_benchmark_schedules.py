"""``python -m tools.benchmark schedules``: one JSON line per schedule, measured beside its prediction."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import timeline
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
        timeline.Event(0, 1, 0, 0, schedules.FORWARD, 0),
        timeline.Event(1, 2, 1, 0, schedules.FORWARD, 1),
        timeline.Event(2, 4, 1, 0, schedules.BACKWARD, 1),
        timeline.Event(4, 6, 0, 0, schedules.BACKWARD, 0),
    ]
    # Stage 0 holds 1 from 0 to 6, stage 1 holds 10 from 1 to 4: both at once from 1 to 4.
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0]) == 11.0
    # Weight-gradient sums from the end of each stage's B: stage 1's 5 from 4, stage 0's 7 from 6,
    # when stage 0's activation (1) is released: 5 + 7.
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0], sums=[0.0, 5.0]) == 11.0
    assert schedules_benchmark._total_held_peak(evs, [1.0, 10.0], sums=[7.0, 5.0]) == 12.0


def test_split_schedules_hold_what_w_reads_between_i_and_w():
    """Stages of 4 dense layers on 512 rows of 512: from F to I the last stage keeps 5 MiB (its input
    and each layer's output), the first 4 (its input is a slice of the batch); from I to W, 2 MiB
    per layer whose weight gradient W takes (its input and the gradient of its product; the first
    layer's input is free on the first stage): as many first layers as fit in what the stage keeps,
    and under ZB-H1, whose last device holds one micro-batch from F to I beside one from I to W,
    within 1F1B's fullest device (2 x 4 MiB): 3 MiB there, one layer."""
    mib = 2**20
    assert schedules_benchmark.layer_bytes(4, 512, 512, 0) == (4 * mib, [mib, 2 * mib, 2 * mib, 2 * mib])
    assert schedules_benchmark.layer_bytes(4, 512, 512, 1) == (5 * mib, [2 * mib] * 4)
    assert schedules_benchmark.deferred_layers("one_f_one_b_split", 4, 512, 512, 8) == [2, 2]
    assert schedules_benchmark.deferred_layers("zb_h2", 4, 512, 512, 8) == [2, 2]
    assert schedules_benchmark.deferred_layers("zb_h1", 4, 512, 512, 8) == [2, 1]
    assert schedules_benchmark.deferred_layers("one_f_one_b", 4, 512, 512, 8) == [0, 0]
    # A V's four stages: the first (stage 0, on device 0) reads a slice of the batch.
    assert schedules_benchmark.deferred_layers("zbv", 4, 512, 512, 8) == [2, 2, 2, 2]
    deferred = schedules_benchmark.deferred_layers("zb_h1", 4, 512, 512, 8)
    held, after_input, sums = schedules_benchmark.stage_weights(4, 512, 512, 2, deferred)
    assert held == [4 * mib, 5 * mib] and after_input == [3 * mib, 2 * mib]
    assert sums == [schedules_benchmark.sums_bytes(4, 512)] * 2 == [4 * (512 * 512 + 512) * 4] * 2


def test_received_copies_are_held_from_their_arrival_to_their_use():
    """Between processes a stage's input is a copy on its device from the sender's forward's end plus
    the hand-off (not from its own forward's start), and the gradient for stage 0's output is held on
    device 0 from stage 1's backward's end plus the hand-off to the end of stage 0's backward."""
    evs = [
        timeline.Event(0, 1, 0, 0, schedules.FORWARD, 0),
        timeline.Event(2, 3, 1, 0, schedules.FORWARD, 1),
        timeline.Event(3, 5, 1, 0, schedules.BACKWARD, 1),
        timeline.Event(6, 8, 0, 0, schedules.BACKWARD, 0),
    ]
    changes = schedules_benchmark.received_held_changes(evs, 10.0, 0.5)
    assert changes == [[(5.5, 10.0), (8, -10.0)], [(1.5, 10.0), (2, -10.0)]]
    # Device 0: its micro-batch (1) from 0 to 8 and the gradient (10) from 5.5; device 1: the input
    # (10) from 1.5, then the micro-batch (2) from 2 to 5, which counts the input already.
    assert schedules_benchmark.process_peaks(evs, ([1.0, 2.0], [0.0, 0.0], [0.0, 0.0]), 10.0, 0.5) == [
        11.0,
        10.0,
    ]


def test_a_stage_process_holds_the_heads_difference_last():
    held, after_input, sums = schedules_benchmark.process_weights(
        ([4.0, 5.0, 5.0], [3.0, 4.0, 4.0], [7.0] * 3), 1.0
    )
    assert held == [4.0, 5.0, 6.0] and after_input == [3.0, 4.0, 4.0] and sums == [7.0] * 3


def _unit_times(args) -> dict[str, dict]:
    """Made-up times of the benchmark's unit steps: F 1 ms, F + I 2 ms, F + B 3 ms per layer."""
    units, _ = schedules_benchmark._units(args)
    seconds = {"forward": 0.001, "input": 0.002, "gradients": 0.003}
    return {
        name: {"best": seconds[u["step"]] * u["depth"], "median": seconds[u["step"]] * u["depth"]}
        for name, u in units.items()
    }


def test_figures_under_processes_take_the_largest_devices_peak():
    args = schedules_benchmark._parse(["--quick"])
    assert args.devices == "processes"
    times = {name: {"best": 0.01, "median": 0.011} for name, _ in schedules_benchmark.SCHEDULES}
    hops = schedules_benchmark.HANDOFF_HOPS
    times["handoff_moving"] = {"best": 0.002 + hops * 0.0001, "median": 1.0}
    times["handoff_staying"] = {"best": 0.002, "median": 1.0}
    times.update(_unit_times(args))
    peaks = {
        name: {
            "peak_bytes": [3000, 4000],
            "resident_bytes": [1000, 2000],
            "held_bytes": [[900, 50], [700, 80]],
        }
        for name, _ in schedules_benchmark.SCHEDULES
    }
    lines = schedules_benchmark.figures(args, {"times": times, "peaks": peaks, "chunks": [1, 2]})
    for f in lines:
        assert FIELDS <= set(f) and f["devices"] == "processes" and f["alone_speedup"] == 1.0
        assert f["peak_activation_bytes_per_device"] == [800, 65]  # each device's median step
        assert f["peak_activation_bytes"] == 800  # the largest device's
        assert f["predicted_peak_activation_bytes"] == max(f["predicted_peak_per_device_bytes"])
        assert f["transfer_s"] == pytest.approx(0.0001)


def test_figures_from_measured_costs_have_the_issue_fields():
    args = schedules_benchmark._parse(["--quick", "--devices=logical"])
    chunks = [1, 2]
    times = {name: {"best": 0.01, "median": 0.011} for name, _ in schedules_benchmark.SCHEDULES}
    times["alone"] = {"best": 0.002, "median": 0.002}
    times.update(_unit_times(args))
    peaks = {
        name: {"peak_bytes": 3000, "resident_bytes": 1000, "held_bytes": [2500, 1900, 2000]}
        for name, _ in schedules_benchmark.SCHEDULES
    }
    measured = {"times": times, "peaks": peaks, "chunks": chunks}
    lines = schedules_benchmark.figures(args, measured)
    assert [f["schedule"] for f in lines] == [name for name, _ in schedules_benchmark.SCHEDULES]
    for f in lines:
        assert FIELDS <= set(f) and f["name"] == "schedule" and f["devices"] == "logical"
        assert f["peak_activation_bytes"] == 2000  # the median step's (both devices together)
        assert f["alone_speedup"] == 3.0 and "transfer_s" not in f
        assert f["peak_activation_bytes_per_step"] == [2500, 1900, 2000]
    interleaved = next(f for f in lines if f["schedule"] == "interleaved_1f1b")
    assert interleaved["virtual_stages"] == 2
    zbv = next(f for f in lines if f["schedule"] == "zbv")
    assert zbv["virtual_stages"] == 2 and len(zbv["held_bytes_per_micro_batch"]) == 4


@pytest.mark.slow
def test_quick_run_prints_one_line_per_schedule():
    """The default, --devices=processes: a stage process per device (under --quick the client serves
    stage 0 itself), each device's peak read in its own process."""
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
        assert line["step_s"] > 0 and line["predicted_step_s"] > 0 and isinstance(line["loadavg_1m"], float)
        assert line["micro_batches"] == schedules_benchmark.QUICK_MICRO_BATCHES
        assert line["devices"] == "processes" and line["transfer_s"] >= 0
        per_device = line["peak_activation_bytes_per_device"]
        assert len(per_device) == 2 and line["peak_activation_bytes"] == max(per_device) > 0
