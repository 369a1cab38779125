"""``python -m tools.benchmark multiworker``: real trainer clusters on loopback (and two independent
trainers at once), a JSON line per run and round, and the ratios of each side's best round."""

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


@pytest.mark.slow
def test_a_round_prints_each_run_and_the_ratios():
    proc = subprocess.run(
        [
            sys.executable, "-m", "tools.benchmark", "multiworker", "--model=image.digits.ConvNet",
            "--gin_param=ConvNet.filters = 8", "--gin_param=ConvNet.warmup_steps = 5", "--steps=40",
            "--log_every=10", "--skip_lines=1", "--batch_size=64", "--no_async", "--no_sync1", "--rounds=1",
            "--timeout=240",
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
    # One trainer process per run but the pair's and the sync cluster's two (each a TensorFlow start):
    # one, independent, sync. The sync cluster of one (left out) runs the same code as the sync pair.
    assert order == [(1, w) for w in (1, 2, 2)]
    assert all(run["rate_lines"] == 3 for run in runs if run["workers"] == 1)  # 4 printed, 1 skipped
    prefixes = (("one", "1 process"), ("independent", "2 indep"), ("sync", "2 sync"))
    best = {
        key: max(run["examples_per_sec"] for run in runs if run["run"].startswith(prefix))
        for key, prefix in prefixes
    }
    for run in runs:  # both independent processes printed rates; their figure is the sum
        assert ("per_process" in run) == run["run"].startswith("2 indep")
        if "per_process" in run:
            assert len(run["per_process"]) == 2 and all(rate > 0 for rate in run["per_process"])
            assert run["examples_per_sec"] == pytest.approx(sum(run["per_process"]), abs=0.2)
    assert ratios["examples_per_sec"] == best and ratios["rounds"] == 1
    assert ratios["model"] == "image.digits.ConvNet"
    assert ratios["gin_param"] == ["ConvNet.filters = 8", "ConvNet.warmup_steps = 5"]
    assert ratios["sync_over_one"] == pytest.approx(best["sync"] / best["one"], abs=1e-3)
    assert "sync1_over_one" not in ratios and "async_over_one" not in ratios
    product = ratios["independent_over_one"] * ratios["sync_over_independent"]
    assert ratios["sync_over_one"] == pytest.approx(product, rel=1e-2)
    assert all(run["loadavg_1m"] >= 0 for run in lines)
