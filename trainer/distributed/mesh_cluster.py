"""``--mode=mesh``: a DTensor mesh spread over several processes (multi-client DTensor).

    python -m trainer --mode=mesh --model=lm.synthetic.MeshTransformerLM --logdir=/shared/run \\
        --cluster_spec=trainer=host0:port,host1:port --task_index=K

Every process of ``--cluster_spec`` (Lingvo's syntax; one job, ``trainer`` or ``worker``) runs this
same command with its own ``--task_index``. Each becomes one DTensor client (``DTENSOR_CLIENT_ID``,
``DTENSOR_NUM_CLIENTS``, ``DTENSOR_JOBS``; ``dtensor.initialize_accelerator_system`` connects them
through TensorFlow's coordination service on gRPC) and holds ``prod(cluster.mesh_shape) / K`` of the
mesh's devices: ``cluster.num_logical_cpu_devices`` is the whole mesh's count, so the same Params run
on one process or on K. ``dtensor.create_distributed_mesh`` numbers the devices client by client,
the last mesh axis varying fastest: with ``mesh_shape [2, 2]`` (data x model) on 2 processes each
process holds one data slice and both model halves; with ``[1, 4]`` every split weight is cut across
both processes, and each process holds only its half.

Then the one loop (trainer/train_job.py) runs on every process with the ``MeshAcrossProcesses``
placement: each process reads the same global batch and copies it onto its devices, each compiled
step is one SPMD program whose collectives cross processes; task 0 alone holds the LOCK and writes
params.txt, summaries and progress, and every process takes part in each save, writing the shards
its devices hold (trainer/distributed/mesh_sharded_checkpoint.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf
from absl import logging as absl_logging
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError, UserError
from params.hyperparams import Params
from trainer import signals, tf_settings
from trainer.checkpointer import Checkpointer
from trainer.distributed import peers, roles
from trainer.distributed.mesh_placement import MeshPlacement
from trainer.open_logdir import open_logdir
from trainer.placement import TrainState
from trainer.progress import print_line
from trainer.train_job import run_trainer

MESH = "mesh"
JOB_NAME = "worker"  # the TensorFlow job of every DTensor client


def resolve_role(cluster_spec: str | None, task_index: int) -> roles.Role:
    """This process's place among the mesh's processes, from ``--cluster_spec`` and ``--task_index``."""
    if not cluster_spec:
        raise ConfigError(
            "--mode=mesh needs --cluster_spec=trainer=host:port,host:port (one address per process)"
        )
    spec = roles.parse_cluster_spec(cluster_spec)
    if set(spec) != {"worker"}:
        raise ConfigError(
            f"--mode=mesh: --cluster_spec names {sorted(spec)}; a mesh's processes are one job: "
            "trainer=host:port,host:port"
        )
    addresses = spec["worker"]
    if not 0 <= task_index < len(addresses):
        raise ConfigError(
            f"--task_index={task_index}: the mesh has {len(addresses)} process(es) (0..{len(addresses) - 1})"
        )
    return roles.Role(MESH, spec, "worker", task_index)


def devices_per_process(cluster_params: Params, processes: int) -> int:
    """``prod(cluster.mesh_shape) / processes``: each process's share of the mesh's devices."""
    shape = list(cluster_params.mesh_shape or [])
    if not shape:
        raise ConfigError(
            "--mode=mesh: the experiment names no mesh (cluster.mesh_shape is empty); "
            "set cluster.mesh_shape and cluster.mesh_axis_names"
        )
    total = 1
    for size in shape:
        total *= int(size)
    if total % processes:
        raise ConfigError(
            f"--mode=mesh: cluster.mesh_shape {shape} has {total} devices, not divisible among "
            f"{processes} processes"
        )
    return total // processes


def connect(role: roles.Role, cluster_params: Params) -> mesh_lib.DeviceMesh:
    """Makes this process DTensor client ``role.task_index`` and returns the mesh over every client's
    devices (blocks until every process has connected)."""
    os.environ.pop("TF_CONFIG", None)  # the cluster is DTensor's, from the variables below
    os.environ["DTENSOR_CLIENT_ID"] = str(role.task_index)
    os.environ["DTENSOR_NUM_CLIENTS"] = str(len(role.cluster["worker"]))
    os.environ["DTENSOR_JOBS"] = ",".join(role.cluster["worker"])
    os.environ["DTENSOR_JOB_NAME"] = JOB_NAME
    device_type = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    dtensor.initialize_accelerator_system(device_type)
    return mesh_lib.create_mesh(
        list(cluster_params.mesh_shape),
        list(cluster_params.mesh_axis_names),
        cluster_params.layout_rules,
        device_type=device_type,
        across_processes=True,
    )


class MeshAcrossProcesses(MeshPlacement):
    """A mesh whose devices belong to several processes (module doc). Every process runs the same
    calls of the same steps (a fixed number per call), so their collectives pair up; every process
    takes part in each save; the input position is a function of the step, as for sync replicas."""

    steps_per_call = 20
    keeps_input_position = False
    skips_input_to_step = True
    saves_everywhere = True

    def __init__(self, mesh: mesh_lib.DeviceMesh, role: roles.Role) -> None:
        super().__init__(mesh)
        self.role = role
        self.name = role.name
        self.is_chief = role.task_index == 0
        self._sum = tf.function(tf.reduce_sum)
        self._stopped_by: list[int] = []

    def checkpointer(self, train_dir: str, max_to_keep: int, state: TrainState) -> Checkpointer:
        from trainer.distributed.mesh_sharded_checkpoint import ShardedCheckpointer

        return ShardedCheckpointer(train_dir, max_to_keep, state, writes_state=self.is_chief)

    def any_process(self, flag: bool) -> bool:
        """Whether ``flag`` is set on any process (one tiny all-reduce over the mesh; every process
        must call it at the same point)."""
        return bool(self._processes_with(flag))

    def _processes_with(self, flag: bool) -> list[int]:
        """The task indices of the processes whose ``flag`` is set: each process puts its bit in
        every one of its devices' elements; the sum over the mesh counts each process once per
        device, and every process holds as many devices."""
        local_devices = self.mesh.mesh.num_local_devices()
        layout = dtensor.Layout(self.mesh.axis_names, self.mesh.mesh)  # one element per device
        value = float(2**self.role.task_index) if flag else 0.0
        local = [tf.fill([1] * len(self.mesh.axis_names), value)] * local_devices
        total = self.host(self._sum(dtensor.pack(local, layout)))
        bits = round(float(total.numpy()) / local_devices)
        return [i for i in range(len(self.role.cluster["worker"])) if bits >> i & 1]

    def stop_requested(self, sigterm: signals.Flag) -> bool:
        self._stopped_by = self._processes_with(sigterm.raised)
        return bool(self._stopped_by)

    def terminated(self, step: int, saved: str | None) -> str:
        names = ", ".join(f"trainer {i}" for i in self._stopped_by)
        return (
            f"{self.name} stopped at step {step} with the mesh: {names} got SIGTERM; saved {saved}; "
            "start every process again to resume from it"
        )


def run(
    root: Params,
    logdir: str,
    cluster_spec: str | None,
    task_index: int,
    log: Callable[[str], None] = print_line,
    allow_params_change: bool = False,
    cluster_wait_secs: float = peers.DEFAULT_WAIT_SECS,
) -> int:
    """Runs this process's part of the mesh; returns the exit status."""
    role = resolve_role(cluster_spec, task_index)
    if "train" not in root.input.names():
        raise ConfigError("--mode=mesh: the experiment has no 'train' data set")
    per_process = devices_per_process(root.cluster, len(role.cluster["worker"]))
    tf_settings.configure(root.cluster.copy().set(num_logical_cpu_devices=per_process))
    if absl_logging.get_verbosity() == absl_logging.INFO:
        absl_logging.set_verbosity(absl_logging.WARNING)
    chief = role.task_index == 0  # task 0 holds the LOCK and writes the logdir
    if chief:
        log(
            f"trainer: {root.model}: mesh {list(root.cluster.mesh_shape)} over "
            f"{len(role.cluster['worker'])} processes x {per_process} devices; logdir {logdir}"
        )
    peers.wait_for_peers(role, cluster_wait_secs)
    try:
        mesh = connect(role, root.cluster)
        placement = MeshAcrossProcesses(mesh, role)
        log = log if chief else _quiet
        opened = open_logdir(
            root, logdir, trains=True, allow_params_change=allow_params_change, writes=chief, log=log
        )
        with opened:
            run_trainer(root, opened, placement, log=log)
    except peers.PEER_ERRORS as e:
        raise UserError(peers.peer_failure(role, e)) from None
    return 0


def _quiet(line: str) -> None:
    del line
