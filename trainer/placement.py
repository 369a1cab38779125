"""Placements: where a TrainStep's variables and compute live, and who writes the logdir.

What a training step computes (loss, gradients, clipping, learner update, summaries, NaN check) is
written once, in trainer/train_step.py; the one train loop is trainer/train_job.py. A placement is
the only thing that differs between modes:

    placement        variables                      steps run as                       module
    OnDevice         the caller's device (and the   a tf.while_loop of steps in one    here
                     logical devices its layers     tf.function call
                     name: GPipe stages, blocks)
    Replicas         a copy on each sync worker     the same loop in the strategy's    here
                     (MultiWorkerMirroredStrategy)  replica context; all-reduced grads
    ParameterServers the ps tasks                   steps dispatched to free trainers  distributed/
                     (ParameterServerStrategy)      by a ClusterCoordinator            parameter_servers.py
    MeshPlacement    DVariables on a DTensor mesh   a Python loop of compiled steps,   distributed/
                                                    each batch copied onto the mesh    mesh_placement.py
    StageMeshPlacement  GPipe stages on DTensor   MeshPlacement's loop; each         distributed/
                     meshes of their own (the       variable's update guarded on its   mesh_placement.py
                     layers around the pipeline on  own mesh
                     the first and last stage's)
    MeshAcrossProcesses (--mode=mesh, distributed/mesh_cluster.py): the mesh's devices in K processes
                     (multi-client DTensor); the same loop of compiled steps, a fixed number per
                     call; every process saves the slices its devices hold
    RemoteStages     GPipe stage k (local block k)  OnDevice's loop; the stages'      distributed/
                     on task k of another process   units run in their processes       remote_stages.py
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from params.hyperparams import Params
from tasks.learner import Learner
from trainer import signals, tracing
from trainer.checkpointer import Checkpointer
from trainer.distributed import roles, strategies

if TYPE_CHECKING:
    from trainer.train_step import TrainStep

StepOutputs = tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]


class OnDevice:
    """The caller's device: one process trains and writes. The base of every placement."""

    name = "this process"
    is_chief = True
    steps_per_call: int | None = None  # None: timed, about a second of work per call
    keeps_input_position = True  # the checkpoint holds the iterator
    saves_everywhere = False  # True: every process takes part in each save (a mesh across processes)

    # ---------------------------------------------------------------------- building the step
    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Where the task, the learner and the global step are built."""
        yield

    def build_task(self, task_params: Params) -> tf.Module:
        return task_params.instantiate()

    def shard(self) -> tuple[int, int]:
        """(this worker's input shard, shards)."""
        return 0, 1

    def global_step(self) -> tf.Variable:
        with tf.init_scope():
            return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    def build_learner(self, train_params: Params, variables: list) -> Learner:
        """The learner of ``variables`` (its slots built beside them)."""
        return Learner(train_params, variables)

    def update_if(self, finite: tf.Tensor, update: Callable[[Any], dict]) -> dict[str, tf.Tensor]:
        """The step's update when ``finite``, else nothing (zero summaries): ``update(None)`` under
        one ``tf.cond`` (``update(finite)`` guards each variable's update instead)."""
        skipped = {name: tf.zeros([], tf.float32) for name in Learner.SUMMARY_NAMES}
        return tf.cond(finite, lambda: update(None), lambda: skipped)

    def startup_line(self, step: TrainStep) -> str | None:
        """A line the trainer prints once the step is built (None: nothing to say)."""
        del step
        return None

    def home_scalar(self, x: Any) -> Any:
        """A scalar of the step (a check, a metric) where the loss is (on several meshes: the loss's)."""
        return x

    # -------------------------------------------------------------------------- inside a step
    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        """The step's loss, gradients (of ``variables``) and metrics as the update must see them."""
        del variables
        return loss, grads, values

    def to_device(self, batch: Any) -> Any:
        """A host batch as the compiled step takes it."""
        return batch

    def probe_args(self, step: TrainStep) -> tuple:
        """Arguments of a trace of one step that is never run (its outputs' structure): none, the
        step then reads its own iterator."""
        del step
        return ()

    def host(self, x: Any) -> Any:
        """A step's output as a regular host tensor."""
        return x

    # --------------------------------------------------------------------------- running steps
    def compile(self, step: TrainStep) -> Callable[[int], StepOutputs]:
        """``run(n)``: up to ``n`` steps; (all finite, outputs of the last step run)."""
        compiled = self.loop(step)
        return lambda n: compiled(tf.constant(n, tf.int32))

    def loop(self, step: TrainStep) -> Callable[[tf.Tensor], StepOutputs]:
        """The tf.function of up to ``n`` steps, looping the step ``step`` traced at construction."""
        return tracing.graph_function(lambda n: step.run_steps(n, traced=True))

    def checkpointer(self, train_dir: str, max_to_keep: int, step: TrainStep) -> Checkpointer:
        """What a checkpoint holds: task, learner, global step, and the input position if kept."""
        objects = dict(task=step.task, learner=step.learner, global_step=step.global_step)
        if self.keeps_input_position:
            objects["iterator"] = step.iterator
        return Checkpointer(train_dir, max_to_keep, **objects)

    def restored(self, step: TrainStep, at_step: int) -> None:
        """After the restore (or a fresh start) at ``at_step``."""

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` is set in any process that saves (a decision every such process must make
        alike: a save by time)."""
        return flag

    # --------------------------------------------------------------------------- the loop's end
    def stop_requested(self, sigterm: signals.Flag) -> bool:
        """Whether the loop stops for SIGTERM now."""
        return sigterm.raised

    def terminated(self, step: int, saved: str | None) -> str:
        """The one line of a run stopped by SIGTERM at ``step`` (``saved``: the chief's checkpoint)."""
        return f"terminated by SIGTERM at step {step}; saved {saved}; run the same command to resume from it"


class Replicas(OnDevice):
    """A sync worker: a copy of the variables on each worker, gradients and metrics all-reduced
    (MultiWorkerMirroredStrategy, one replica per process); the chief writes the logdir."""

    steps_per_call = 50  # fixed, not timed: the workers' calls must run the same steps
    keeps_input_position = False  # a worker's position is a function of the step: skipped to

    def __init__(self, strategy: tf.distribute.Strategy, role: roles.Role) -> None:
        self.strategy, self.role = strategy, role
        self.name = role.name
        self.is_chief = role.is_chief
        self._terminated_workers = strategies.terminated_workers(strategy, role.num_workers)
        self._sigterm_workers: list[int] = []

    def shard(self) -> tuple[int, int]:
        return self.role.worker_index, self.role.num_workers

    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        del variables
        replica = tf.distribute.get_replica_context()
        if replica is None or replica.num_replicas_in_sync <= 1:
            return loss, grads, values
        # Equal shards of the global batch: the mean over replicas is the global batch's value.
        grads = [None if g is None else tf.convert_to_tensor(g) for g in grads]
        present = [i for i, g in enumerate(grads) if g is not None]
        names = sorted(values)
        reduced = strategies.all_reduce_packed(
            replica, tf.distribute.ReduceOp.MEAN, [grads[i] for i in present] + [values[n] for n in names]
        )
        for i, g in zip(present, reduced):
            grads[i] = g
        values = dict(zip(names, reduced[len(present) :]))
        loss = tf.cast(values["loss"], loss.dtype)  # the same on every replica: all stop together
        return loss, grads, values

    def compile(self, step: TrainStep) -> Callable[[int], StepOutputs]:
        compiled = tracing.graph_function(lambda n: self.strategy.run(step.run_steps, args=(n,)))
        return lambda n: compiled(tf.constant(n, tf.int32))

    def restored(self, step: TrainStep, at_step: int) -> None:
        step.skip_to(at_step)

    def stop_requested(self, sigterm: signals.Flag) -> bool:
        """Whether any worker got SIGTERM: every worker asks at the same steps, so all stop at the
        same step and the chief saves it."""
        self._sigterm_workers = self._terminated_workers(self.role.worker_index, sigterm.raised)
        return bool(self._sigterm_workers)

    def terminated(self, step: int, saved: str | None) -> str:
        names = ", ".join(f"trainer {i}" for i in self._sigterm_workers)
        where = f"saved {saved}" if self.is_chief else f"the chief saves ckpt-{step}"
        return (
            f"{self.name} stopped at step {step} with the cluster: {names} got SIGTERM; {where}; "
            "start every process again to resume from it"
        )
