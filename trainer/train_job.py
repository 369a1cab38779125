"""The one train loop of every mode: the controller and the trainer in one process.

In TensorFlow 2 there is no shared session for a separate controller to read the trainer's variables
from, so the loop that runs the compiled steps is also the one that owns the logdir: it holds
``train/LOCK``, restores the latest checkpoint, then writes ``params.txt`` and ``model_analysis.txt``,
writes train summaries, prints progress, and saves checkpoints.

The host wakes up only at events: the next multiple of ``log_interval_steps``,
``summary_interval_steps`` or ``save_interval_steps``, ``max_steps``, or about a second of work (so
``save_interval_seconds`` is honoured); in between, the steps run inside one ``tf.function`` call.

Where the steps run is the ``placement`` (trainer/placement.py); the loop is the same for all:
progress lines, summaries, checkpoint cadence, the save on SIGTERM, the stop on NaN, max_steps.
Sync replicas: every worker runs this loop on its shard of the input, in calls of the same number of
steps (so their all-reduces pair up); only the chief writes params.txt, summaries, progress lines and
checkpoints, which then hold no iterator (a worker's input position is a function of the global
step, restored by skipping). Async: the controller runs it, and each call dispatches its steps to
the trainers (trainer/distributed/parameter_servers.py). A mesh: each call is a Python loop of compiled steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf

from params import experiment
from params.errors import UserError
from params.hyperparams import Params
from trainer import files, multi_task_jobs, progress, signals
from trainer.checkpointer import Checkpointer
from trainer.distributed import mesh_placement
from trainer.open_logdir import OpenLogdir, open_logdir
from trainer.placement import Placement
from trainer.progress import print_line
from trainer.summaries import SummaryWriter
from trainer.train_step import TrainStep

MAX_SECONDS_PER_CALL = 1.0  # wall time of one compiled call, so time-based saves are not late
MAX_STEPS_PER_CALL = 1000


class TrainLoop:
    """Controller + trainer. ``with TrainLoop(root, logdir) as loop: loop.run()``."""

    def __init__(
        self,
        root: Params,
        logdir: str | OpenLogdir,
        *,
        log: Callable[[str], None] = print_line,
        after_save: Callable[[int], None] | None = None,
        placement: Placement | None = None,
        model_task_name: str = "",
    ) -> None:
        """``logdir``: the logdir, opened by the caller (trainer/open_logdir.py; it holds the LOCK when
        this process writes), or a path this loop opens (and closes) itself. ``after_save(step)``
        runs after each checkpoint (the in-process evalers and decoders). ``placement``: where the
        step runs and whether this process writes (trainer/placement.py; None: the cluster's mesh,
        or this process's device). ``model_task_name``: train one task of a multi-task model alone
        (trainer/multi_task_jobs.py)."""
        self.root = root
        self._owns_logdir = isinstance(logdir, str)
        self._opened = open_logdir(root, logdir, trains=True, log=log) if self._owns_logdir else logdir
        self.logdir = self._opened.logdir
        self.train_dir = self._opened.train_dir
        self._log = log
        self._after_save = after_save
        self.task_params = multi_task_jobs.for_training(
            experiment.task_params_for(root, "train"), model_task_name
        )
        self.placement: Placement = placement or mesh_placement.placement_from_cluster(
            root.cluster, self.task_params
        )
        multi_task_jobs.check_placement(self.placement, self.task_params)
        self.is_chief = self.placement.is_chief
        # Who saves: the writer, or every process where a save is collective (a mesh across processes).
        self._saves = self.is_chief or self.placement.saves_everywhere
        self.train = self.task_params.train
        self._writer: SummaryWriter | None = None
        self.step_fn: TrainStep | None = None
        self.checkpointer: Checkpointer | None = None
        # Timed placements: grows to about MAX_SECONDS_PER_CALL of work once speed is known.
        self._steps_per_call = self.placement.steps_per_call or 1

    # ------------------------------------------------------------------------------------ set-up
    def __enter__(self) -> TrainLoop:
        if self._owns_logdir:
            self._opened.__enter__()
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _setup(self) -> None:
        """The same model and restore wherever the step runs; the writer records the run."""
        if self.is_chief:
            self._writer = SummaryWriter(self.train_dir)
        self.step_fn = TrainStep(self.task_params, self.root.input.train, self.placement)
        self.checkpointer = self.placement.checkpointer(
            self.train_dir, self.train.save_max_to_keep, self.step_fn.state()
        )
        restored = self.checkpointer.restore_latest()
        self.step = int(self.step_fn.global_step.numpy())
        # The input at this step's batch: where the position is a function of the step (sync, a mesh
        # across processes), or the checkpoint was saved without it (by one of those).
        position_lost = (
            restored and self.placement.keeps_input_position and not self.checkpointer.restored_input_position
        )
        if self.placement.skips_input_to_step or position_lost:
            self.step_fn.skip_to(self.step)
        if not self.is_chief:
            return
        line = self.placement.startup_line(self.step_fn.task, self.step_fn.functions)
        if line:
            self._log(line)
        for note in self.step_fn.input.notes():
            self._log(f"trainer: {note}")
        if restored:
            self._log(f"trainer: resumed from {restored} at step {self.step}")
        params_changed = self._opened.record(
            self.step, self.step_fn.task, self.step_fn.learner, keep=self.step_fn.input.files_to_keep()
        )
        if params_changed or self.step == 0:  # once per run, again if a resumed run changed them
            self._writer.text(self.step, "params", self.root.to_text())
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._owns_logdir:
            self._opened.close()

    # ------------------------------------------------------------------------------------- loop
    def _next_stop(self, step: int, until: int, per_call: int) -> int:
        stop = min(until, step + per_call)
        p = self.train
        for interval in (p.log_interval_steps, p.summary_interval_steps, p.save_interval_steps):
            if interval > 0:
                stop = min(stop, (step // interval + 1) * interval)
        return stop

    def run(self, until_step: int | None = None) -> int:
        """Trains to ``until_step`` (default: max_steps); saves at max_steps. Returns the step."""
        if self.step_fn is None or self.checkpointer is None:
            raise RuntimeError("TrainLoop.run: use the TrainLoop as a context manager")
        p = self.train
        max_steps = int(p.max_steps)
        until = max_steps if until_step is None else min(until_step, max_steps)
        with signals.deferred() as sigterm:
            return self._run(until, max_steps, sigterm)

    def _run(self, until: int, max_steps: int, sigterm: signals.Flag) -> int:
        p = self.train
        summary_rate, log_rate = _Rate(self.step), _Rate(self.step)
        last_save_time = time.perf_counter()
        while self.step < until:
            if self._stop(sigterm):
                self._terminate()
            stop = self._next_stop(self.step, until, self._steps_per_call)
            start = time.perf_counter()
            finite, outputs = self._run_chunk(stop - self.step)
            if not bool(finite.numpy()):
                self._diverged(outputs)
            steps_per_sec = (stop - self.step) / max(time.perf_counter() - start, 1e-6)
            if self.placement.steps_per_call is None:
                per_call = int(steps_per_sec * MAX_SECONDS_PER_CALL)
                self._steps_per_call = max(1, min(MAX_STEPS_PER_CALL, per_call))
            self.step = stop
            if self.is_chief:
                if self._due(p.summary_interval_steps):
                    self._write_summaries(outputs, summary_rate.mark(self.step))
                if self._due(p.log_interval_steps):
                    rate = log_rate.mark(self.step)
                    loss = float(outputs["task"]["loss"].numpy())
                    batch_size = self.step_fn.batch_size
                    self._log(progress.progress_line(self.step, max_steps, loss, rate, rate * batch_size))
            if not self._saves:
                continue
            now = time.perf_counter()
            by_time = p.save_interval_seconds > 0 and now - last_save_time >= p.save_interval_seconds
            by_time = self.placement.any_process(by_time)
            if self._due(p.save_interval_steps) or by_time or self.step == max_steps:
                paused = self.save()  # in-process evaluation does not count against training speed
                summary_rate.pause(paused)
                log_rate.pause(paused)
                last_save_time = time.perf_counter()
        if self._saves and self.step >= max_steps and self.checkpointer.latest_step != self.step:
            self.save()
        if self._stop(sigterm):
            self._terminate()
        return self.step

    def _stop(self, sigterm: signals.Flag) -> bool:
        """Whether to stop for SIGTERM now (the placement says: a cluster agrees on a step)."""
        return self.placement.stop_requested(sigterm)

    def _terminate(self) -> None:
        """SIGTERM: save at the current step (unless saved already), then stop; the LOCK is released
        on the way out. A process that does not write the logdir saves nothing."""
        if self._saves and self.checkpointer.latest_step != self.step:
            if not bool(self.step_fn.weights_finite().numpy()):
                raise signals.Terminated(f"terminated by SIGTERM at step {self.step}; not saved (NaN/Inf)")
            path = self.checkpointer.save(self.step)
            self._flush()
            self._log(f"trainer: saved {path}")
        raise signals.Terminated(self.placement.terminated(self.step, self.checkpointer.latest_path))

    def _flush(self) -> None:
        if self._writer is not None:  # None: a process that saves but does not write the logdir
            self._writer.flush()

    def _write_summaries(self, outputs: dict, steps_per_sec: float) -> None:
        values = {
            name: float(v.numpy()) for group in ("task", "learner") for name, v in outputs[group].items()
        }
        values.update(steps_per_sec=steps_per_sec, examples_per_sec=steps_per_sec * self.step_fn.batch_size)
        self._writer.scalars(self.step, values)

    def _due(self, interval: int) -> bool:
        return interval > 0 and self.step % interval == 0

    def _run_chunk(self, num_steps: int):
        try:
            return self.step_fn.run(num_steps)
        except tf.errors.OutOfRangeError:
            step = int(self.step_fn.global_step.numpy())
            raise UserError(
                f"input.train ran out of examples at step {step} before task.train.max_steps "
                f"({self.train.max_steps}); set input.train.repeat : True"
            ) from None
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as e:
            raise UserError(f"input.train: {files.reason(e)}") from None

    def _diverged(self, outputs: dict) -> None:
        step = int(self.step_fn.global_step.numpy())
        loss = float(outputs["task"]["loss"].numpy())
        kept = self.checkpointer.latest_path
        raise UserError(
            f"training diverged: the loss is {loss} at step {step}; stopped without saving "
            f"(last checkpoint: {kept or 'none'})"
        )

    def save(self) -> float:
        """Saves ``ckpt-<step>`` unless a weight is NaN/Inf, flushes summaries, runs ``after_save``.

        Returns the seconds spent in ``after_save``."""
        if not bool(self.step_fn.weights_finite().numpy()):
            raise UserError(
                f"training diverged: a weight is NaN or Inf at step {self.step}; stopped without saving "
                f"(last checkpoint: {self.checkpointer.latest_path or 'none'})"
            )
        path = self.checkpointer.save(self.step)
        self._flush()
        self._log(f"trainer: saved {path}")
        if self._after_save is None:
            return 0.0
        start = time.perf_counter()
        self._after_save(self.step)
        return time.perf_counter() - start


class _Rate:
    """Steps per second between marks, not counting declared pauses."""

    def __init__(self, step: int) -> None:
        self._step, self._time = step, time.perf_counter()

    def mark(self, step: int) -> float:
        now = time.perf_counter()
        rate = (step - self._step) / max(now - self._time, 1e-9)
        self._step, self._time = step, now
        return rate

    def pause(self, seconds: float) -> None:
        self._time += seconds


def run_trainer(
    root: Params,
    opened: OpenLogdir,
    placement: Placement | None = None,
    *,
    log: Callable[[str], None] = print_line,
    after_save: Callable[[int], None] | None = None,
    then: Callable[[], None] | None = None,
    model_task_name: str = "",
) -> int:
    """Trains in this process to ``max_steps``: the one ``TrainLoop`` over ``opened`` (the logdir the
    caller opened) with ``placement``; how every mode starts its trainer (trainer/launcher.py,
    --mode=sync|async in distributed/jobs.py, --mode=mesh in distributed/mesh_cluster.py).
    ``after_save(step)``: after each checkpoint, and also before the first step (what an interrupted
    run left unprocessed) and at the end. ``then()``: once the loop is closed, before the last line
    (a cluster's barrier). ``model_task_name``: train that task of a multi-task model alone.
    Returns the step reached."""
    with TrainLoop(
        root, opened, log=log, after_save=after_save, placement=placement, model_task_name=model_task_name
    ) as loop:
        if after_save is not None:
            after_save(loop.step)
        step = loop.run()
    if then is not None:
        then()
    if after_save is not None:
        after_save(step)
    log(f"trainer: done at step {step}; logdir {opened.logdir}")
    return step
