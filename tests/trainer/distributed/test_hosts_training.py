"""Training across namespaced hosts (tools.local_cluster --hosts, root only): a K=2 pipeline of stage
processes and two sync replicas, each on hosts apart joined by rate-limited links, train to the
weights of one process. Both runs train the same experiment as far as the one-process reference
(built once, in this process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.cluster_runner import max_weight_diff
from tests.trainer.distributed.test_remote_stages import model_flag, reference
from tests.trainer.runner import REPO, _env
from tools import local_hosts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(local_hosts.unavailable() is not None, reason=str(local_hosts.unavailable())),
]

STEPS = 4
OVERRIDE = f"task.train.max_steps : {STEPS}; task.train.save_interval_steps : {STEPS}"
TIMEOUT = 420


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> str:
    return reference(2, STEPS, tmp_path_factory.mktemp("one_process"))


def _cluster(logdir, *flags: str) -> str:
    command = [sys.executable, "-m", "tools.local_cluster", "--link_mbit=1000", *flags, *model_flag(2)]
    command += [f"--logdir={logdir}", "--", "--params_override=" + OVERRIDE]
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_stage_processes_on_three_hosts_train_like_one_process(tmp_path, one_process):
    out = _cluster(tmp_path / "k2", "--hosts=3", "--stages=2")
    assert "3 hosts on bridge" in out and "(1000 Mbit/s each way)" in out
    assert f"[trainer:0] trainer: done at step {STEPS}" in out
    diff, count = max_weight_diff(str(tmp_path / "k2" / "train" / f"ckpt-{STEPS}"), one_process)
    assert count >= 8 and diff <= 1e-5, diff


def test_two_sync_replicas_on_two_hosts_train_like_one_process(tmp_path, one_process):
    out = _cluster(tmp_path / "sync", "--hosts=2", "--workers=2")
    assert "2 hosts on bridge" in out and "[trainer:0] trainer: 2 workers in sync" in out
    diff, count = max_weight_diff(str(tmp_path / "sync" / "train" / f"ckpt-{STEPS}"), one_process)
    assert count >= 8 and diff <= 1e-5, diff
