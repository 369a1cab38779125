"""``tools/benchmarks/harness.py``: what the gpipe, local and mesh benchmarks share; and
``tools.benchmark --help``."""

import json
import os
import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env
from tools import benchmark
from tools.benchmarks import harness


def test_the_harness_is_not_listed_as_a_benchmark():
    names = benchmark.available()
    assert "harness" not in names and {"gpipe", "local", "mesh"} <= set(names)


def test_a_figure_is_one_json_line_with_the_load_average(capsys):
    harness.emit("ratio", 2 / 3, a_step_s=0.5)
    harness.emit("skipped", None, stages=8)
    ratio, skipped = map(json.loads, capsys.readouterr().out.splitlines())
    assert ratio["value"] == 0.6667 and ratio["a_step_s"] == 0.5
    assert abs(ratio["loadavg_1m"] - os.getloadavg()[0]) < 0.5  # this machine's, read as it printed
    assert skipped["value"] is None and skipped["stages"] == 8 and "loadavg_1m" in skipped


def test_unknown_figures_are_one_error_line(capsys):
    assert harness.chosen_figures("x", " a, b ,", ("a", "b")) == ["a", "b"]
    assert harness.chosen_figures("x", "a,warp", ("a", "b")) is None
    assert capsys.readouterr().err.strip() == "x benchmark: error: unknown figures ['warp']; choose from a, b"


def test_a_failing_worker_is_reported_with_its_last_stderr_line():
    # A spec without the keys the local benchmark's worker needs: it exits with a KeyError.
    with pytest.raises(RuntimeError, match=r"benchmark worker failed \(1\) .*KeyError: 'width'"):
        harness.run_once("local", {"measure": "time", "warmup": 0})


def test_quick_sides_share_a_worker_only_where_their_process_settings_fit(monkeypatch):
    started, asked = [], []

    class FakeWorker:  # in this process: what interleaved starts and asks, not a real worker
        def __init__(self, name, spec):
            started.append(spec)

        def read(self):
            return {"ready": True}

        def step(self):
            return 1.0

        def ask(self, line):
            asked.append(line)
            return {"step_s": 2.0}

        def close(self):
            pass

    monkeypatch.setattr(harness, "Worker", FakeWorker)
    base = {"measure": "time", "warmup": 0, "intra_op_threads": 1}
    two = {**base, "cpus": [0, 1], "inter_op_threads": 2, "logical_devices": 2}
    one = {**base, "cpus": [0], "inter_op_threads": 1}
    specs = {
        "pipeline": {**two, "model": "gpipe"},
        "plain": {**one, "model": "plain"},
        "control": {**two, "logical_devices": None, "model": "plain"},  # runs on the first device
        "plain_devices": {**one, "logical_devices": 2, "model": "local"},
        "four": {**two, "logical_devices": 4, "model": "gpipe"},  # other devices: its own process
        "warm": {**one, "warmup": 1, "model": "plain"},
    }
    times = harness.interleaved("x", specs, 2, shared=True)
    assert [sorted(s["sides"]) if "sides" in s else [s["model"]] for s in started] == [
        ["control", "pipeline"], ["plain", "plain_devices"], ["gpipe"], ["plain"]
    ]  # fmt: skip
    assert started[1]["logical_devices"] == 2 and started[1]["cpus"] == [0]
    assert asked == 2 * ["step pipeline", "step control", "step plain", "step plain_devices"]
    assert times["pipeline"]["best"] == 2.0 and times["four"]["best"] == times["warm"]["best"] == 1.0
    started.clear()
    harness.interleaved("x", specs, 1)  # the default: a worker per side
    assert [s["model"] for s in started] == [s["model"] for s in specs.values()]


def test_benchmark_help_lists_every_benchmarks_flags():
    result = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "--help"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    for name, flag in (("decode", "--length"), ("gpipe", "--figures"), ("train_overhead", "--steps")):
        assert f"== {name} ==" in result.stdout and flag in result.stdout, result.stdout
