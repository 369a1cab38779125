"""``python -m tools.benchmark multiworker``: real trainer clusters on loopback, a JSON line per run and
round, and the ratios of each side's best round (the independent pair's figure: from made-up rates)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmarks import multiworker

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "flag, message",
    [("--rounds=0", "--rounds must be >= 1"), ("--batch_size=63", "--batch_size must be even")],
)
def test_bad_flags_are_a_usage_error(flag, message, capsys):
    # In this process: each check returns before any trainer starts.
    assert multiworker.main(["multiworker", flag]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_knob_stops_the_benchmark_with_the_trainers_message():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "multiworker", "--gin_param=ConvNet.no_such_knob = 1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1
    assert "multiworker: 1 process, 1 core: trainer:0 failed" in proc.stderr
    assert "no_such_knob" in proc.stderr and "Traceback" not in proc.stderr
    assert not proc.stdout  # no figure from a run that did not train


def test_each_side_counts_its_best_round():
    def figure(rate):
        return {"examples_per_sec": rate}

    runs = [("one", figure(90.0)), ("sync", figure(150.0)), ("one", figure(100.0)), ("sync", figure(None))]
    assert multiworker.best_rates(runs) == {"one": 100.0, "sync": 150.0}
    ratios = multiworker.ratios_of({"one": 100.0, "sync": 150.0, "independent": 180.0})
    assert ratios["sync_over_one"] == 1.5 and ratios["independent_over_one"] == 1.8
    assert ratios["sync_over_independent"] == pytest.approx(150 / 180, abs=1e-3)
    assert "sync1_over_one" not in ratios and "async_over_one" not in ratios


def test_the_independent_pairs_figure_sums_both_processes_rates():
    # Both processes of the pair print rates (in a cluster only the chief does): the figure is the sum
    # of their medians, each process's median in per_process. The quick round below leaves the pair
    # out: its processes run the one-process side's trainer, twice at once.
    rates = [[50.0, 10.0, 12.0, 14.0], [70.0, 20.0, 22.0, 21.0]]
    figure = multiworker._figure("2 independent processes", rates, 1, 2)
    assert figure["per_process"] == [12.0, 21.0] and figure["examples_per_sec"] == 33.0
    assert figure["rate_lines"] == 6 and figure["workers"] == 2 and isinstance(figure["loadavg_1m"], float)
    chief_only = multiworker._figure("2 sync workers", [[50.0, 30.0, 32.0], []], 1, 2)
    assert "per_process" not in chief_only and chief_only["examples_per_sec"] == 31.0


@pytest.mark.slow
def test_a_round_prints_each_run_and_the_ratios():
    proc = subprocess.run(
        [
            sys.executable, "-m", "tools.benchmark", "multiworker", "--model=image.digits.ConvNet",
            "--gin_param=ConvNet.filters = 8", "--gin_param=ConvNet.warmup_steps = 5", "--steps=40",
            "--log_every=10", "--skip_lines=1", "--batch_size=64", "--no_async", "--no_sync1",
            "--no_independent", "--rounds=1", "--timeout=240",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    runs, (ratios,) = lines[:-1], lines[-1:]
    order = [(run["round"], run["workers"]) for run in runs]
    # One trainer process, then the sync cluster's two (each a TensorFlow start). The sync cluster of
    # one and the independent pair (left out) run the same code as the sync pair and the one process.
    assert order == [(1, 1), (1, 2)]
    assert runs[0]["rate_lines"] == 3  # 4 printed, 1 skipped
    assert all("per_process" not in run for run in runs)
    best = {key: run["examples_per_sec"] for key, run in zip(("one", "sync"), runs)}
    assert runs[0]["run"].startswith("1 process") and runs[1]["run"].startswith("2 sync")
    assert ratios["examples_per_sec"] == best and ratios["rounds"] == 1
    assert ratios["model"] == "image.digits.ConvNet"
    assert ratios["gin_param"] == ["ConvNet.filters = 8", "ConvNet.warmup_steps = 5"]
    assert ratios["sync_over_one"] == pytest.approx(best["sync"] / best["one"], abs=1e-3)
    for left_out in ("sync1_over_one", "async_over_one", "independent_over_one", "sync_over_independent"):
        assert left_out not in ratios
    assert all(isinstance(run["loadavg_1m"], float) for run in lines)
