"""``python -m tools.benchmark local``: JSON lines with both sides of each ratio, at smoke-test sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmarks import local as local_benchmark

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_unknown_figure_is_a_usage_error(capsys):
    assert local_benchmark.main(["local", "--figures=speed,warp"]) == 2
    assert "unknown figures ['warp']" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_speed_run_prints_both_sides_of_each_ratio():
    # The memory figure runs the same workers with the BFC allocator; the speed ones keep this short.
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "local", "--quick", "--figures=speed"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line["name"]: line for line in map(json.loads, proc.stdout.splitlines()) if "name" in line}
    assert sorted(lines) == ["overlap", "speedup_vs_backprop", "speedup_vs_gpipe"]
    speed = lines["speedup_vs_backprop"]
    assert speed["value"] == pytest.approx(speed["backprop_step_s"] / speed["local_step_s"], rel=1e-3)
    gpipe = lines["speedup_vs_gpipe"]
    assert gpipe["value"] == pytest.approx(gpipe["gpipe_step_s"] / gpipe["local_step_s"], rel=1e-3)
    overlap = lines["overlap"]
    assert overlap["value"] == pytest.approx(
        overlap["local_one_core_step_s"] / overlap["local_step_s"], rel=1e-3
    )
    assert all("loadavg_1m" in line for line in lines.values())
