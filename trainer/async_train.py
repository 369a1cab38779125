"""Asynchronous training (``--mode=async``): the controller coordinates, trainers compute, ps hold.

The controller (TensorFlow's chief) builds the task, learner and global step under
``ParameterServerStrategy.scope()``, so the variables live on the ps tasks; a ``ClusterCoordinator``
schedules one step at a time on whichever trainer is free. Each step reads the variables, computes
the gradients of its own batch and applies them at once (no all-reduce, no waiting for the other
trainers): that is what asynchronous means, and why async runs are not reproducible. The controller
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

from params import experiment
from params.errors import UserError
from params.hyperparams import Params
from trainer import distributed, files, progress, signals
from trainer.checkpointer import Checkpointer
from trainer.open_logdir import open_logdir
from trainer.summaries import SummaryWriter
from trainer.train_step import TrainStep

BATCH_SHUFFLE_BUFFER = 16  # batches each trainer shuffles, so trainers do not run the same ones


def run(
    root: Params,
    logdir: str,
    role: distributed.Role,
    log: Callable[[str], None],
    allow_params_change: bool = False,
) -> int:
    """This process's part of an async cluster."""
    distributed.activate(role)
    if role.task_type != "chief":
        return serve(role, log)
    return AsyncController(root, logdir, role, log, allow_params_change).run()


def serve(role: distributed.Role, log: Callable[[str], None]) -> int:
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


class AsyncController:
    """The controller of an async cluster: schedules steps on trainers and writes the logdir."""

    def __init__(
        self,
        root: Params,
        logdir: str,
        role: distributed.Role,
        log: Callable[[str], None],
        allow_params_change: bool = False,
    ) -> None:
        self.root, self.logdir, self.role, self._log = root, logdir, role, log
        self._allow_params_change = allow_params_change
        self.train_dir = files.join(logdir, "train")
        self.task_params = experiment.task_params_for(root, "train")
        self.train = self.task_params.train

    def run(self) -> int:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        allow = self._allow_params_change
        with open_logdir(
            self.root, self.logdir, trains=True, allow_params_change=allow, log=self._log
        ) as opened:
            coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
            with strategy.scope():
                step_fn = TrainStep(self.task_params, self.root.input.train)
            checkpointer = Checkpointer(
                self.train_dir,
                self.train.save_max_to_keep,
                task=step_fn.task,
                learner=step_fn.learner,
                global_step=step_fn.global_step,
            )
            path = checkpointer.restore_latest()
            step = int(step_fn.global_step.numpy())
            if path:
                self._log(f"trainer: resumed from {path} at step {step}")
            params_changed = opened.record(step, step_fn.task, step_fn.learner)
            writer = SummaryWriter(self.train_dir)
            try:
                if params_changed or step == 0:
                    writer.text(step, "params", self.root.to_text())
                self._loop(strategy, coordinator, step_fn, checkpointer, writer, step)
            finally:
                writer.close()
        return 0

    def _loop(self, strategy, coordinator, step_fn: TrainStep, checkpointer, writer, step: int) -> None:
        input_ = step_fn.input

        @tf.autograph.experimental.do_not_convert  # plain tf.data code; no AutoGraph warnings
        def dataset_fn() -> tf.data.Dataset:
            # Seeded by the trainer's clock when it builds its copy: a different order per trainer
            # (op determinism forbids unseeded shuffles; async training is not reproducible anyway).
            seed = tf.cast(tf.timestamp() * 1e6, tf.int64)
            return input_.dataset().shuffle(BATCH_SHUFFLE_BUFFER, seed=seed)

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def worker_step(iterator):
            return strategy.run(step_fn.guarded_step, args=(next(iterator),))

        p = self.train
        max_steps = int(p.max_steps)
        intervals = [
            i for i in (p.log_interval_steps, p.summary_interval_steps, p.save_interval_steps) if i > 0
        ]
        workers = len(self.role.cluster["worker"])
        self._log(f"trainer: async controller: {workers} trainers, {len(self.role.cluster['ps'])} ps")
        with signals.deferred() as sigterm:
            while step < max_steps and not sigterm.raised:
                stop = min([max_steps] + [(step // i + 1) * i for i in intervals])
                start = time.perf_counter()
                results = [coordinator.schedule(worker_step, args=(iterator,)) for _ in range(stop - step)]
                coordinator.join()
                finite, outputs = results[-1].fetch()
                if not bool(finite):
                    raise UserError(
                        f"training diverged: the loss is {outputs['task']['loss']} near step {stop}; stopped "
                        f"without saving (last checkpoint: {checkpointer.latest_path or 'none'})"
                    )
                rate = (stop - step) / max(time.perf_counter() - start, 1e-9)
                step = stop
                if p.summary_interval_steps > 0 and step % p.summary_interval_steps == 0:
                    values = {n: float(v) for group in ("task", "learner") for n, v in outputs[group].items()}
                    values.update(steps_per_sec=rate, examples_per_sec=rate * step_fn.batch_size)
                    writer.scalars(step, values)
                if p.log_interval_steps > 0 and step % p.log_interval_steps == 0:
                    loss = float(outputs["task"]["loss"])
                    self._log(progress.progress_line(step, max_steps, loss, rate, rate * step_fn.batch_size))
                if (p.save_interval_steps > 0 and step % p.save_interval_steps == 0) or step == max_steps:
                    self._save(step, checkpointer, writer)
            if sigterm.raised:
                self._terminate(step, checkpointer, writer)
        self._log(f"trainer: done at step {step}; logdir {self.logdir}")

    def _terminate(self, step: int, checkpointer: Checkpointer, writer: SummaryWriter) -> None:
        """SIGTERM: save the step the scheduled steps reached (unless saved already), then stop."""
        if checkpointer.latest_step != step:
            self._save(step, checkpointer, writer)
        raise signals.Terminated(
            f"async controller stopped by SIGTERM at step {step}; saved {checkpointer.latest_path}; start "
            "it again (with its trainers and ps) to resume from it"
        )

    def _save(self, step: int, checkpointer: Checkpointer, writer: SummaryWriter) -> None:
        saved = checkpointer.save(step)
        writer.flush()
        self._log(f"trainer: saved {saved}")
