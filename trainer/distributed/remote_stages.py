"""Stages in other processes: a model's GPipe stages (and local-parallel blocks) on the tasks of a
cluster, driven by the trainer process on TensorFlow's distributed runtime.

``cluster.stage_job : 'worker'`` and ``--cluster_spec=worker=host:port,host:port`` (Lingvo's syntax;
``controller=host:port`` names the trainer's own address, needed across machines) put part k of
every GPipeLayer and LocalParallelLayer on ``/job:worker/replica:0/task:k/device:CPU:0``:

- each stage task is ``python -m trainer --mode=stages --task_index=k`` with the same flags: a
  ``tf.distribute.Server`` (with the experiment's thread settings) that serves until it is stopped;
- the trainer (the client) waits until every stage task answers, then
  ``tf.config.experimental_connect_to_cluster(spec, make_master_device_default=False)``: ops without a
  device stay in the trainer, and the ``RemoteStages`` placement builds the task with its parts'
  devices set to the stage tasks (layers/parallel/device_choice.py ``parts_on``), so each stage's
  variables are created on, and its forward, recompute and backward units run in, its own process
  (the pipeline executor places every unit, and the learner updates each variable, slots included,
  on the variable's device). Activations and gradients cross on TensorFlow's gRPC runtime.
- The step, the loop and the checkpoints are those of every placement: one compiled
  ``tf.while_loop`` of steps; a checkpoint is TensorFlow's multi-device save, in which each task
  writes the shard of the variables it holds (``ckpt-N.data-0000k-of-...``) into the logdir (which
  the tasks must therefore share), restorable by a single process.

A stage task that dies fails the trainer's next remote op; ``stage_failure`` turns that into one
line naming the task. ``network_bytes`` reads, from the traced step, the bytes each step sends
between processes (the hand-offs' shapes), which the trainer prints at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import time
from collections.abc import Callable, Iterator

import tensorflow as tf

from layers import tf_compat
from layers.parallel import device_choice as pipeline_devices
from params.errors import ConfigError, UserError
from params.hyperparams import Params
from trainer import tracing
from trainer.distributed import peers, roles
from trainer.placement import OnDevice, StepFunctions, StepOutputs, looped
from trainer.progress import print_line

CLIENT = "trainer"  # how the client process is named in the bytes report
LOCAL_CLIENT_JOB = roles.LOCAL_CLIENT_JOB  # the client's job when --cluster_spec names no controller


@dataclasses.dataclass(frozen=True)
class StageCluster:
    """The stage tasks (a job of the cluster) and the trainer's own place in it."""

    job: str  # TensorFlow's task type of the stage tasks (worker)
    spec: dict[str, list[str]]  # every job, the trainer's included
    client_job: str  # chief (a controller in --cluster_spec) or localhost
    wait_secs: float = peers.DEFAULT_WAIT_SECS  # for the stage tasks to answer

    @property
    def addresses(self) -> list[str]:
        return self.spec[self.job]

    @property
    def devices(self) -> list[str]:
        return [f"/job:{self.job}/replica:0/task:{k}/device:CPU:0" for k in range(len(self.addresses))]

    def task_name(self, k: int) -> str:
        return f"{self.job}:{k} ({self.addresses[k]})"

    def role(self) -> roles.Role:
        """The trainer as a Role of the cluster (for trainer/distributed/peers.py)."""
        return roles.Role(roles.ASYNC, self.spec, self.client_job, 0)


def stage_cluster(
    cluster: Params, cluster_spec: str | None, wait_secs: float = peers.DEFAULT_WAIT_SECS
) -> StageCluster:
    """The stage tasks named by ``cluster.stage_job`` in ``--cluster_spec``; ConfigError if absent."""
    job = cluster.stage_job
    if job not in roles.TASK_TYPES:
        raise ConfigError(
            f"cluster.stage_job : {job!r}: expected a job of --cluster_spec, e.g. 'worker' (or '' for "
            "this process's devices)"
        )
    if not cluster_spec:
        raise ConfigError(
            f"cluster.stage_job : {job!r} needs --cluster_spec naming the stage tasks, e.g. "
            f"--cluster_spec={job}=host:port,host:port"
        )
    spec = roles.parse_cluster_spec(cluster_spec)
    task_type = roles.TASK_TYPES[job]
    if task_type not in spec:
        raise ConfigError(
            f"cluster.stage_job : {job!r} but --cluster_spec has no {job} job: {cluster_spec!r}"
        )
    client_job = "chief" if "chief" in spec else LOCAL_CLIENT_JOB
    if client_job == LOCAL_CLIENT_JOB:
        spec[LOCAL_CLIENT_JOB] = [f"localhost:{_free_port()}"]
    return StageCluster(task_type, spec, client_job, wait_secs)


