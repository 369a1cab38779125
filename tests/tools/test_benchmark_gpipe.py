"""``python -m tools.benchmark gpipe``: JSON lines with both sides of each ratio, at smoke-test sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmarks import gpipe as gpipe_benchmark

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unknown_figure_is_a_usage_error(capsys):
    assert gpipe_benchmark.main(["gpipe", "--figures=speedup,warp"]) == 2
    assert "unknown figures ['warp']" in capsys.readouterr().err


def test_default_figures_are_what_users_compare():
    assert set(gpipe_benchmark.DEFAULT_FIGURES) == {
        "speedup", "op_parallel_control", "vs_same_cores", "remat_time", "overhead", "scaling", "memory",
        "remat_memory", "one_f_one_b_time", "simulator", "one_f_one_b_memory",
    }  # fmt: skip


def test_one_f_one_b_memory_runs_both_schedules_and_reports_their_peaks(monkeypatch, capsys):
    # In this process, the workers' answers made up: the quick run below leaves this figure out, as its
    # worker (a dense gpipe_head step under the BFC allocator, each schedule) is the schedules
    # benchmark's memory side, which test_benchmark_schedules runs.
    specs = []

    def run_once(name, spec, verbose=False):
        specs.append(spec)
        peak = {"fill_drain": 4000, "one_f_one_b": 3000}[spec["schedule"]]
        return {
            "peak_bytes": peak,
            "live_peak_bytes": peak // 2,
            "traced_peak_bytes": peak,
            "weight_bytes": 64,
        }

    monkeypatch.setattr(gpipe_benchmark.harness, "run_once", run_once)
    gpipe_benchmark._schedule_figures(gpipe_benchmark._parse(["--quick"]), ["one_f_one_b_memory"], [0, 1])
    assert [(s["schedule"], s["micro_batches"]) for s in specs] == [("fill_drain", 8), ("one_f_one_b", 8)]
    for spec in specs:
        assert spec["model"] == "gpipe_head" and spec["measure"] == "memory" and spec["remat"] == "never"
        assert spec["stages"] == spec["logical_devices"] == 2 and spec["cpus"] == [0, 1]
    # 1F1B against fill-drain, at M=8 (--quick leaves out M=16: the same code), on the same stack with
    # the loss in the last stage.
    (line,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert line["name"] == "one_f_one_b_memory" and line["micro_batches"] == 8 and line["value"] == 0.75
    assert line["one_f_one_b_peak_bytes"] == 3000 and line["fill_drain_peak_bytes"] == 4000
    assert line["live_tensor_ratio"] == 0.75 and line["weight_bytes"] == 64
    assert isinstance(line["loadavg_1m"], float)
    assert line["loss"] == "in the last stage, per micro-batch" and line["remat"] == "never"


FIGURES = "overhead,memory"


@pytest.mark.slow
def test_quick_run_prints_one_json_line_per_figure():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "gpipe", "--quick", f"--figures={FIGURES}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    names = sorted(line["name"] for line in lines)
    assert names == ["memory", "overhead", "overhead"]
    for line in lines:
        assert isinstance(line["loadavg_1m"], float)
    overheads = {line["path"]: line for line in lines if line["name"] == "overhead"}
    assert len(overheads) == 2  # against tf.recompute_grad, and against micro-batched summed gradients
    for overhead in overheads.values():
        assert overhead["gpipe_step_s"] > 0 and overhead["reference_step_s"] > 0
        assert overhead["value"] == pytest.approx(
            overhead["gpipe_step_s"] / overhead["reference_step_s"], rel=1e-3
        )
    (memory,) = [line for line in lines if line["name"] == "memory"]
    assert memory["task"] == "lm.synthetic.GPipeTransformerLM" and "TrainStep" in memory["step"]
    assert memory["pipeline_peak_bytes"] > memory["weight_bytes"] > 0
    assert memory["value"] == pytest.approx(
        memory["pipeline_peak_bytes"] / memory["plain_peak_bytes"], rel=1e-3
    )
    # In the traced step, the tensors' own peak never exceeds the allocator's (which counts whole chunks).
    for side in ("pipeline", "plain"):
        live, traced = memory[f"{side}_live_peak_bytes"], memory[f"{side}_traced_peak_bytes"]
        assert memory["weight_bytes"] < live <= traced
