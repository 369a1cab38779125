"""Training on several processes: the cluster from flags or TF_CONFIG, and TensorFlow's strategies.

The cluster is given in Lingvo's syntax, ``--cluster_spec=worker=host:port,host:port@ps=host:port``
(jobs separated by ``@``, tasks by ``,``), plus ``--task_index``; or, with no ``--cluster_spec``, by a
``TF_CONFIG`` already in the environment. Lingvo's job names map onto TensorFlow's task types:

    Lingvo job     TensorFlow task type   what the process does
    controller     chief                  async: the coordinator (schedules steps, saves checkpoints)
    trainer        worker                 sync: a replica (worker 0 is the chief: it writes the logdir);
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
from trainer import tf_compat

TASK_TYPES = {"controller": "chief", "chief": "chief", "trainer": "worker", "worker": "worker", "ps": "ps"}
SYNC, ASYNC = "sync", "async"


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
            if not colon or not host or not port.isdigit():
                raise ConfigError(f"--cluster_spec: {job}: expected host:port, got {address!r}")
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
        task_type = _task_type(mode, job)
    else:
        env = os.environ.get("TF_CONFIG")
        if not env:
            raise ConfigError(
                f"--mode={mode} needs --cluster_spec (e.g. worker=host:port,host:port) or TF_CONFIG"
            )
        cluster, task_type, task_index = _from_tf_config(env)
        if job is not None and _task_type(mode, job) != task_type:
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


def _task_type(mode: str, job: str | None) -> str:
    if job is None:
        return "worker" if mode == SYNC else "chief"
    if job not in TASK_TYPES:
        raise ConfigError(f"--job={job}: in --mode={mode} a process runs one of controller, trainer, ps")
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


def activate(role: Role) -> None:
    """Exports TF_CONFIG for TensorFlow's cluster resolver (before a strategy or server is built)."""
    os.environ["TF_CONFIG"] = json.dumps(role.tf_config())


def sync_strategy(role: Role):
    """MultiWorkerMirroredStrategy over the cluster, with RING all-reduce.

    A peer that dies is noticed by the collectives (its sockets close) or by TensorFlow's coordination
    service (its heartbeats stop); no per-collective timeout is set: in TF 2.21 each collective run
    with ``timeout_seconds`` leaks two threads, thousands per minute of training."""
    import tensorflow as tf

    activate(role)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if tf_compat.num_devices_per_worker(strategy) != 1:
        raise ConfigError("--mode=sync: each worker must hold one replica (one CPU or one GPU per process)")
    # Replica-context all-reduces without merge_call: with one replica per worker, the collective
    # ops the replica launches itself are those merge_call would launch, and they may then sit
    # inside the loop of steps (a tf.while_loop) and a pipeline's recomputed backward pass, where
    # merge_call cannot run. TensorFlow takes this same path itself under XLA on GPUs.
    tf_compat.disable_merge_call(strategy)
    return strategy


def barrier(strategy) -> None:
    """Returns once every replica of ``strategy`` got here (one tiny all-reduce)."""
    import tensorflow as tf

    def one() -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]))

    strategy.experimental_local_results(tf.function(lambda: strategy.run(one))())


def all_reduce_packed(replica, op, tensors: list) -> list:
    """``replica.all_reduce(op, tensors)`` as one collective per dtype rather than one per tensor.

    Between processes each collective costs a round trip or two (about a millisecond on loopback
    gRPC, more on a busy core), so a step that all-reduced each gradient and metric on its own spent
    more time waiting than computing. The sums are elementwise, so packing changes no value."""
    import tensorflow as tf

    out = list(tensors)
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for indices in by_dtype.values():
        parts = [tensors[i] for i in indices]
        sizes = [tf.size(t) for t in parts]
        packed = replica.all_reduce(op, tf.concat([tf.reshape(t, [-1]) for t in parts], 0))
        for i, t, piece in zip(indices, parts, tf.split(packed, tf.stack(sizes), num=len(parts))):
            out[i] = tf.reshape(piece, tf.shape(t))
    return out


def terminated_workers(strategy, num_workers: int):
    """A function ``(this worker's index, got SIGTERM) -> indices of the workers that got SIGTERM``.

    Every worker calls it at the same points of the loop (one tiny all-reduce), so all of them learn
    of a SIGTERM to any one at the same step and stop there together: the chief saves that step.
    TensorFlow's ``PreemptionCheckpointHandler`` agrees on a step the same way (through the
    coordination service) but wants to call each step itself and to save with its own
    ``CheckpointManager`` and exit; here the steps run in loops of many inside one compiled call and
    the chief saves through the project's Checkpointer (the logdir's ``ckpt-<step>`` layout)."""
    import tensorflow as tf

    def one(flags: tf.Tensor) -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)

    reduce = tf.function(lambda flags: strategy.run(one, args=(flags,)))

    def call(index: int, terminated: bool) -> list[int]:
        flags = tf.one_hot(index, num_workers) * (1.0 if terminated else 0.0)
        total = strategy.experimental_local_results(reduce(flags))[0].numpy()
        return [i for i in range(num_workers) if total[i] > 0]

    return call
