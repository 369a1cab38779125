"""Checkpoints in ``logdir/train``: ``ckpt-<step>`` files and TensorFlow's ``checkpoint`` state file.

A training checkpoint holds the task's variables, the learner's slots, the global step and the train
input iterator, so a resumed run continues exactly where the saved one stood. Writes are atomic where
it matters: TensorFlow writes the data to temporary files and renames them, and only then rewrites the
``checkpoint`` state file (itself atomically) to name the new checkpoint as the latest, so a save cut
short never becomes 'latest'. ``tf.train.CheckpointManager`` deletes all but the newest
``save_max_to_keep``.

Readers (evalers, decoders) list checkpoints from the state file and restore only the task into their
own task instance.

The state file is the one place that says which checkpoint is the latest. TensorFlow reads a missing or
damaged one as "nothing saved yet", which would restart training at step 0 and overwrite every
checkpoint; here a missing or unparsable state file next to checkpoints stops the trainer with one
line instead (``check_state``), and ``python -m tools.checkpoint_state --logdir=... --rebuild`` writes
it again from the ``ckpt-*`` files present.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from google.protobuf import text_format as proto_text

from layers import tf_compat
from params.errors import UserError
from trainer import checkpoint_names, files

CHECKPOINT_NAME = "ckpt"
STATE_FILE = "checkpoint"
_STEP_RE = re.compile(r"-(\d+)$")
_INDEX_RE = re.compile(rf"^{CHECKPOINT_NAME}-(\d+)\.index$")
_TEMP_RE = re.compile(rf"^{CHECKPOINT_NAME}-\d+_temp$")  # TensorFlow's shards of a save in progress


class CheckpointGoneError(Exception):
    """The checkpoint was deleted (by retention) before it could be read."""


def step_of(path: str) -> int:
    """The step of ``.../ckpt-<step>``."""
    match = _STEP_RE.search(path)
    if not match:
        raise UserError(f"{path} is not a checkpoint named {CHECKPOINT_NAME}-<step>")
    return int(match.group(1))


def checkpoints_on_disk(train_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every ``ckpt-<step>`` whose index file is present, oldest first, whatever the
    state file says."""
    try:
        names = tf.io.gfile.listdir(train_dir)
    except tf.errors.NotFoundError:
        return []
    except (tf.errors.OpError, OSError) as e:
        raise UserError(f"cannot list {train_dir}: {files.reason(e)}") from None
    found = []
    for name in names:
        match = _INDEX_RE.match(name)
        if match:
            found.append((int(match.group(1)), files.join(train_dir, name[: -len(".index")])))
    return sorted(found)


class DamagedStateError(UserError):
    """The state file is missing (with checkpoints present) or unparsable."""


def _recovery(train_dir: str) -> str:
    logdir = train_dir.rstrip("/").rpartition("/")[0] or "."
    return (
        f"nothing was changed; to resume from the newest checkpoint present, run: python -m "
        f"tools.checkpoint_state --logdir={logdir} --rebuild"
    )


def read_state(train_dir: str):
    """The parsed state file; None if there is none. A file that cannot be read or parsed, or that
    names no checkpoint, is a DamagedStateError (never read as 'nothing saved')."""
    path = files.join(train_dir, STATE_FILE)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        return None
    except (tf.errors.OpError, OSError) as e:
        raise DamagedStateError(f"cannot read {path}: {files.reason(e)}") from None
    state = tf_compat.checkpoint_state_class()()
    try:
        proto_text.Parse(data.decode("utf-8"), state)
    except (proto_text.ParseError, UnicodeDecodeError) as e:
        newest = checkpoints_on_disk(train_dir)
        found = f"; the newest checkpoint present is {newest[-1][1]}" if newest else ""
        reason = " ".join(str(e).split())[:120]
        raise DamagedStateError(f"{path} is damaged ({reason}){found}; {_recovery(train_dir)}") from None
    if not state.model_checkpoint_path:
        newest = checkpoints_on_disk(train_dir)
        found = f"; the newest checkpoint present is {newest[-1][1]}" if newest else ""
        raise DamagedStateError(f"{path} names no checkpoint (damaged){found}; {_recovery(train_dir)}")
    for p in [state.model_checkpoint_path, *state.all_model_checkpoint_paths]:
        if not _STEP_RE.search(p):
            raise DamagedStateError(f"{path} is damaged: {p!r} is not a {CHECKPOINT_NAME}-<step>")
    return state


def check_state(train_dir: str) -> None:
    """For the trainer, before it restores: a missing state file next to checkpoints, or a damaged
    one, is a DamagedStateError naming the newest checkpoint present and how to recover."""
    state = read_state(train_dir)
    if state is not None:
        return
    present = checkpoints_on_disk(train_dir)
    if present:
        raise DamagedStateError(
            f"{files.join(train_dir, STATE_FILE)} is missing but {len(present)} checkpoint(s) are there, "
            f"the newest {present[-1][1]}; training would restart from step 0 over them, so "
            f"{_recovery(train_dir)}"
        )


