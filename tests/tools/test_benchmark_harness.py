"""``tools/benchmarks/harness.py``: what the gpipe, local and mesh benchmarks share."""

import json

import pytest

from tools import benchmark
from tools.benchmarks import harness


def test_the_harness_is_not_listed_as_a_benchmark():
    names = benchmark.available()
    assert "harness" not in names and {"gpipe", "local", "mesh"} <= set(names)


def test_a_figure_is_one_json_line_with_the_load_average(capsys):
    harness.emit("ratio", 2 / 3, a_step_s=0.5)
    harness.emit("skipped", None, stages=8)
    ratio, skipped = map(json.loads, capsys.readouterr().out.splitlines())
    assert ratio["value"] == 0.6667 and ratio["a_step_s"] == 0.5 and ratio["loadavg_1m"] >= 0
    assert skipped["value"] is None and skipped["stages"] == 8 and "loadavg_1m" in skipped


def test_unknown_figures_are_one_error_line(capsys):
    assert harness.chosen_figures("x", " a, b ,", ("a", "b")) == ["a", "b"]
    assert harness.chosen_figures("x", "a,warp", ("a", "b")) is None
    assert capsys.readouterr().err.strip() == "x benchmark: error: unknown figures ['warp']; choose from a, b"


def test_a_failing_worker_is_reported_with_its_last_stderr_line():
    # A spec without the keys the local benchmark's worker needs: it exits with a KeyError.
    with pytest.raises(RuntimeError, match=r"benchmark worker failed \(1\) .*KeyError: 'width'"):
        harness.run_once("local", {"measure": "time", "warmup": 0})
