"""Training on several processes: the cluster from flags or TF_CONFIG, and TensorFlow's strategies.

The cluster is given in Lingvo's syntax, ``--cluster_spec=worker=host:port,host:port@ps=host:port``
(jobs separated by ``@``, tasks by ``,``), plus ``--task_index``; or, with no ``--cluster_spec``, by a
``TF_CONFIG`` already in the environment. Lingvo's job names map onto TensorFlow's task types:

    Lingvo job     TensorFlow task type   what the process does
    controller     chief                  async: the coordinator (schedules steps, saves checkpoints);
                                          sync (Lingvo's ``controller=h:p@worker=h:p``): a replica that
                                          writes the logdir; with no controller job in the cluster,
                                          ``--job=controller`` is trainer ``--task_index``
    trainer        worker                 sync: a replica (with no chief, worker 0 writes the logdir);
                                          async: runs the steps the coordinator schedules
    ps             ps                     async: holds the variables
    (``worker`` and ``chief`` are accepted as they are)

Evalers and decoders stay outside the training cluster: they read the shared logdir as usual.

``--mode=sync`` builds ``tf.distribute.MultiWorkerMirroredStrategy`` (all-reduce with RING collectives
on CPU); ``--mode=async`` builds ``tf.distribute.experimental.ParameterServerStrategy`` with a
``ClusterCoordinator`` on the controller, and plain ``tf.distribute.Server`` processes for the workers
and parameter servers.
"""

from __future__ import annotations

import dataclasses
import json
import os

from params.errors import ConfigError

TASK_TYPES = {"controller": "chief", "chief": "chief", "trainer": "worker", "worker": "worker", "ps": "ps"}
SYNC, ASYNC = "sync", "async"
LOCAL_CLIENT_JOB = "localhost"  # the trainer's job beside remote stages when no controller is named
MAX_PORT = 65535


@dataclasses.dataclass(frozen=True)
class Role:
    """This process's place in the cluster."""

    mode: str  # sync or async
    cluster: dict[str, list[str]]  # TensorFlow task type -> addresses
    task_type: str  # chief, worker or ps
    task_index: int

    @property
    def num_workers(self) -> int:
        """Replicas that train: every worker (and, in sync mode, a chief, which is a replica too)."""
        extra = len(self.cluster.get("chief", [])) if self.mode == SYNC else 0
        return len(self.cluster.get("worker", [])) + extra

    @property
    def worker_index(self) -> int:
        """This replica's rank among the training replicas (its input shard)."""
        if self.mode == SYNC and self.task_type == "worker" and "chief" in self.cluster:
            return self.task_index + 1
        return self.task_index

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the logdir (checkpoints, summaries, params.txt, progress)."""
        if self.task_type == "chief":
            return True
        return self.mode == SYNC and "chief" not in self.cluster and self.task_index == 0

    @property
    def name(self) -> str:
        """``worker:1``; the trainer of remote stages with no controller address: ``the trainer``."""
        if self.task_type == LOCAL_CLIENT_JOB:
            return "the trainer"
        return f"{self.task_type}:{self.task_index}"

    def address(self, task_type: str, index: int) -> str:
        return self.cluster[task_type][index]

    def tf_config(self) -> dict:
        return {"cluster": self.cluster, "task": {"type": self.task_type, "index": self.task_index}}


def parse_cluster_spec(text: str) -> dict[str, list[str]]:
    """``worker=h:p,h:p@ps=h:p`` -> ``{'worker': [...], 'ps': [...]}`` with TensorFlow's task types."""
    cluster: dict[str, list[str]] = {}
    for part in text.split("@"):
        job, sep, hosts = part.partition("=")
        job = job.strip()
        if not sep or not job:
            raise ConfigError(
                f"--cluster_spec: expected job=host:port[,host:port...] between '@', got {part!r}"
            )
        if job not in TASK_TYPES:
            raise ConfigError(f"--cluster_spec: unknown job {job!r}; expected one of {', '.join(TASK_TYPES)}")
        task_type = TASK_TYPES[job]
        if task_type in cluster:
            raise ConfigError(f"--cluster_spec: job {task_type!r} given twice (as {job!r})")
        addresses = [h.strip() for h in hosts.split(",")]
        for address in addresses:
            host, colon, port = address.rpartition(":")
            if not colon or not host or not port:
                raise ConfigError(f"--cluster_spec: {job}: expected host:port, got {address!r}")
            if not (port.isascii() and port.isdigit() and 1 <= int(port) <= MAX_PORT):
                raise ConfigError(
                    f"--cluster_spec: {job}: {address!r}: the port must be a number from 1 to {MAX_PORT}"
                )
        cluster[task_type] = addresses
    return cluster