def _free_port() -> int:
    """A port free on this host now, for the trainer's own server when no controller address is given
    (the stage tasks then reach it as localhost: loopback only)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ stage tasks
def serve(
    root: Params, cluster_spec: str | None, task_index: int, log: Callable[[str], None] = print_line
) -> int:
    """``--mode=stages``: stage task ``task_index`` serves the trainer until this process is stopped."""
    stages = stage_cluster(root.cluster, cluster_spec)
    if not 0 <= task_index < len(stages.addresses):
        raise ConfigError(
            f"--task_index={task_index}: the {stages.job} job has {len(stages.addresses)} task(s) "
            f"(0..{len(stages.addresses) - 1})"
        )
    threads = root.cluster
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads.intra_op_threads,
        inter_op_parallelism_threads=threads.inter_op_threads,
    )
    tf.config.experimental.enable_op_determinism()  # the stages' kernels run here
    jobs = {job: addresses for job, addresses in stages.spec.items() if job != LOCAL_CLIENT_JOB}
    server = tf.distribute.Server(
        tf.train.ClusterSpec(jobs), job_name=stages.job, task_index=task_index, config=config, start=True
    )
    log(f"trainer: stage task {stages.task_name(task_index)} of {root.model} serving at {server.target}")
    while True:  # not server.join(): a Python loop lets Ctrl-C and SIGTERM end the process
        time.sleep(1.0)


# -------------------------------------------------------------------------------------- trainer
def placement(stages: StageCluster, log: Callable[[str], None] = print_line) -> RemoteStages:
    """Waits until every stage task answers, connects this process to the cluster (a ClusterSpec, not
    a resolver: a resolver with no master is taken as local and silently ignored), and returns the
    placement of the trainer's step."""
    peers.wait_for_peers(stages.role(), stages.wait_secs, log=log)
    tf.config.experimental_connect_to_cluster(
        tf.train.ClusterSpec(stages.spec), job_name=stages.client_job, make_master_device_default=False
    )
    return RemoteStages(stages)


class RemoteStages(OnDevice):
    """The trainer's process drives the step; each GPipe stage (local-parallel block) lives and runs
    on its stage task. Everything else (the input, the parts outside the pipeline, the global step,
    the loop) stays in the trainer."""

    def __init__(self, stages: StageCluster) -> None:
        self.stages = stages
        self.name = f"trainer with stages on {stages.job}:0..{len(stages.addresses) - 1}"

    def build_task(self, task_params: Params) -> tf.Module:
        where = f"--cluster_spec's {self.stages.job} job"
        with pipeline_devices.parts_on(self.stages.devices, where):
            return task_params.instantiate()

    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:
        """OnDevice's loop of the traced step, kept only as TensorFlow's runtime function, and the
        step's own trace dropped: the trainer need not hold the Python graphs of the unrolled
        pipeline (every stage's forward, recompute and backward for every micro-batch; ~11 KiB a
        node) while the runtime optimizes, partitions and runs it (with gpipe_k4 at 8 x 128, about
        400 MiB of the trainer's peak: docs/benchmark_results.md, capacity). TF 2.21 keeps the
        step's trace alive through its cond's branch functions (holder not found)."""
        loop = looped(steps)
        with tracing.user_errors(), tf_compat.custom_gradients_released():
            run = tf_compat.without_graph(loop, tf.TensorSpec([], tf.int32))
            del loop
            steps.release_trace()  # looped by ``run``, whose runtime copy is the only one kept
        return lambda n: run(tf.constant(n, tf.int32))

    def startup_line(self, task: tf.Module, steps: StepFunctions) -> str:
        """The bytes one step sends between processes."""
        del task
        return describe_bytes(network_bytes(steps.step_graph), steps.batch_size)


