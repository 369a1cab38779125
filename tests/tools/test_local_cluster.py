"""tools.local_cluster: a signal goes to every process it started, it says so once, and a process
that cannot answer the signal is killed after the grace period."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.trainer.runner import REPO, SIGNALS, signalled


@pytest.mark.parametrize("signum, code, words", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_local_cluster_forwards_a_signal_and_says_so_once(tmp_path, signum, code, words):
    """Its own stderr is one line; each process's line comes on stdout with the process's prefix."""
    command = [sys.executable, "-m", "tools.local_cluster", "--workers=2", "--model=image.digits.ConvNet"]
    result = signalled([*command, f"--logdir={tmp_path / 'run'}", "--grace_seconds=30"], signum, 3.0)
    assert result.returncode == code, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"local_cluster: {words}")


# Two tasks: trainer:0 ignores SIGTERM (as a process blocked in TensorFlow's runtime cannot answer
# it), trainer:1 stops on it. Each says "ready" once its handler is in place.
_CLUSTER = textwrap.dedent(
    """
    import signal, sys
    from tools import local_cluster
    deaf = "import signal as s, time; s.signal(s.SIGTERM, s.SIG_IGN); print('ready'); time.sleep(99)"
    plain = "import time; print('ready'); time.sleep(120)"
    tasks = [local_cluster.Task("trainer", i, [sys.executable, "-c", c]) for i, c in enumerate([deaf, plain])]
    sys.exit(local_cluster.run(tasks, grace_seconds=1.0))
    """
)


def test_a_process_that_cannot_answer_a_forwarded_signal_is_killed_after_the_grace(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLUSTER], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        ready = 0
        while ready < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            ready += line.endswith("] ready\n")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert err.splitlines() == [
        "local_cluster: terminated by SIGTERM; forwarded to every process; killed trainer:0 1 s after it"
    ]
    assert took < 30
