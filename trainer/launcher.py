"""Which jobs this process runs over the shared logdir, and in what order.

Jobs: ``controller`` and ``trainer`` (one loop, see train_job.py), ``evaler_<ds>`` and ``decoder_<ds>``
for each data set other than ``train``.

- No ``--job`` (the default): every job in this process. The training loop runs in the main thread;
  after each checkpoint it saves, every evaler and decoder processes the new checkpoint (restoring it
  into its own task instance) before training goes on. So when the process exits, training is over and
  every checkpoint was evaluated and decoded, with no threads to coordinate. Before training starts,
  they first catch up on checkpoints a previous, interrupted run left unprocessed.
- ``--job=controller,trainer``: the training loop alone.
- ``--job=evaler_dev,decoder_test`` (any evalers/decoders): poll ``logdir/train`` every
  ``task.eval.poll_interval_seconds`` and process each new checkpoint, until the one at ``max_steps``
  is done. An experiment with no ``train`` data set has no trainer to wait for: its jobs process the
  checkpoints present and stop, and with none there the run is a ConfigError before anything is written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from absl import logging as absl_logging

from params.errors import ConfigError
from params.hyperparams import Params
from trainer import checkpointer, files, tf_settings
from trainer.checkpoint_job import CheckpointJob, SharedTasks, run_until_finished
from trainer.decoder_job import Decoder, implements_decode
from trainer.distributed import peers as cluster_wait
from trainer.distributed import remote_stages
from trainer.evaler_job import Evaler
from trainer.multi_task_jobs import check_model_task_name, model_tasks
from trainer.open_logdir import OpenLogdir, open_logdir
from trainer.progress import print_line
from trainer.train_job import run_trainer

TRAIN_JOBS = ("controller", "trainer")
JOB_KINDS: dict[str, type[CheckpointJob]] = {"evaler": Evaler, "decoder": Decoder}


def eval_datasets(root: Params) -> list[str]:
    return [name for name in root.input.names() if name != "train"]


def all_jobs(root: Params) -> list[str]:
    """Every job of an experiment: what an empty --job runs."""
    jobs = list(TRAIN_JOBS) if "train" in root.input.names() else []
    jobs += [f"evaler_{ds}" for ds in eval_datasets(root)]
    if implements_decode(root.task.cls):
        jobs += [f"decoder_{ds}" for ds in eval_datasets(root)]
    return jobs


def check_jobs(root: Params, jobs: list[str]) -> list[str]:
    """The validated job names (all of them for an empty list)."""
    names = list(dict.fromkeys(j.strip() for j in jobs if j.strip())) or all_jobs(root)
    datasets = eval_datasets(root)
    known = list(TRAIN_JOBS) + [f"{k}_{ds}" for k in JOB_KINDS for ds in datasets]
    for name in names:
        if name not in known:
            raise ConfigError(f"--job: unknown job {name!r}; this experiment has {', '.join(known)}")
    if ("controller" in names) != ("trainer" in names):
        raise ConfigError(
            "--job: the controller and the trainer are one loop (TensorFlow 2 has no shared session "
            "between processes); run them together: --job=controller,trainer"
        )
    if "trainer" in names and "train" not in root.input.names():
        raise ConfigError("--job=trainer: the experiment has no 'train' data set")
    return names


def run_jobs(
    root: Params,
    logdir: str,
    jobs: list[str],
    log: Callable[[str], None] = print_line,
    allow_params_change: bool = False,
    cluster_spec: str | None = None,
    cluster_wait_secs: float = cluster_wait.DEFAULT_WAIT_SECS,
    model_task_name: str = "",
) -> int:
    """Runs the named jobs (empty: all, in this process) over ``logdir``; returns the exit status.

    The logdir is opened first (trainer/open_logdir.py: the params.txt guard, before anything is
    written; the LOCK when this process trains). ``cluster_spec``: where the stage tasks of
    ``cluster.stage_job`` are (trainer/distributed/remote_stages.py), waited for up to
    ``cluster_wait_secs``. ``model_task_name``: one task of a multi-task model
    (trainer/multi_task_jobs.py)."""
    check_model_task_name(root, model_task_name)
    tf_settings.configure(root.cluster)  # first: TensorFlow must not have initialized its devices yet
    if absl_logging.get_verbosity() == absl_logging.INFO:  # the default: no INFO chatter per checkpoint
        absl_logging.set_verbosity(absl_logging.WARNING)
    names = check_jobs(root, jobs)
    no_trainer = "train" not in root.input.names()  # so nothing will write another checkpoint
    if not names:
        raise ConfigError(f"{root.model} has no data sets, so no job to run")
    if no_trainer and not checkpointer.list_checkpoints(files.join(logdir, "train")):
        raise ConfigError(
            f"jobs {', '.join(names)} would wait forever: {files.join(logdir, 'train')} has no checkpoint "
            f"and {root.model} has no 'train' data set, so no trainer will write one"
        )
    trains = "trainer" in names
    stages = None
    if trains and root.cluster.stage_job:
        stages = remote_stages.stage_cluster(root.cluster, cluster_spec, cluster_wait_secs)
        cluster_wait.wait_for_peers(stages.role(), stages.wait_secs, log=log)  # a refused wait writes nothing
    with open_logdir(root, logdir, trains=trains, allow_params_change=allow_params_change, log=log) as opened:
        return _run_jobs(
            root, opened, names, log, wait=not no_trainer, stages=stages, model_task=model_task_name
        )


def _run_jobs(
    root: Params,
    opened: OpenLogdir,
    names: list[str],
    log: Callable[[str], None],
    wait: bool,
    stages: remote_stages.StageCluster | None = None,
    model_task: str = "",
) -> int:
    logdir = opened.logdir
    log(f"trainer: {root.model}: jobs {', '.join(names)}; logdir {logdir}")
    log(f"trainer: watch it with: .venv/bin/tensorboard --logdir={logdir}")
    # Connecting resets TensorFlow's context: before any job makes a resource (a summary writer).
    placement = remote_stages.placement(stages, log) if stages else None
    checkpoint_jobs: list[CheckpointJob] = []
    shared = SharedTasks()  # jobs with equal task Params build and trace the model once
    try:
        for name in names:
            kind, _, dataset = name.partition("_")
            for task in model_tasks(root, kind, model_task) if kind in JOB_KINDS else []:
                checkpoint_jobs.append(
                    JOB_KINDS[kind](root, logdir, dataset, log=log, shared=shared, model_task=task)
                )
        if "trainer" in names:
            _train(root, opened, checkpoint_jobs, log, placement, model_task)
        else:
            run_until_finished(checkpoint_jobs, log=log, wait=wait)
    finally:
        for job in checkpoint_jobs:
            job.close()
    return 0


def _train(
    root: Params,
    opened: OpenLogdir,
    checkpoint_jobs: list[CheckpointJob],
    log: Callable[[str], None],
    placement: remote_stages.RemoteStages | None = None,
    model_task: str = "",
) -> None:
    def after_save(step: int) -> None:
        del step
        for job in checkpoint_jobs:
            job.run_pending()

    failures = remote_stages.stage_failures(placement.stages) if placement else contextlib.nullcontext()
    with failures:
        run_trainer(
            root,
            opened,
            placement,
            log=log,
            after_save=after_save if checkpoint_jobs else None,
            model_task_name=model_task,
        )
