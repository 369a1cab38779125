"""``python -m tools.benchmark compose``: a param_bytes_ratio and a step_s line per combination."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.benchmarks import compose

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_combinations_fit_the_devices():
    combos = compose.combinations(4)
    assert (1, 1, 1) == combos[0] and (2, 2, 1) in combos and (1, 2, 2) in combos and (2, 1, 2) in combos
    assert all(k * n * r <= 4 for k, n, r in combos)
    assert (2, 2, 2) in compose.combinations(8)


@pytest.mark.slow
def test_quick_run_prints_two_lines_per_combination():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "compose", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    ratios = {
        (x["pipeline"], x["mesh"], x["replicas"]): x["value"]
        for x in lines
        if x["name"] == "param_bytes_ratio"
    }
    steps = {(x["pipeline"], x["mesh"], x["replicas"]) for x in lines if x["name"] == "step_s"}
    assert sorted(ratios) == sorted(steps) == sorted(compose.combinations(4))
    assert ratios[(1, 1, 1)] == 1.0
    assert ratios[(2, 2, 1)] <= 0.27  # each stage holds half the layers, each weight split in two
    assert ratios[(1, 2, 2)] == ratios[(1, 2, 1)]  # replicas hold copies
    assert ratios[(2, 1, 2)] == ratios[(2, 1, 1)]
