"""A cluster the binary refuses at start, through the real binary: a --cluster_spec port that is no
port (99999, a digit that is not ASCII) is one line and exit 2 from a trainer of any mode and from a
stage process; a trainer whose stage tasks never come gives up in one line, and SIGTERM while it
waits ends it at once; none of them writes anything (no logdir, no empty train/ folder)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.runner import REPO, _env, error_lines
from tools import local_cluster

pytestmark = pytest.mark.slow

MODEL = "--model=tests.trainer.remote_experiment.PipelinedRegression"
REMOTE = "--params_override=cluster.stage_job : 'worker'"


def _trainer(*flags: str, stdout=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", MODEL, *flags],
        cwd=REPO, env=_env(), stdout=stdout, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


@pytest.mark.parametrize(
    "mode, port",
    [
        ("--mode=sync", "99999"),
        ("--mode=mesh", "²"),
        ("--mode=stages", "99999"),
        ("--job=controller,trainer", "²"),
    ],
)  # fmt: skip
def test_a_port_that_is_no_port_is_one_line_and_nothing_written(tmp_path, mode, port):
    logdir = tmp_path / "run"
    flags = [mode, f"--logdir={logdir}", f"--cluster_spec=worker=127.0.0.1:{port}", "--cluster_wait_secs=5"]
    code, err = _finish(_trainer(*flags, REMOTE))
    assert code == 2, err[-3000:]
    (line,) = error_lines(err)
    assert f"'127.0.0.1:{port}': the port must be a number from 1 to 65535" in line, line
    assert "Traceback" not in err and not logdir.exists()


def test_a_trainer_waiting_for_its_stages_writes_nothing_when_it_gives_up_or_is_stopped(tmp_path):
    logdir = tmp_path / "run"
    spec = f"--cluster_spec=worker=127.0.0.1:{local_cluster.free_ports(1)[0]}"  # nobody serves there
    flags = [f"--logdir={logdir}", "--job=controller,trainer", spec, REMOTE]
    out = tmp_path / "stopped.out"
    with open(out, "w") as stdout:
        stopped = _trainer(*flags, stdout=stdout)
        try:
            code, err = _finish(_trainer(*flags, "--cluster_wait_secs=1"))
            assert code == 1, err[-3000:]
            (line,) = error_lines(err)
            assert "gave up after 1 s (--cluster_wait_secs) waiting for worker:0" in line, line
            assert not logdir.exists()
            deadline = time.monotonic() + 120  # until it says it waits (every 10 s), then SIGTERM
            while "waiting for worker:0" not in out.read_text() and time.monotonic() < deadline:
                assert stopped.poll() is None, stopped.communicate()[1][-3000:]
                time.sleep(0.5)
            stopped.send_signal(signal.SIGTERM)
            code, err = _finish(stopped)
        finally:
            if stopped.poll() is None:
                stopped.kill()
                stopped.communicate()
    assert code == 143, err[-3000:]
    assert "Traceback" not in err and not logdir.exists()