def list_checkpoints(train_dir: str) -> list[tuple[int, str]]:
    """(step, path) of every checkpoint the state file lists, oldest first."""
    state = read_state(train_dir)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    paths = [p if p.startswith("/") or "://" in p else files.join(train_dir, p) for p in paths if p]
    return sorted((step_of(p), p) for p in paths)


def rebuild_state(train_dir: str) -> list[tuple[int, str]]:
    """Writes the state file again from the checkpoints present (their index and data files), newest
    as the latest; returns them. Used by ``tools.checkpoint_state --rebuild``."""
    present = [(s, p) for s, p in checkpoints_on_disk(train_dir) if tf.io.gfile.glob(p + ".data-*")]
    if not present:
        raise UserError(f"no complete {CHECKPOINT_NAME}-<step> checkpoint in {train_dir}")
    state = tf_compat.checkpoint_state_class()(
        model_checkpoint_path=present[-1][1].rpartition("/")[2],
        all_model_checkpoint_paths=[p.rpartition("/")[2] for _, p in present],
    )
    files.write_text_atomic(files.join(train_dir, STATE_FILE), proto_text.MessageToString(state))
    return present


def remove_orphan_temps(train_dir: str, log: Callable[[str], None]) -> list[str]:
    """Deletes the ``ckpt-<step>_temp`` directories a save cut short left behind (call it holding the
    LOCK: only then is no save in progress). Touches nothing else; returns what it removed."""
    try:
        names = tf.io.gfile.listdir(train_dir)
    except tf.errors.NotFoundError:
        return []
    removed = []
    for name in sorted(names):
        name = name.rstrip("/")
        path = files.join(train_dir, name)
        if _TEMP_RE.match(name) and tf.io.gfile.isdir(path):
            try:
                tf.io.gfile.rmtree(path)
            except (tf.errors.OpError, OSError) as e:
                raise UserError(
                    f"cannot remove {path} (left by an interrupted save): {files.reason(e)}"
                ) from None
            log(f"trainer: removed {path}, left by a save that was interrupted")
            removed.append(path)
    return removed


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path + ".index")


def _corrupt(path: str, error: Exception) -> UserError:
    """A checkpoint that cannot be restored: damaged, or holding other objects than this run's."""
    if _is_mismatch(error):
        reason = " ".join(files.reason(error).split())[:300]
        return UserError(
            f"checkpoint {path} does not match this run's model or optimizer ({reason}); it was left as "
            "it is: it was written with other Params, so train on with those in the logdir's "
            "params.txt, or start this run in another logdir"
        )
    return UserError(
        f"checkpoint {path} cannot be restored ({type(error).__name__}: {files.reason(error)}); it was "
        "left in place: move it "
        "away (and fix the 'checkpoint' file next to it) to resume from an earlier one"
    )


def _is_mismatch(error: Exception) -> bool:
    """Whether ``error`` says the checkpoint was read but its objects are not this run's (objects
    unmatched on either side, or a variable of another shape) rather than that it is damaged."""
    if isinstance(error, AssertionError):
        return True
    return isinstance(error, ValueError) and "incompatible tensor with shape" in str(error)


def restore_task(task: tf.Module, path: str) -> None:
    """Restores the task's variables (only them) from a training checkpoint.

    A checkpoint of the task placed otherwise (pipelined, the task not, or the other way round: a
    GPipe level more or less in the variables' paths) restores by the variables' names
    (``checkpoint_names``: the one mapping between placements).

    Raises CheckpointGoneError if the checkpoint no longer exists, UserError if it is unreadable or
    does not hold every variable of the task.
    """
    if not exists(path):
        raise CheckpointGoneError(path)
    try:
        status = tf.train.Checkpoint(task=task).read(path)
        try:
            status.expect_partial().assert_existing_objects_matched()
        except AssertionError:  # objects the checkpoint does not have: placed otherwise, or not there
            checkpoint_names.restore_by_name(task, path)
    except Exception as e:  # noqa: BLE001 (a damaged file raises many types; all mean unreadable)
        if not exists(path):
            raise CheckpointGoneError(path) from None
        raise _corrupt(path, e) from None


def _holds_iterator(path: str) -> bool:
    try:
        return any(name.startswith("iterator/") for name, _ in tf.train.list_variables(path))
    except (tf.errors.OpError, ValueError):
        return False


