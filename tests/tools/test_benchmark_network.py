"""tools.benchmark network: bad rates are one line and exit 2; a quick run (root: namespaced hosts)
prints a network_step line per placement and rate and the crossover line (tiny sizes: the values
say nothing)."""

import json
import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env
from tools import local_hosts
from tools.benchmarks import network


def test_bad_rates_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        network.main(["network", "--rates=100,fast"])
    assert exit_info.value.code == 2
    assert "--rates='100,fast': expected Mbit/s > 0 or 'unlimited'" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_prints_each_placement_at_each_rate_and_the_crossover():
    reason = local_hosts.unavailable()
    if reason:
        pytest.skip(reason)
    command = [sys.executable, "-m", "tools.benchmark", "network", "--quick"]
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    steps = [line for line in lines if line["name"] == "network_step"]
    assert [(s["placement"], s["link_mbit"]) for s in steps] == [
        ("pipeline", 20.0), ("replicas", 20.0), ("pipeline", None), ("replicas", None)
    ]  # fmt: skip
    for s in steps:
        assert s["step_s"] > 0 and s["predicted_step_s"] > 0 and s["measured_link_mbit"] > 0, s
    # 4 micro-batches of 64 x 128 float32 each way (262 144 B), and the ring's 4 x 128 x 129 x 4 B
    # gradient each way (528 384 B): what crossed host 0's link, with TCP/IP headers and gRPC's own.
    assert 262_144 < steps[0]["bytes_per_step"] < 1.2 * 262_144
    assert 528_384 < steps[1]["bytes_per_step"] < 1.2 * 528_384
    assert 15 < steps[0]["measured_link_mbit"] <= 20
    crossover = lines[-1]
    assert crossover["name"] == "network_crossover_mbit"
    assert set(crossover) >= {
        "predicted",
        "measured",
        "predicted_faster_everywhere",
        "measured_faster_everywhere",
    }
    # where a side has no crossover it names the placement faster at every rate, and only then
    for side in ("predicted", "measured"):
        faster = crossover[f"{side}_faster_everywhere"]
        assert (faster in ("pipeline", "replicas")) if crossover[side] is None else faster is None, crossover
