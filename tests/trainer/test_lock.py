"""logdir/train/LOCK: one trainer per logdir; a dead trainer's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from params.errors import UserError
from trainer.lock import TrainerLock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _write_lock(tmp_path, **owner):
    (tmp_path / "LOCK").write_text(json.dumps(owner))


def test_acquire_writes_owner_and_release_removes_it(tmp_path):
    lock = TrainerLock(str(tmp_path))
    with lock:
        owner = json.loads((tmp_path / "LOCK").read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            TrainerLock(str(tmp_path)).acquire()
    assert not (tmp_path / "LOCK").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no temporary file left either


def test_lock_of_a_live_process_is_refused(tmp_path):
    _write_lock(tmp_path, pid=os.getppid(), host=socket.gethostname(), start_time=None)
    with pytest.raises(UserError, match="another trainer"):
        TrainerLock(str(tmp_path)).acquire()
    assert (tmp_path / "LOCK").exists()


def test_lock_of_another_host_is_refused(tmp_path):
    _write_lock(tmp_path, pid=_dead_pid(), host="some-other-host", start_time=None)
    with pytest.raises(UserError, match="some-other-host"):
        TrainerLock(str(tmp_path)).acquire()


def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    dead = _dead_pid()
    _write_lock(tmp_path, pid=dead, host=socket.gethostname(), start_time="1")
    messages = []
    lock = TrainerLock(str(tmp_path), log=messages.append)
    lock.acquire()
    assert json.loads((tmp_path / "LOCK").read_text())["pid"] == os.getpid()
    assert len(messages) == 1 and f"from pid {dead}" in messages[0]
    lock.release()


def test_reused_pid_with_another_start_time_is_stale(tmp_path):
    _write_lock(tmp_path, pid=os.getppid(), host=socket.gethostname(), start_time="-1")
    lock = TrainerLock(str(tmp_path), log=lambda _: None)
    lock.acquire()
    lock.release()


def test_a_file_that_is_not_a_lock_is_left_alone(tmp_path):
    (tmp_path / "LOCK").write_text("something else")
    with pytest.raises(UserError, match="not a trainer lock"):
        TrainerLock(str(tmp_path)).acquire()
    assert (tmp_path / "LOCK").read_text() == "something else"
