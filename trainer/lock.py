"""``logdir/train/LOCK``: one trainer per logdir.

The lock file holds the owner's pid, host and process start time. A second trainer refuses to start
while the owner lives; a lock left by a dead process on the same host (a killed run) is taken over with
a message. On a local disk the file is hard-linked into place (atomic), so two trainers starting at
once cannot both win; on other file systems (gs://, ...) creation is check-then-write: best effort.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable

import tensorflow as tf

from params.errors import UserError
from trainer import files


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None


def _process_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _is_alive(pid: int, start_time: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if _process_state(pid) == "Z":  # killed, not yet reaped by its parent
        return False
    live_start = _start_time(pid)
    return start_time is None or live_start is None or live_start == start_time


class TrainerLock:
    """Acquire with ``acquire()`` (or ``with TrainerLock(dir):``); ``release()`` removes it if ours."""

    def __init__(self, train_dir: str, log: Callable[[str], None] = print) -> None:
        self.path = files.join(train_dir, "LOCK")
        self._log = log
        pid = os.getpid()
        self._owner = {"pid": pid, "host": socket.gethostname(), "start_time": _start_time(pid)}
        self._held = False

    def acquire(self) -> None:
        for _ in range(3):
            if self._create():
                self._held = True
                return
            holder = self._read_holder()
            if holder is None:
                continue  # removed between our attempt and the read: try again
            pid, host = holder.get("pid"), holder.get("host")
            elsewhere = host != self._owner["host"] or not isinstance(pid, int)
            if elsewhere or _is_alive(pid, holder.get("start_time")):
                raise UserError(
                    f"another trainer (pid {pid} on {host}) holds {self.path}; two trainers cannot "
                    "share a logdir (delete the file only if that trainer is gone)"
                )
            self._log(f"trainer: taking over {self.path} from pid {pid}, which is no longer running")
            try:
                tf.io.gfile.remove(self.path)
            except tf.errors.NotFoundError:
                pass
        raise UserError(f"cannot acquire {self.path}: other processes keep taking it")

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        if self._read_holder() == self._owner:
            try:
                tf.io.gfile.remove(self.path)
            except tf.errors.NotFoundError:
                pass

    def __enter__(self) -> TrainerLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _create(self) -> bool:
        text = json.dumps(self._owner) + "\n"
        if "://" not in self.path:
            # Written aside, then hard-linked into place: link() fails if LOCK exists, and a reader
            # never sees an empty lock.
            tmp = f"{self.path}.{self._owner['host']}-{self._owner['pid']}"
            try:
                with open(tmp, "w") as f:
                    f.write(text)
                os.link(tmp, self.path)
            except FileExistsError:
                return False
            except OSError as e:
                raise UserError(f"cannot create {self.path}: {e.strerror}") from None
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            return True
        if tf.io.gfile.exists(self.path):
            return False
        files.write_text_atomic(self.path, text)
        return True

    def _read_holder(self) -> dict | None:
        text = files.read_text(self.path)
        if text is None:
            return None
        try:
            holder = json.loads(text)
        except json.JSONDecodeError:
            holder = None
        if not isinstance(holder, dict):
            # A torn write by a trainer starting right now, or a foreign file: not ours to delete.
            raise UserError(f"{self.path} exists but is not a trainer lock; delete it if no trainer runs")
        return holder
