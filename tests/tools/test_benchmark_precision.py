"""``python -m tools.benchmark precision``: every figure's line, both sides measured in the same run, at
smoke-test sizes (the values of tiny sizes say nothing)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_run_prints_every_figure_from_both_sides():
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
    by_name = {}
    for line in lines:
        by_name.setdefault(line["name"], []).append(line)
    assert list(by_name) == [
        "precision_activation_peak_ratio",
        "remote_speed_vs_local_k2",
        "remote_speedup_k2",
        "remote_client_cpu_share_k2",
        "precision_bytes_ratio",
        "precision_remote_speedup_k2",
        "precision_step_ratio",
    ]
    assert [line["model"] for line in by_name["precision_step_ratio"]] == [
        "dense",
        "lm.synthetic.TransformerLM",
    ]
    dense = by_name["precision_step_ratio"][0]
    ratio = dense["step_s"]["mixed_bfloat16"] / dense["step_s"]["float32"]
    assert dense["value"] == pytest.approx(ratio, abs=0.01)
    (peak,) = by_name["precision_activation_peak_ratio"]
    held = peak["activation_peak_bytes"]
    assert 0 < held["mixed_bfloat16"] and 0 < held["float32"]
    assert peak["value"] == pytest.approx(held["mixed_bfloat16"] / held["float32"], abs=1e-4)
    # The remote figures of both precisions, and the bytes each sent: a step's hand-offs at least
    # (M activations forward and M gradients back, float32 or bfloat16), plus gRPC's own messages.
    speedups = {line["precision"]: line for line in by_name["remote_speedup_k2"]}
    assert set(speedups) == {"float32", "mixed_bfloat16"}
    (sent,) = by_name["precision_bytes_ratio"]
    handoffs = sent["handoff_bytes_float32"]
    assert sent["bytes_per_step"]["float32"] >= handoffs
    assert handoffs / 2 <= sent["bytes_per_step"]["mixed_bfloat16"] < sent["bytes_per_step"]["float32"]
    (remote,) = by_name["precision_remote_speedup_k2"]
    assert remote["value"] == round(speedups["mixed_bfloat16"]["value"], 4)
    assert remote["float32_remote_speedup_k2"] == round(speedups["float32"]["value"], 4)
