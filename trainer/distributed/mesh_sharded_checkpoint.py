"""Checkpoints of a mesh across processes: each process writes the shards its devices hold.

A ``tf.train.Checkpoint`` of DVariables saves through DTensor (``dtensor.sharded_save``): every
device writes its own slice of each variable (one copy of each slice, from one of the devices that
hold it) with ``SaveV2``'s ``shape_and_slices``, behind barriers across the processes, and the
slices are merged into one index. No process ever holds a whole variable it does not already hold.
The files are TensorFlow's plain bundle format: a reader asking for a whole tensor gets it assembled
from its slices, so the checkpoint restores unsharded (evalers, decoders, ``tools.export``, one
process) and on any other mesh; and a DVariable restores only its own slices from any checkpoint
(DTensor's ``RestoreV2`` reads each device's slice), so resharding is a restore.

Every process must call ``save`` and ``restore_latest`` at the same steps (they are collective).
Task 0 writes through the ``CheckpointManager`` (the state file and retention); the others write
the same prefix and touch nothing else. The input iterator is not in these checkpoints (DTensor's
saver takes only DTensors): the position is a function of the step (``TrainStep.skip_to``).
"""

from __future__ import annotations

import tensorflow as tf

from params.errors import UserError
from trainer import files
from trainer.checkpointer import CHECKPOINT_NAME, Checkpointer
from trainer.placement import TrainState


class ShardedCheckpointer(Checkpointer):
    """The checkpointer of ``MeshAcrossProcesses`` (module doc)."""

    def __init__(self, train_dir: str, max_to_keep: int, state: TrainState, *, writes_state: bool) -> None:
        super().__init__(
            train_dir, max_to_keep, task=state.task, learner=state.learner, global_step=state.global_step
        )
        self._train_dir = train_dir
        self._writes_state = writes_state
        self._written: str | None = None

    @property
    def latest_path(self) -> str | None:
        return self._written or super().latest_path

    def save(self, step: int) -> str:
        if self._writes_state:
            return super().save(step)
        prefix = files.join(self._train_dir, f"{CHECKPOINT_NAME}-{step}")
        try:
            self._checkpoint.save_counter.assign_add(1)  # as the manager does on task 0
            self._written = self._checkpoint.write(prefix)
            return self._written
        except (tf.errors.OpError, OSError) as e:
            raise UserError(f"cannot save checkpoint {CHECKPOINT_NAME}-{step}: {files.reason(e)}") from None
