"""tools.benchmark remote: a usage error is one line and exit 2; a quick speed run starts real stage
processes and prints each speed figure as one JSON line, naming its schedule and where the stages run
(the values of tiny sizes say nothing)."""

import json
import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env
from tools.benchmarks import remote


def test_unknown_figures_are_refused(capsys):
    assert remote.main(["remote", "--figures=speed,nope"]) == 2
    assert "unknown figures ['nope']" in capsys.readouterr().err


def test_an_unknown_schedule_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        remote.main(["remote", "--schedule=fill_drain,zigzag"])
    assert exit_info.value.code == 2
    assert "--schedule: unknown ['zigzag']; choose from fill_drain," in capsys.readouterr().err


@pytest.mark.slow
def test_quick_speed_run_prints_the_three_speed_figures():
    command = [sys.executable, "-m", "tools.benchmark", "remote", "--quick", "--figures=speed"]
    command += ["--schedule=zb_h1", "--stage_cpus=shared"]  # the defaults run the same code
    result = subprocess.run(
        command,
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [line["name"] for line in lines] == [
        "remote_speed_vs_local_k2",
        "remote_speedup_k2",
        "remote_client_cpu_share_k2",
    ]
    assert {(line["schedule"], line["stage_cpus"]) for line in lines} == {("zb_h1", "shared")}
    # ZB-H1's unit-time speedup at K=2, M=8: 2 x 8 x 3 units over a step of 25 (bubble F + I - W: one unit)
    assert lines[1]["theory"] == 1.92 and len(lines[1]["stage_cpu_s"]) == len(lines[1]["stage_busy"]) == 2
    first = lines[0]  # each figure is the ratio of its step seconds, printed rounded to 4 decimals
    assert _within_rounding(first["value"], first["local_step_s"], first["remote_step_s"])
    assert _within_rounding(lines[1]["value"], first["plain_step_s"], first["remote_step_s"])
    assert 0 <= lines[2]["value"] <= 1.5 and len(lines[2]["per_step"]) == 2


def _within_rounding(ratio: float, top: float, bottom: float, half: float = 0.00005) -> bool:
    """Whether ``ratio`` (itself rounded to 4 decimals) can be top / bottom before both were rounded to
    4 decimals: quick steps last milliseconds, where the rounding alone moves a ratio by percents."""
    low, high = (top - half) / (bottom + half), (top + half) / max(bottom - half, 1e-9)
    return low - half <= ratio <= high + half
