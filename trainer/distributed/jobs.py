"""The jobs of a training cluster (``--mode=sync|async``): one process's part, from its Role.

- sync: every process is a trainer replica of ``MultiWorkerMirroredStrategy``; the chief (worker 0)
  also does the controller's writing (see train_job.TrainLoop's ``parallel``).
- async: the controller coordinates (parameter_servers.py), trainers and ps run a
  ``tf.distribute.Server`` until the controller is done or they are stopped.

A peer that dies makes TensorFlow's collectives or coordination service fail on the others; that is
turned into one line naming the cluster's peers (peers.peer_failure), and a non-zero exit, within a
bounded time.
"""

from __future__ import annotations

from collections.abc import Callable

from absl import logging as absl_logging

from params.errors import ConfigError, UserError
from params.hyperparams import Params
from trainer import launcher, tf_settings
from trainer.distributed import peers, roles, strategies
from trainer.open_logdir import open_logdir
from trainer.placement import Replicas
from trainer.progress import print_line
from trainer.train_job import run_trainer

TRAINER_JOBS = ("controller", "trainer")


def lingvo_job(mode: str, jobs: list[str]) -> str | None:
    """The one cluster job named by ``--job`` (None: the default of the mode)."""
    names = [j.strip() for j in jobs if j.strip()]
    if not names:
        return None
    if mode == roles.SYNC and set(names) <= set(TRAINER_JOBS):
        return "controller" if "controller" in names else "trainer"  # roles: the chief if there is one
    if len(names) == 1 and names[0] in roles.TASK_TYPES:
        return names[0]
    raise ConfigError(
        f"--job={','.join(names)}: with --mode={mode} a process runs one of controller, trainer, ps "
        "(evalers and decoders run outside the cluster: --mode=train --job=evaler_<dataset>)"
    )


def run(
    root: Params,
    logdir: str,
    mode: str,
    jobs: list[str],
    cluster_spec: str | None,
    task_index: int,
    log: Callable[[str], None] = print_line,
    allow_params_change: bool = False,
    cluster_wait_secs: float = peers.DEFAULT_WAIT_SECS,
) -> int:
    """Runs this process's part of the training cluster; returns the exit status.
    ``cluster_wait_secs``: how long to wait for the other tasks to start (peers.py)."""
    if jobs and all(j.split("_")[0] in launcher.JOB_KINDS for j in jobs if j.strip()):
        return launcher.run_jobs(
            root, logdir, jobs, log=log, allow_params_change=allow_params_change
        )  # evalers/decoders: outside the cluster
    role = roles.resolve_role(mode, cluster_spec, lingvo_job(mode, jobs), task_index)
    # Before the strategy starts TensorFlow's runtime. Async trainers shuffle by their clock.
    tf_settings.configure(
        root.cluster, deterministic=not (mode == roles.ASYNC and role.task_type == "worker")
    )
    if absl_logging.get_verbosity() == absl_logging.INFO:  # no INFO chatter per collective
        absl_logging.set_verbosity(absl_logging.WARNING)
    if "train" not in root.input.names():
        raise ConfigError(f"--mode={mode}: the experiment has no 'train' data set")
    try:
        if mode == roles.SYNC:
            return _run_sync(root, logdir, role, log, allow_params_change, cluster_wait_secs)
        from trainer.distributed import parameter_servers

        return parameter_servers.run(root, logdir, role, log, allow_params_change, cluster_wait_secs)
    except peers.PEER_ERRORS as e:
        raise UserError(peers.peer_failure(role, e)) from None


def _run_sync(
    root: Params,
    logdir: str,
    role: roles.Role,
    log: Callable[[str], None],
    allow_params_change: bool,
    cluster_wait_secs: float,
) -> int:
    if role.is_chief:
        log(f"trainer: {root.model}: sync trainer {role.name} of {role.num_workers}; logdir {logdir}")
    peers.wait_for_peers(role, cluster_wait_secs)  # in Python: says what it waits for, signals work
    strategy = strategies.sync_strategy(role)
    replicas = Replicas(strategy, role)
    # After the strategy: its collectives must be configured before TensorFlow makes a variable, and
    # the guard may build the task. Every worker runs the read-only guard; the chief writes.
    log = log if role.is_chief else _quiet
    opened = open_logdir(
        root, logdir, trains=True, allow_params_change=allow_params_change, writes=role.is_chief, log=log
    )
    if role.is_chief:
        log(f"trainer: {role.num_workers} workers in sync; this is the chief ({role.name})")
    with opened:
        # The barrier: nobody leaves before the chief saved (it leads the coordination).
        run_trainer(root, opened, replicas, log=log, then=lambda: strategies.barrier(strategy))
    return 0


def _quiet(line: str) -> None:
    del line
