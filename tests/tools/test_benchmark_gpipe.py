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


@pytest.mark.slow
def test_quick_run_prints_one_json_line_per_figure():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.benchmark",
            "gpipe",
            "--quick",
            "--figures=overhead,memory,memory_loss_outside",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    by_name = {line["name"]: line for line in lines}
    assert sorted(by_name) == ["memory", "memory_loss_outside", "overhead"]
    overhead = by_name["overhead"]
    assert overhead["gpipe_step_s"] > 0 and overhead["plain_step_s"] > 0
    assert overhead["value"] == pytest.approx(overhead["gpipe_step_s"] / overhead["plain_step_s"], rel=1e-3)
    memory = by_name["memory"]
    assert memory["pipeline_peak_bytes"] > memory["weight_bytes"] > 0
    assert memory["value"] == pytest.approx(
        memory["pipeline_peak_bytes"] / memory["plain_peak_bytes"], rel=1e-3
    )
    # Remat keeps only stage inputs: even at smoke-test sizes the pipeline needs less than the plain stack.
    assert memory["value"] < 1.0
    # In the traced step, the tensors' own peak never exceeds the allocator's (which counts whole chunks).
    for figure in (memory, by_name["memory_loss_outside"]):
        for side in ("pipeline", "plain"):
            live, traced = figure[f"{side}_live_peak_bytes"], figure[f"{side}_traced_peak_bytes"]
            assert figure["weight_bytes"] < live <= traced
    # With the loss in the last stage, the full batch's output and its gradient never exist at once.
    assert memory["pipeline_live_peak_bytes"] < by_name["memory_loss_outside"]["pipeline_live_peak_bytes"]
