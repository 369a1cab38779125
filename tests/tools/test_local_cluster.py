"""tools.local_cluster: a signal goes to every process it started, and it says so once."""

from __future__ import annotations

import sys

import pytest

from tests.trainer.runner import SIGNALS, signalled


@pytest.mark.parametrize("signum, code, words", SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_local_cluster_forwards_a_signal_and_says_so_once(tmp_path, signum, code, words):
    """Its own stderr is one line; each process's line comes on stdout with the process's prefix."""
    command = [sys.executable, "-m", "tools.local_cluster", "--workers=2", "--model=image.digits.ConvNet"]
    result = signalled([*command, f"--logdir={tmp_path / 'run'}"], signum, 3.0)
    assert result.returncode == code, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"local_cluster: {words}")
