"""python -m tools.pipeline_sim as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from layers.parallel.pipeline import torch_format

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.pipeline_sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_prints_both_schedules_and_writes_pngs(tmp_path):
    out = _run(
        "--num_stages=8", "--num_micro_batches=32", "--forward_ms=2", "--remat=always", f"--png={tmp_path}/k8"
    )
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    names = ["fill_drain", "one_f_one_b", "one_f_one_b_split", "interleaved_1f1b", "zb_h1", "zb_h2"]
    names += ["zbv", "dualpipe_v"]
    assert [line["schedule"] for line in lines] == names
    assert lines[0]["peak_in_flight"] == [32] * 8
    assert lines[1]["peak_in_flight"] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert lines[0]["step_time_s"] == lines[1]["step_time_s"]
    for line in lines:
        assert Image.open(line["png"]).size[0] == 1200


def test_bad_costs_exit_2_with_one_line():
    out = _run("--num_stages=2", "--num_micro_batches=8", "--forward_ms=1,2,3")
    assert out.returncode == 2
    assert (
        out.stderr.strip() == "pipeline_sim: error: --forward_ms has 3 values; give one, or one per stage (2)"
    )
    out = _run("--num_stages=2", "--num_micro_batches=8", "--forward_ms=fast")
    assert out.returncode == 2
    assert "expected numbers" in out.stderr


def test_a_schedule_list_and_an_impossible_interleaving(tmp_path):
    out = _run("--num_stages=4", "--num_micro_batches=6", "--forward_ms=1", "--schedule=zb_h1,one_f_one_b")
    assert out.returncode == 0, out.stderr
    assert [json.loads(x)["schedule"] for x in out.stdout.splitlines()] == ["zb_h1", "one_f_one_b"]
    out = _run("--num_stages=4", "--num_micro_batches=6", "--forward_ms=1", "--schedule=interleaved_1f1b")
    assert out.returncode == 2
    assert "multiple of num_stages (4)" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_trace_has_every_unit_each_hand_off_and_the_held_counter(tmp_path):
    out = _run(
        "--num_stages=2",
        "--num_micro_batches=4",
        "--forward_ms=1",
        "--schedule=zb_h1",
        f"--trace={tmp_path}/t",
    )
    assert out.returncode == 0, out.stderr
    trace = json.loads(Path(json.loads(out.stdout)["trace"]).read_text())["traceEvents"]
    units = [e for e in trace if e["ph"] == "X"]
    assert len(units) == 3 * 2 * 4  # F, I and W of each micro-batch on each device
    assert {e["tid"] for e in units} == {0, 1}
    # Each micro-batch's activation forward and gradient backward between the two devices.
    assert sum(e["ph"] == "s" for e in trace) == sum(e["ph"] == "f" for e in trace) == 2 * 4
    held = [e["args"]["micro-batches held"] for e in trace if e["ph"] == "C" and e["tid"] == 0]
    assert max(held) == 2 and held[-1] == 0


def test_v_schedules_simulate_draw_trace_and_export_their_v(tmp_path):
    """zbv and dualpipe_v at K=2, M=8: each device's cost cut into the two stages of its V; a shorter
    step than ZB-H1's; the trace's rows are devices; the CSV loads back with the V placement."""
    out = _run(
        "--num_stages=2",
        "--num_micro_batches=8",
        "--forward_ms=1",
        "--schedule=zb_h1,zbv,dualpipe_v",
        f"--png={tmp_path}/v",
        f"--trace={tmp_path}/v",
        f"--csv={tmp_path}/v",
    )
    assert out.returncode == 0, out.stderr
    zb, zbv, dual = [json.loads(x) for x in out.stdout.splitlines()]
    assert zbv["step_time_s"] == pytest.approx(dual["step_time_s"]) == pytest.approx(0.0245)
    assert zb["step_time_s"] == pytest.approx(0.025)  # 49 and 50 half-forwards
    assert zbv["virtual_stages"] == 2 and zbv["peak_in_flight"] == [4, 4] and dual["peak_in_flight"] == [5, 5]
    trace = json.loads(Path(zbv["trace"]).read_text())["traceEvents"]
    last = {e["tid"] for e in trace if e["ph"] == "X" and e["name"].endswith(" s3")}
    assert last == {0}  # the last stage on device 0, beside the first
    for line in (zbv, dual):
        sched = torch_format.from_actions(torch_format.read_csv(Path(line["csv"]).read_text()))
        assert sched.placement == (0, 1, 1, 0) and sched.num_micro_batches == 8
        assert Image.open(line["png"]).size[0] == 1200


def test_a_link_adds_bytes_over_rate_to_each_hand_off():
    base = ["--num_stages=2", "--num_micro_batches=8", "--forward_ms=50", "--schedule=fill_drain"]
    fast = _run(*base)
    slow = _run(*base, "--link_mbit=100", "--bytes_per_handoff=2097152")
    assert fast.returncode == 0 and slow.returncode == 0, slow.stderr
    plain, linked = json.loads(fast.stdout), json.loads(slow.stdout)
    assert plain["step_time_s"] == 1.35 and "link_mbit" not in plain
    assert linked["link_mbit"] == 100 and linked["step_time_s"] > 2.9  # 16 hand-offs of 0.168 s, queued
    bad = _run(*base, "--bytes_per_handoff=10")
    assert (
        bad.returncode == 2 and bad.stderr == "pipeline_sim: error: --bytes_per_handoff needs --link_mbit\n"
    )
