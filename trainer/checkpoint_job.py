"""Jobs that process each new checkpoint once: the base of evalers and decoders.

A job on data set ``<ds>`` keeps its output in ``logdir/<kind>_<ds>/``: TensorBoard events and
``scores.jsonl``, one line ``{"step": s, "metrics": {...}}`` per checkpoint processed. That file is
also the job's record of what is done (rewritten atomically after the summaries are flushed), so a
restarted job neither repeats nor skips a checkpoint. ``task.eval.checkpoints`` picks which ones: 'all'
(every listed checkpoint not yet done, oldest first) or 'latest' (only the newest, if newer than any
done). A checkpoint deleted by retention before the job reached it is skipped with a message.

The job restores the task's variables into its own task instance (built with the data set's
task_overrides), so it runs the same way inside the trainer's process or in a process of its own.
Jobs of one process may share a ``SharedTasks``: then jobs whose task Params are equal (an evaler and
a decoder of one data set, or dev and test without task_overrides) use one task instance and one
compiled function per kind, so the model is built and traced once, not once per job; each job still
restores the checkpoint it processes (a restore the shared task already holds is skipped).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from params import experiment
from params.errors import ConfigError
from params.hyperparams import Params
from trainer import checkpointer, files
from trainer.distributed.mesh_placement import without_stage_meshes
from trainer.progress import print_line
from trainer.summaries import SummaryWriter

CHECKPOINT_CHOICES = ("all", "latest")


class SharedTasks:
    """Task instances and compiled functions shared by the checkpoint jobs of one process, keyed by
    the task Params' text: jobs with equal task Params get the same instance and functions."""

    def __init__(self) -> None:
        self._tasks: dict[str, Any] = {}
        self._functions: dict[tuple[int, str], Callable] = {}
        self._restored: dict[int, str] = {}  # id(task) -> the checkpoint path it holds

    def task(self, task_params: Params) -> Any:
        key = task_params.to_text()
        if key not in self._tasks:
            self._tasks[key] = task_params.instantiate()
        return self._tasks[key]

    def function(self, task: Any, kind: str, make: Callable[[Any], Callable]) -> Callable:
        """``make(task)``, once per task and kind (eval, decode)."""
        key = (id(task), kind)
        if key not in self._functions:
            self._functions[key] = make(task)
        return self._functions[key]

    def restore(self, task: Any, path: str) -> None:
        """``checkpointer.restore_task``, skipped when ``task`` already holds ``path``."""
        if self._restored.get(id(task)) == path:
            return
        self._restored.pop(id(task), None)
        checkpointer.restore_task(task, path)
        self._restored[id(task)] = path