def resolve_role(mode: str, cluster_spec: str | None, job: str | None, task_index: int) -> Role:
    """This process's Role from the flags, or from TF_CONFIG when ``cluster_spec`` is empty.

    ``job``: the Lingvo job this process runs (controller, trainer or ps; None: trainer in sync
    mode, where every process is a trainer)."""
    if mode not in (SYNC, ASYNC):
        raise ConfigError(f"--mode={mode}: expected {SYNC} or {ASYNC} to train on a cluster")
    if cluster_spec:
        cluster = parse_cluster_spec(cluster_spec)
        task_type = _task_type(mode, job, cluster)
    else:
        env = os.environ.get("TF_CONFIG")
        if not env:
            raise ConfigError(
                f"--mode={mode} needs --cluster_spec (e.g. worker=host:port,host:port) or TF_CONFIG"
            )
        cluster, task_type, task_index = _from_tf_config(env)
        if job is not None and _task_type(mode, job, cluster) != task_type:
            raise ConfigError(f"--job={job} does not match TF_CONFIG's task type {task_type!r}")
    if task_type not in cluster:
        raise ConfigError(f"--cluster_spec has no {task_type} job for this process")
    if not 0 <= task_index < len(cluster[task_type]):
        raise ConfigError(
            f"--task_index={task_index}: the {task_type} job has {len(cluster[task_type])} task(s) "
            f"(0..{len(cluster[task_type]) - 1})"
        )
    role = Role(mode, cluster, task_type, task_index)
    _check_shape(role)
    return role


def _task_type(mode: str, job: str | None, cluster: dict[str, list[str]]) -> str:
    if job is None:
        return "worker" if mode == SYNC else "chief"
    if job not in TASK_TYPES:
        raise ConfigError(f"--job={job}: in --mode={mode} a process runs one of controller, trainer, ps")
    if mode == SYNC and TASK_TYPES[job] == "chief" and "chief" not in cluster:
        return "worker"  # a sync cluster of trainers only: the controller's writing is trainer 0's
    return TASK_TYPES[job]


def _from_tf_config(text: str) -> tuple[dict[str, list[str]], str, int]:
    try:
        config = json.loads(text)
        cluster = {str(k): [str(a) for a in v] for k, v in config["cluster"].items()}
        task = config["task"]
        return cluster, str(task["type"]), int(task.get("index", 0))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"TF_CONFIG is not a cluster spec ({type(e).__name__}: {e}); expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}'
        ) from None


def _check_shape(role: Role) -> None:
    unknown = sorted(set(role.cluster) - {"chief", "worker", "ps", "evaluator"})
    if unknown:
        raise ConfigError(f"cluster: unknown task type(s) {unknown}")
    if role.mode == SYNC:
        if "ps" in role.cluster:
            raise ConfigError("--mode=sync: the cluster has a ps job; parameter servers need --mode=async")
        if role.task_type not in ("chief", "worker"):
            raise ConfigError(f"--mode=sync: this process is {role.task_type}; every process is a trainer")
    else:
        if (
            len(role.cluster.get("chief", [])) != 1
            or not role.cluster.get("worker")
            or not role.cluster.get("ps")
        ):
            raise ConfigError(
                "--mode=async needs one controller, at least one trainer and one ps, e.g. "
                "--cluster_spec=controller=h:p@trainer=h:p,h:p@ps=h:p"
            )
