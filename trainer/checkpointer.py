"""Checkpoints in ``logdir/train``: ``ckpt-<step>`` files and TensorFlow's ``checkpoint`` state file.

A training checkpoint holds the task's variables, the learner's slots, the global step and the train
input iterator, so a resumed run continues exactly where the saved one stood. Writes are atomic where
it matters: TensorFlow writes the data to temporary files and renames them, and only then rewrites the
``checkpoint`` state file (itself atomically) to name the new checkpoint as the latest, so a save cut
short never becomes 'latest'. ``tf.train.CheckpointManager`` deletes all but the newest
``save_max_to_keep``.

Readers (evalers, decoders) list checkpoints from the state file and restore only the task into their
own task instance.
"""

from __future__ import annotations

import re

import tensorflow as tf

from params.errors import UserError
from trainer import files

CHECKPOINT_NAME = "ckpt"
_STEP_RE = re.compile(r"-(\d+)$")


class CheckpointGoneError(Exception):
    """The checkpoint was deleted (by retention) before it could be read."""


def step_of(path: str) -> int:
    """The step of ``.../ckpt-<step>``."""
    match = _STEP_RE.search(path)
    if not match:
        raise UserError(f"{path} is not a checkpoint named {CHECKPOINT_NAME}-<step>")
    return int(match.group(1))


def list_checkpoints(train_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint the state file lists, oldest first."""
    try:
        state = tf.train.get_checkpoint_state(train_dir)
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"cannot read {files.join(train_dir, 'checkpoint')}: {files.reason(e)}") from None
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return sorted((step_of(p), p) for p in paths if p)


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path + ".index")


def _corrupt(path: str, error: Exception) -> UserError:
    return UserError(
        f"checkpoint {path} cannot be restored ({type(error).__name__}: {files.reason(error)}); it was "
        "left in place: move it "
        "away (and fix the 'checkpoint' file next to it) to resume from an earlier one"
    )


def restore_task(task: tf.Module, path: str) -> None:
    """Restores the task's variables (only them) from a training checkpoint.

    Raises CheckpointGoneError if the checkpoint no longer exists, UserError if it is unreadable or
    does not hold every variable of the task.
    """
    if not exists(path):
        raise CheckpointGoneError(path)
    try:
        status = tf.train.Checkpoint(task=task).read(path)
        status.expect_partial().assert_existing_objects_matched()
    except (tf.errors.OpError, ValueError, AssertionError) as e:
        if not exists(path):
            raise CheckpointGoneError(path) from None
        raise _corrupt(path, e) from None


class Checkpointer:
    """Saves and restores the full training state; owned by the controller."""

    def __init__(self, train_dir: str, max_to_keep: int, **objects: tf.Module | tf.Variable) -> None:
        """``objects``: what a checkpoint holds (task, learner, global_step, iterator).
        ``max_to_keep`` <= 0 keeps every checkpoint."""
        self._checkpoint = tf.train.Checkpoint(**objects)
        self._checkpoint.save_counter  # noqa: B018 (created now, so a restore can match all of a checkpoint)
        try:
            self._manager = tf.train.CheckpointManager(
                self._checkpoint,
                train_dir,
                max_to_keep=max_to_keep if max_to_keep > 0 else None,
                checkpoint_name=CHECKPOINT_NAME,
            )
        except (tf.errors.OpError, ValueError) as e:
            raise UserError(f"cannot read the checkpoint state in {train_dir}: {files.reason(e)}") from None

    @property
    def latest_path(self) -> str | None:
        return self._manager.latest_checkpoint

    @property
    def latest_step(self) -> int | None:
        path = self.latest_path
        return step_of(path) if path else None

    def restore_latest(self) -> str | None:
        """Restores everything from the latest checkpoint; returns its path (None: nothing saved yet).

        A checkpoint that cannot be read, or that does not match the model, is a UserError; nothing
        is deleted.
        """
        path = self.latest_path
        if path is None:
            return None
        if not exists(path):
            raise UserError(
                f"the latest checkpoint {path} named by {files.join(self._manager.directory, 'checkpoint')} "
                "is missing; restore it or fix that file"
            )
        try:
            self._checkpoint.read(path).assert_consumed()
        except Exception as e:  # a damaged file raises many types; all mean unreadable
            raise _corrupt(path, e) from None
        return path

    def save(self, step: int) -> str:
        """Writes ``ckpt-<step>``, makes it the latest and applies retention."""
        try:
            return self._manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            raise UserError(f"cannot save checkpoint {CHECKPOINT_NAME}-{step}: {files.reason(e)}") from None