class Checkpointer:
    """Saves and restores the full training state; owned by the controller."""

    def __init__(self, train_dir: str, max_to_keep: int, **objects: tf.Module | tf.Variable) -> None:
        """``objects``: what a checkpoint holds (task, learner, global_step, iterator).
        ``max_to_keep`` <= 0 keeps every checkpoint."""
        self._objects = dict(objects)
        self._checkpoint = tf.train.Checkpoint(**objects)
        # Without an iterator (data-parallel or async training position the input by the step), a
        # checkpoint written by one process, which holds its iterator too, restores all but that.
        self._without_iterator = "iterator" not in objects
        self.restored_input_position = False  # whether the last restore positioned the iterator
        self._checkpoint.save_counter  # noqa: B018 (created now, so a restore can match all of a checkpoint)
        check_state(train_dir)  # TensorFlow reads a missing or damaged state file as 'nothing saved'
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

        A checkpoint of the task placed otherwise (a GPipe level more or less in the variables'
        paths: trained plain and resumed pipelined, or the other way round) restores by the
        variables' names, the optimizer's slots by their variables' names (``_restore_by_name``).
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
            reader = tf.train.load_checkpoint(path)
            by_name = self._placed_otherwise(reader)
        except Exception:  # noqa: BLE001 (unreadable names: the restore below reports a damaged file)
            by_name = False
        if by_name:
            self._restore_by_name(path, reader)
            return path
        try:
            holds_iterator = _holds_iterator(path)
            if holds_iterator or self._without_iterator:
                status = self._checkpoint.read(path)
                if holds_iterator and self._without_iterator:
                    # The checkpoint has an input position this run does not keep (written by one
                    # process, resumed by sync replicas or a mesh across processes): the rest.
                    status.expect_partial().assert_existing_objects_matched()
                else:
                    status.assert_consumed()
            else:
                self._restore_without_iterator(path)
            self.restored_input_position = holds_iterator and not self._without_iterator
        except Exception as e:  # a damaged file raises many types; all mean unreadable
            raise _corrupt(path, e) from None
        return path

    def _restore_without_iterator(self, path: str) -> None:
        """A checkpoint without the input position (written by sync replicas or a mesh across
        processes, whose position is a function of the step) into a run that keeps one: everything
        but the iterator; the trainer then skips its input to the restored step."""
        rest = {k: v for k, v in self._objects.items() if k != "iterator"}
        checkpoint = tf.train.Checkpoint(**rest)
        checkpoint.save_counter  # noqa: B018 (created now, so the checkpoint's counter is matched)
        checkpoint.read(path).assert_consumed()
        self._checkpoint.save_counter.assign(checkpoint.save_counter)

    def _placed_otherwise(self, reader: Any) -> bool:
        """Whether the checkpoint holds this task placed otherwise (a GPipe level more or less)."""
        task = self._objects.get("task")
        if task is None or "learner" not in self._objects:
            return False
        return checkpoint_names.placed_otherwise(task, checkpoint_names.saved_variables(reader))

    def _restore_by_name(self, path: str, reader: Any) -> None:
        """The restore of a checkpoint of another placement: the task's variables and the optimizer's
        slots by the variables' names (trainer/checkpoint_names.py: all must match, or nothing is
        assigned), the rest (global step, input position, save counter) by the object graph."""
        task, learner = self._objects["task"], self._objects["learner"]
        try:
            checkpoint_names.restore_training_by_name(task, learner.optimizer, reader)
        except ValueError as e:
            raise UserError(
                f"checkpoint {path} holds this model placed otherwise (a GPipe level more or less), "
                f"but it does not restore into it by the variables' names: {e}; nothing was restored, "
                "no checkpoint touched"
            ) from None
        except Exception as e:  # a damaged file raises many types; all mean unreadable
            raise _corrupt(path, e) from None
        rest = {k: v for k, v in self._objects.items() if k not in ("task", "learner")}
        try:
            saved = {key.split("/")[0] for key in reader.get_variable_to_shape_map()}
            missing = [k for k in rest if k not in saved and k != "iterator"]
            if missing:
                raise ValueError(f"it holds no {missing[0]}")
            if "iterator" not in saved:
                rest.pop("iterator", None)  # positioned by the step (as restore_latest's other path)
            status = tf.train.Checkpoint(**rest).read(path)
            status.expect_partial().assert_existing_objects_matched()
            if "save_counter" in saved:
                counter = reader.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
                self._checkpoint.save_counter.assign(counter)
        except Exception as e:  # a damaged file raises many types; all mean unreadable
            raise _corrupt(path, e) from None
        self.restored_input_position = "iterator" in rest

    def save(self, step: int) -> str:
        """Writes ``ckpt-<step>``, makes it the latest and applies retention."""
        try:
            return self._manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            _remove_temp(self._manager.directory, step)
            raise UserError(f"cannot save checkpoint {CHECKPOINT_NAME}-{step}: {files.reason(e)}") from None


def _remove_temp(train_dir: str, step: int) -> None:
    """Deletes the shards of a save that failed (a full disk): ``ckpt-<step>_temp`` is this save's own
    (the controller holds the LOCK), and nothing names it. Best effort: the next start's
    ``remove_orphan_temps`` also removes it."""
    path = files.join(train_dir, f"{CHECKPOINT_NAME}-{step}_temp")
    try:
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
    except (tf.errors.OpError, OSError):
        pass