class CheckpointJob:
    """Base class: finds checkpoints to process, records them as done. Subclasses define ``kind``
    and ``process(step) -> metrics``."""

    kind = ""  # directory and job-name prefix: eval, decoder
    settings = ""  # the task's settings group with samples_per_summary: eval, decode

    def __init__(
        self,
        root: Params,
        logdir: str,
        dataset: str,
        log: Callable[[str], None] = print_line,
        shared: SharedTasks | None = None,
        model_task: str = "",
    ) -> None:
        """``model_task``: one task of a multi-task model (tasks/multi_task.py): the job runs that task
        on its input of ``dataset``, in ``<kind>_<dataset>_<task>/`` (Lingvo's directory names)."""
        if dataset not in root.input.names() or dataset == "train":
            others = [n for n in root.input.names() if n != "train"]
            raise ConfigError(
                f"job {self.kind}_{dataset}: no data set {dataset!r} to evaluate; the experiment has "
                f"{', '.join(others) or 'none besides train'}"
            )
        self.name = f"{self.kind}_{dataset}" + (f"_{model_task}" if model_task else "")
        self.dataset = dataset
        self.train_dir = files.join(logdir, "train")
        self.directory = files.join(logdir, self.name)
        self._log = log
        # A stage-mesh model is evaluated with its stages on plain devices (its host mirror, the
        # variables its checkpoints hold): DTensor refuses a restore across its stages' meshes.
        self.task_params = without_stage_meshes(experiment.task_params_for(root, dataset))
        self.max_steps = int(self.task_params.train.max_steps)
        self.mode = self.task_params.eval.checkpoints
        if self.mode not in CHECKPOINT_CHOICES:
            raise ConfigError(f"task.eval.checkpoints: expected all or latest, got {self.mode!r}")
        self.poll_interval_seconds = float(self.task_params.eval.poll_interval_seconds)
        self.shared = shared or SharedTasks()
        self.task = self.model = self.shared.task(self.task_params)  # the model: what a checkpoint restores
        self.input = root.input.get(dataset).instantiate()
        if model_task:  # the task's own layers (shared ones included), settings and input
            self.task, self.input = self.model.get_task(model_task), self.input.task_input(model_task)
        self.samples_per_summary = int(self.task.params.get(f"{self.settings}.samples_per_summary"))
        self._scores_path = files.join(self.directory, "scores.jsonl")
        self._records = files.read_jsonl(self._scores_path)
        self._skipped: set[int] = set()
        self._seen: set[int] = set()  # steps once listed in the state file
        self.writer = SummaryWriter(self.directory)

    # ------------------------------------------------------------------------------ bookkeeping
    @property
    def done_steps(self) -> list[int]:
        return sorted(int(r["step"]) for r in self._records)

    @property
    def finished(self) -> bool:
        """True once the trainer's final checkpoint (step >= max_steps) is done."""
        return any(s >= self.max_steps for s in self.done_steps)

    def pending(self) -> list[tuple[int, str]]:
        """Checkpoints to process now, oldest first."""
        done = set(self.done_steps)
        listed = [(s, p) for s, p in checkpointer.list_checkpoints(self.train_dir) if s not in self._skipped]
        if self.mode == "all":
            self._report_retention_gaps(done, [s for s, _ in listed])
        if self.mode == "latest":
            newest = [c for c in listed[-1:] if c[0] > max(done, default=-1)]
            return newest
        return [(s, p) for s, p in listed if s not in done]

    def _report_retention_gaps(self, done: set[int], listed: list[int]) -> None:
        """Says which checkpoints retention deleted before this job scored them: ones it saw listed
        that are gone, and (with task.train.save_interval_steps) the saves missing between the last
        step it handled and the oldest listed."""
        keep = self.task_params.train.save_max_to_keep
        gone = sorted(self._seen - set(listed) - done - self._skipped)
        interval = int(self.task_params.train.save_interval_steps)
        handled = done | self._skipped | self._seen
        oldest = min((s for s in listed if s not in done), default=None)
        if interval > 0 and oldest is not None:
            last = max((s for s in handled if s < oldest), default=0)
            gone += [
                s for s in range((last // interval + 1) * interval, oldest, interval) if s not in handled
            ]
        self._seen.update(listed)
        if gone:
            self._skipped.update(gone)
            steps = ", ".join(str(s) for s in sorted(gone)[:10]) + (" ..." if len(gone) > 10 else "")
            self._log(
                f"{self.name}: skipped {len(gone)} checkpoint(s) (steps {steps}): deleted by retention "
                f"(task.train.save_max_to_keep : {keep}) before this job scored them"
            )

    def run_pending(self) -> int:
        """Processes every pending checkpoint; returns how many were done."""
        count = 0
        for step, path in self.pending():
            try:
                self.shared.restore(self.model, path)
            except checkpointer.CheckpointGoneError:
                self._skipped.add(step)
                self._log(f"{self.name}: skipped {path}: deleted (save_max_to_keep) before it was read")
                continue
            start = time.perf_counter()
            self.writer.open()  # the job's directory, for what process() writes in it
            metrics = self.process(step)
            self.writer.scalars(step, metrics)
            self.writer.flush()
            self._records.append({"step": step, "metrics": metrics})
            files.write_jsonl_atomic(self._scores_path, self._records)
            shown = "  ".join(f"{k} {v:.6g}" for k, v in sorted(metrics.items()))
            self._log(f"{self.name}: step {step}: {shown}  ({time.perf_counter() - start:.1f}s)")
            count += 1
        return count

    def process(self, step: int) -> dict[str, float]:
        """Evaluates/decodes the restored task at checkpoint ``step``; returns scalar metrics."""
        raise NotImplementedError

    def close(self) -> None:
        self.writer.close()

    # ------------------------------------------------------------------------------------ input
    def batches(self) -> tf.data.Dataset:
        """The data set's batches for one pass: samples_per_summary examples' worth (0: all)."""
        ds = self.input.dataset()
        batch_size = int(self.input.params.batch_size)
        if self.samples_per_summary > 0:
            return ds.take(-(-self.samples_per_summary // batch_size))
        if ds.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ConfigError(
                f"{self.name}: input.{self.dataset} repeats forever; set "
                f"task.{self.settings}.samples_per_summary > 0 or input.{self.dataset}.repeat : False"
            )
        return ds


def run_until_finished(
    jobs: list[CheckpointJob], log: Callable[[str], None] = print_line, wait: bool = True
) -> None:
    """Polls ``logdir/train`` for new checkpoints until every job has done the final one; says so when
    that was done before it started. ``wait=False`` (no trainer will write more): stops once the
    checkpoints present are processed."""
    interval = min(job.poll_interval_seconds for job in jobs)
    announced = False
    processed = 0
    while True:
        for job in jobs:
            if not job.finished:
                processed += job.run_pending()
        waiting = [job.name for job in jobs if not job.finished]
        if not waiting and not processed:
            step = min(max(job.done_steps) for job in jobs)
            log(
                f"{', '.join(job.name for job in jobs)}: nothing left to score: the run in "
                f"{jobs[0].train_dir} finished and its final checkpoint (step {step}) was already scored"
            )
        if not waiting:
            return
        if not wait:
            log(f"{', '.join(waiting)}: stopping: no trainer will write more checkpoints")
            return
        if not announced:
            log(f"{', '.join(waiting)}: waiting for checkpoints in {jobs[0].train_dir}")
            announced = True
        time.sleep(interval)
