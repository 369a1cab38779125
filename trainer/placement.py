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

A placement is anything with the hooks of ``Placement`` below; each hook takes only what it needs
(the task's Params, a batch, the step's functions in ``StepFunctions``, the checkpointed objects in
``TrainState``), never the TrainStep itself. ``OnDevice`` is the caller's device and the defaults
that the other placements extend.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import tensorflow as tf

from params.hyperparams import Params
from tasks.learner import Learner
from trainer import signals, tracing
from trainer.checkpointer import Checkpointer
from trainer.distributed import roles, strategies

StepOutputs = tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]


@dataclasses.dataclass(frozen=True)
class StepFunctions:
    """What a placement sees of a training step (trainer/train_step.py): the functions it compiles
    into ``run(n)`` and what its start-up line reads."""

    run_steps: Callable[..., StepOutputs]  # (n, traced=False): up to n steps in one tf.while_loop
    guarded_step: Callable[[Any], StepOutputs]  # one step on a batch (None: the step's iterator's next)
    zero_outputs: dict  # zeros shaped like a step's outputs
    next_batch: Callable[[], Any]  # the next batch of the step's input iterator (as it is then)
    dataset: Callable[[], tf.data.Dataset]  # a new pipeline of the step's train input
    release_trace: Callable[[], None]  # drops the step traced at construction (run_steps' traced=True)
    step_graph: Callable[[], tf.Graph]  # one step (forward, backward, update) traced, never run
    batch_size: int


@dataclasses.dataclass(frozen=True)
class TrainState:
    """What a checkpoint of a training step holds: the input position only where the placement keeps
    it (``keeps_input_position``)."""

    task: tf.Module
    learner: Learner
    global_step: tf.Variable
    iterator: Any


class Placement(Protocol):
    """Where a training step's variables and compute live, how its steps run, what its checkpoints
    hold, and who writes the logdir."""

    name: str  # how the trainer names this process
    is_chief: bool  # writes the logdir (params.txt, summaries, progress; checkpoints unless below)
    steps_per_call: int | None  # steps per compiled call; None: timed, about a second of work
    keeps_input_position: bool  # the checkpoint holds the input iterator
    skips_input_to_step: bool  # the input position is a function of the step: skipped to on start
    saves_everywhere: bool  # every process takes part in each save (a mesh across processes)
    traces_on_batch: bool  # the step is traced on a batch (``to_device``'d), not on the iterator

    # Building the step.
    def scope(self) -> AbstractContextManager[None]:
        """Where the task, the learner and the global step are built."""

    def build_task(self, task_params: Params) -> tf.Module: ...

    def shard(self) -> tuple[int, int]:
        """(this process's input shard, shards)."""

    def global_step(self) -> tf.Variable: ...

    def build_learner(self, train_params: Params, variables: list) -> Learner:
        """The learner of ``variables`` (its slots built beside them)."""

    def startup_line(self, task: tf.Module, steps: StepFunctions) -> str | None:
        """A line the writer prints once the step is built and restored (None: nothing to say)."""

    # Inside a step.
    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        """The step's loss, gradients (of ``variables``) and metrics as the update must see them."""

    def update_if(self, finite: tf.Tensor, update: Callable[[Any], dict]) -> dict[str, tf.Tensor]:
        """The step's update when ``finite``, else nothing (zero summaries)."""

    def home_scalar(self, x: Any) -> Any:
        """A scalar of the step (a check, a metric) where the loss is."""

    def to_device(self, batch: Any) -> Any:
        """A host batch as the compiled step takes it."""

    def host(self, x: Any) -> Any:
        """A step's output as a regular host tensor."""

    # Running steps and saving them.
    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:
        """``run(n)``: up to ``n`` steps; (all finite, outputs of the last step run)."""

    def checkpointer(self, train_dir: str, max_to_keep: int, state: TrainState) -> Checkpointer: ...

    # A cluster's agreements.
    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` is set in any process that saves (a save by time)."""

    def stop_requested(self, sigterm: signals.Flag) -> bool:
        """Whether the loop stops for SIGTERM now."""

    def terminated(self, step: int, saved: str | None) -> str:
        """The one line of a run stopped by SIGTERM at ``step`` (``saved``: the chief's checkpoint)."""


def looped(steps: StepFunctions) -> Callable[[tf.Tensor], StepOutputs]:
    """The tf.function of up to ``n`` steps, looping the step traced at construction."""
    return tracing.graph_function(lambda n: steps.run_steps(n, traced=True))


class OnDevice:
    """The caller's device: one process trains and writes. A ``Placement``, and the defaults the
    other placements extend."""

    name = "this process"
    is_chief = True
    steps_per_call: int | None = None
    keeps_input_position = True
    skips_input_to_step = False
    saves_everywhere = False
    traces_on_batch = False

    # ---------------------------------------------------------------------- building the step
    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        yield

    def build_task(self, task_params: Params) -> tf.Module:
        return task_params.instantiate()

    def shard(self) -> tuple[int, int]:
        return 0, 1

    def global_step(self) -> tf.Variable:
        with tf.init_scope():
            return tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")

    def build_learner(self, train_params: Params, variables: list) -> Learner:
        return Learner(train_params, variables)

    def startup_line(self, task: tf.Module, steps: StepFunctions) -> str | None:
        del task, steps
        return None

    # -------------------------------------------------------------------------- inside a step
    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        del variables
        return loss, grads, values

    def update_if(self, finite: tf.Tensor, update: Callable[[Any], dict]) -> dict[str, tf.Tensor]:
        """``update(None)`` under one ``tf.cond`` (``update(finite)`` guards each variable's update
        instead)."""
        skipped = {name: tf.zeros([], tf.float32) for name in Learner.SUMMARY_NAMES}
        return tf.cond(finite, lambda: update(None), lambda: skipped)

    def home_scalar(self, x: Any) -> Any:
        return x

    def to_device(self, batch: Any) -> Any:
        return batch

    def host(self, x: Any) -> Any:
        return x

    # --------------------------------------------------------------------------- running steps
    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:
        compiled = looped(steps)
        return lambda n: compiled(tf.constant(n, tf.int32))

    def checkpointer(self, train_dir: str, max_to_keep: int, state: TrainState) -> Checkpointer:
        """Task, learner, global step, and the input position if kept."""
        objects = dict(task=state.task, learner=state.learner, global_step=state.global_step)
        if self.keeps_input_position:
            objects["iterator"] = state.iterator
        return Checkpointer(train_dir, max_to_keep, **objects)

    # --------------------------------------------------------------------------- the loop's end
    def any_process(self, flag: bool) -> bool:
        return flag

    def stop_requested(self, sigterm: signals.Flag) -> bool:
        return sigterm.raised

    def terminated(self, step: int, saved: str | None) -> str:
        return f"terminated by SIGTERM at step {step}; saved {saved}; run the same command to resume from it"


class Replicas(OnDevice):
    """A sync worker: a copy of the variables on each worker, gradients and metrics all-reduced
    (MultiWorkerMirroredStrategy, one replica per process); the chief writes the logdir."""

    steps_per_call = 50  # fixed, not timed: the workers' calls must run the same steps
    keeps_input_position = False  # a worker's position is a function of the step: skipped to
    skips_input_to_step = True

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

    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:
        compiled = tracing.graph_function(lambda n: self.strategy.run(steps.run_steps, args=(n,)))
        return lambda n: compiled(tf.constant(n, tf.int32))

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
