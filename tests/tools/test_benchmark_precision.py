"""``python -m tools.benchmark precision``: a step ratio line per model, both sides measured, at
smoke-test sizes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_prints_each_models_step_ratio():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.benchmark", "precision", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(line["name"], line["model"]) for line in lines] == [
        ("precision_step_ratio", "dense"),
        ("precision_step_ratio", "lm.synthetic.TransformerLM"),
    ]
    dense = lines[0]
    ratio = dense["step_s"]["mixed_bfloat16"] / dense["step_s"]["float32"]
    assert dense["value"] == pytest.approx(ratio, abs=0.01)
