"""Asynchronous training (``--mode=async``): the controller coordinates, trainers compute, ps hold.

The controller (TensorFlow's chief) runs the one train loop (trainer/train_job.py) with the
``ParameterServers`` placement: the task, learner and global step are built under
``ParameterServerStrategy.scope()``, so the variables live on the ps tasks; a ``ClusterCoordinator``
schedules one step at a time on whichever trainer is free. Each step reads the variables, computes
the gradients of its own batch and applies them at once (no all-reduce, no waiting for the other
trainers): that is what asynchronous means, and why async runs are not reproducible. The loop
joins the scheduled steps at each event (log, summary, save, max_steps) and writes the logdir:
params.txt, summaries, progress lines and checkpoints (task, learner, global step; a restart resumes
from the latest). SIGTERM to the controller lets the scheduled steps finish, saves the step they
reached and stops (exit 143). Each trainer reads the train input from its own copy of the pipeline,
with its batches shuffled by a per-process random order, so trainers do not all compute on the same
batches; input positions are not checkpointed in async mode.

Trainers and ps run a ``tf.distribute.Server`` until they are stopped (tools/local_cluster stops
them when the controller is done). A trainer that dies is retried by the coordinator on the others;
a ps that dies stops the controller with one line.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from params.hyperparams import Params
from trainer import tracing
from trainer.distributed import peers, roles, strategies
from trainer.open_logdir import open_logdir
from trainer.placement import OnDevice, StepFunctions, StepOutputs
from trainer.train_job import run_trainer

BATCH_SHUFFLE_BUFFER = 16  # batches each trainer shuffles, so trainers do not run the same ones


def run(
    root: Params,
    logdir: str,
    role: roles.Role,
    log: Callable[[str], None],
    allow_params_change: bool = False,
    cluster_wait_secs: float = peers.DEFAULT_WAIT_SECS,
) -> int:
    """This process's part of an async cluster."""
    strategies.activate(role)
    if role.task_type != "chief":
        return serve(role, log)
    return control(root, logdir, role, log, allow_params_change, cluster_wait_secs)


def serve(role: roles.Role, log: Callable[[str], None]) -> int:
    """A trainer or ps: serve the controller's requests until stopped."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=role.task_type,
        task_index=role.task_index,
        protocol="grpc",
        start=True,
    )
    job = "trainer" if role.task_type == "worker" else role.task_type
    log(f"trainer: async {job}:{role.task_index} serving at {server.target}")
    while True:  # not server.join(): a Python loop lets Ctrl-C and SIGTERM end the process
        time.sleep(1.0)


class ParameterServers(OnDevice):
    """Variables on the ps tasks (``ParameterServerStrategy``); ``run(n)`` dispatches ``n`` steps
    through a ``ClusterCoordinator`` to whichever trainer is free, each on a batch of that trainer's
    own copy of the input, and joins them. The controller writes the logdir."""

    keeps_input_position = False  # each trainer shuffles its own copy of the input

    def __init__(self, role: roles.Role) -> None:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.strategy)
        self.role = role
        self.name = "async controller"

    def scope(self):
        return self.strategy.scope()

    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:

        @tf.autograph.experimental.do_not_convert  # plain tf.data code; no AutoGraph warnings
        def dataset_fn() -> tf.data.Dataset:
            # Seeded by the trainer's clock when it builds its copy: a different order per trainer
            # (op determinism forbids unseeded shuffles; async training is not reproducible anyway).
            seed = tf.cast(tf.timestamp() * 1e6, tf.int64)
            return steps.dataset().shuffle(BATCH_SHUFFLE_BUFFER, seed=seed)

        iterator = iter(self.coordinator.create_per_worker_dataset(dataset_fn))

        @tracing.graph_function
        def worker_step(iterator):
            return self.strategy.run(steps.guarded_step, args=(next(iterator),))

        def run(num_steps: int) -> StepOutputs:
            results = [self.coordinator.schedule(worker_step, args=(iterator,)) for _ in range(num_steps)]
            self.coordinator.join()
            if not results:
                return tf.constant(True), steps.zero_outputs
            fetched = [r.fetch() for r in results]
            finite = all(bool(f) for f, _ in fetched)
            return tf.constant(finite), tf.nest.map_structure(tf.constant, fetched[-1][1])

        return run

    def terminated(self, step: int, saved: str | None) -> str:
        return (
            f"async controller stopped by SIGTERM at step {step}; saved {saved}; start it again "
            "(with its trainers and ps) to resume from it"
        )


def control(
    root: Params,
    logdir: str,
    role: roles.Role,
    log: Callable[[str], None],
    allow_params_change: bool = False,
    cluster_wait_secs: float = peers.DEFAULT_WAIT_SECS,
) -> int:
    """The controller: the one train loop (trainer/train_job.py) over the ParameterServers placement,
    once every trainer and ps answers (peers.py)."""
    peers.wait_for_peers(role, cluster_wait_secs)  # in Python: says what it waits for, signals work
    placement = ParameterServers(role)
    with open_logdir(root, logdir, trains=True, allow_params_change=allow_params_change, log=log) as opened:
        log(
            f"trainer: async controller: {len(role.cluster['worker'])} trainers, {len(role.cluster['ps'])} ps"
        )
        run_trainer(root, opened, placement, log=log)
    return 0
