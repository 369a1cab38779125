"""``open_logdir``: what every mode does with the logdir before and after it trains.

One process, ``--mode=sync``, ``--mode=async`` and a mesh all go through it, in this order:

1. the logdir guard (trainer/logdir_guard.py): the Params against params.txt, with
   ``--allow_params_change``; read-only, so a refusal leaves the logdir exactly as it was;
2. the logdir made and proved writable; ``train/LOCK`` taken; the checkpoint state checked and the
   temporary files of a killed save removed (the writer only: one process, or a cluster's chief);
3. after the trainer restored its latest checkpoint, ``record()``: params.txt (a change appended to
   params_changes.txt first) and model_analysis.txt.

A process that does not write (a sync worker other than the chief) runs step 1 only, so every
worker of a refused cluster exits with the same line.
"""

from __future__ import annotations

import os
import posixpath
import socket
from collections.abc import Callable, Sequence

import tensorflow as tf

from params.errors import UserError
from params.hyperparams import Params
from trainer import checkpointer, files, logdir_guard, model_analysis
from trainer.lock import TrainerLock
from trainer.progress import print_line


def check_writable(logdir: str) -> None:
    """Creates the logdir and proves it writable, or raises one UserError line."""
    probe = files.join(logdir, f".write_test-{socket.gethostname()}-{os.getpid()}")
    try:
        tf.io.gfile.makedirs(logdir)
        with tf.io.gfile.GFile(probe, "w") as f:
            f.write("ok")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
        raise UserError(f"--logdir={logdir} is not writable: {files.reason(e)}") from None


class OpenLogdir:
    """The logdir of one run, opened: ``with open_logdir(...) as opened: ... opened.record(...)``."""

    def __init__(
        self,
        root: Params,
        logdir: str,
        *,
        trains: bool,
        allow_params_change: bool = False,
        writes: bool = True,
        log: Callable[[str], None] = print_line,
    ) -> None:
        self.root, self.logdir, self.trains, self.writes = root, logdir, trains, writes
        self.train_dir = files.join(logdir, "train")
        self._allow = allow_params_change
        self._log = log
        self._lock = TrainerLock(self.train_dir, log=log) if trains and writes else None
        self._made: list[str] = []  # directories this run created, innermost last

    def __enter__(self) -> OpenLogdir:
        logdir_guard.check(self.root, self.logdir, trains=self.trains, allow=self._allow, log=self._log)
        if not self.writes:
            return self
        self._made = [d for d in (self.logdir, self.train_dir) if not tf.io.gfile.exists(d)]
        check_writable(self.logdir)
        if self._lock is None:
            return self
        try:
            tf.io.gfile.makedirs(self.train_dir)
        except (tf.errors.OpError, OSError) as e:
            raise UserError(f"cannot create {self.train_dir}: {files.reason(e)}") from None
        self._lock.acquire()
        try:
            checkpointer.check_state(self.train_dir)  # before anything is written
            checkpointer.remove_orphan_temps(self.train_dir, self._log)  # only with the LOCK held
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Releases the LOCK; the directories this run created and left empty (a run refused after
        it opened the logdir) are removed, so a refused start leaves nothing behind."""
        if self._lock is not None:
            self._lock.release()
        for directory in reversed(self._made):
            try:
                if tf.io.gfile.isdir(directory) and not tf.io.gfile.listdir(directory):
                    tf.io.gfile.rmtree(directory)
            except (tf.errors.OpError, OSError):
                pass  # best effort: an empty directory is harmless
        self._made = []

    def record(self, step: int, task: tf.Module, learner: tf.Module, keep: Sequence[str] = ()) -> bool:
        """The writer's files once the run is accepted and restored at ``step``: params.txt (changes
        appended to params_changes.txt), model_analysis.txt, and a copy of each file in ``keep`` (what
        the run needs besides its Params, e.g. a SentencePiece model) beside them, so the run stays
        reproducible when the original moves. Returns whether params.txt changed."""
        if not self.writes:
            return False
        changed = logdir_guard.write_params(self.logdir, self.root.to_text(), step)
        for path in keep:
            if (kept := files.join(self.logdir, posixpath.basename(path))) != path:
                tf.io.gfile.copy(path, kept, overwrite=True)
        files.write_text_atomic(
            files.join(self.logdir, "model_analysis.txt"), model_analysis.model_analysis(task, learner)
        )
        return changed


def open_logdir(
    root: Params,
    logdir: str,
    *,
    trains: bool,
    allow_params_change: bool = False,
    writes: bool = True,
    log: Callable[[str], None] = print_line,
) -> OpenLogdir:
    """The one way a mode opens its logdir (module doc); use it as a context manager."""
    return OpenLogdir(
        root, logdir, trains=trains, allow_params_change=allow_params_change, writes=writes, log=log
    )