def network_bytes(step_graph: Callable[[], tf.Graph]) -> dict[tuple[str, str], int]:
    """Bytes one training step sends from process to process: ``{(from, to): bytes}``, read from the
    traced step (forward, backward and update; each tensor counted once per process that reads it).

    An op's process is its device's task; an op left without a device goes where TensorFlow's placer
    puts it: with the variable it reads, with the input of an identity, else in the trainer.

    The trace is freed before this returns (``custom_gradients_released``): kept, it would double the
    trainer's memory for the whole run."""
    with tf_compat.custom_gradients_released():
        return _bytes_sent(step_graph())


def _bytes_sent(graph: tf.Graph) -> dict[tuple[str, str], int]:
    captured = {internal.name: external.device for external, internal in graph.captures}
    where: dict[str, str] = {}

    def process_of(op: tf.Operation) -> str:
        if op.name not in where:
            where[op.name] = _process(op.device) if op.device else _unplaced(op)
        return where[op.name]

    def _unplaced(op: tf.Operation) -> str:
        if op.type == "Placeholder":
            return _process(captured.get(op.outputs[0].name, ""))
        for t in op.inputs:
            if t.dtype == tf.resource:
                return process_of(t.op)
        if op.type == "Identity" and len(op.inputs) == 1:
            return process_of(op.inputs[0].op)
        return CLIENT

    sent: dict[tuple[str, str], int] = {}
    seen: set[tuple[str, str]] = set()
    for op in graph.get_operations():
        to = process_of(op)
        for i, t in enumerate(op.inputs):
            if op.type == "IdentityN" and not op.outputs[i].consumers():
                continue  # Grappler's pruner splits an IdentityN and drops its unused parts
            source = process_of(t.op)
            if source == to or t.dtype == tf.resource or (t.name, to) in seen:
                continue
            seen.add((t.name, to))
            size = t.shape.num_elements()
            if size is None:
                raise ConfigError(f"the step sends {t.name} of unknown shape {t.shape} between processes")
            sent[(source, to)] = sent.get((source, to), 0) + size * t.dtype.size
    return sent


def _process(device: str) -> str:
    match = re.search(r"/job:([^/]+)(?:/replica:\d+)?/task:(\d+)", device or "")
    if match is None or match.group(1) in ("chief", LOCAL_CLIENT_JOB):
        return CLIENT
    return f"{match.group(1)}:{match.group(2)}"


def describe_bytes(sent: dict[tuple[str, str], int], batch_size: int) -> str:
    """One line: the bytes per step on each link, and their total."""
    links = ", ".join(f"{a} -> {b} {_size(n)}" for (a, b), n in sorted(sent.items()))
    total = sum(sent.values())
    return (
        f"trainer: per step (batch {batch_size}) across the network: {_size(total)} ({links}; from the "
        "traced step's shapes)"
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------- faults
def stage_failure(stages: StageCluster, error: Exception) -> str:
    """One line naming the stage task that failed (from TensorFlow's error, else the tasks that no
    longer answer)."""
    text = str(getattr(error, "message", error))
    named = {
        int(m.group(1))
        for m in re.finditer(rf"/job:{stages.job}/replica:\d+/task:(\d+)", text)
        if int(m.group(1)) < len(stages.addresses)
    }
    named |= {k for k, a in enumerate(stages.addresses) if a in text}
    down = [k for k in range(len(stages.addresses)) if not peers.answering(stages.addresses[k])]
    tasks = sorted(set(down) or named) or list(range(len(stages.addresses)))
    names = ", ".join(stages.task_name(k) for k in tasks)
    reason = text.strip().splitlines()[0][:160] if text.strip() else type(error).__name__
    return (
        f"stage task {names} failed or is unreachable ({type(error).__name__}: {reason}); start it again "
        "and run the same command to resume from the last checkpoint"
    )


@contextlib.contextmanager
def stage_failures(stages: StageCluster) -> Iterator[None]:
    """TensorFlow's errors for a peer that went away (and any error while a stage task does not
    answer), as one UserError line naming the task."""
    try:
        yield
    except peers.PEER_ERRORS as e:
        raise UserError(stage_failure(stages, e)) from None
    except UserError as e:  # e.g. a save that failed: a stage task that went away is the reason
        if all(peers.answering(a) for a in stages.addresses):
            raise
        raise UserError(stage_failure(stages, e)) from None
