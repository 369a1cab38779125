"""The trainer on a device mesh: the mesh from ``cluster.mesh_*`` and the mesh as a placement of the
one ``TrainStep`` (trainer/placement.py).

``MeshPlacement`` builds the task inside ``layers.parallel.mesh.mesh_scope`` (so its variables are
DVariables in their layouts) and keeps the global step and the optimizer slots on the mesh; the step
computes what it computes everywhere (trainer/train_step.py). What the mesh provides, forced by DTensor:
a DTensor function takes only DTensors, so each batch is read eagerly and copied onto the mesh (batch
dimension split by the ``batch`` rule) before the compiled step runs, and ``run(n)`` is therefore a
Python loop of ``n`` compiled steps rather than one ``tf.while_loop``. Gradients are laid out like their
variables before the learner sees them.

Checkpoints are the plain format, whatever the mesh: DTensor's saver takes only DTensors, so it cannot
write the input iterator's state next to DVariables. ``MeshCheckpointer`` therefore saves a host
mirror (the same task and learner built without a mesh, and a plain global step) into which each
save copies the full values of the DVariables, and out of which a restore copies them back, split by
each variable's layout. The file is exactly what an unsharded trainer writes: any mesh, or none, and
evalers and decoders restore it as usual. The cost is one full host copy of the weights and optimizer
state (on a CPU mesh the same memory; on accelerators host RAM, not device memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor

from layers import tf_compat
from layers.parallel import mesh as mesh_lib
from layers.parallel.pipeline.gpipe import GPipeLayer, clear_stage_meshes, gpipe_params_in
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.learner import Learner
from trainer import checkpoint_names, tracing
from trainer.checkpointer import Checkpointer
from trainer.placement import OnDevice, Placement, StepFunctions, StepOutputs, TrainState
from trainer.train_step import TrainStep


def mesh_from_cluster(cluster: Params) -> mesh_lib.DeviceMesh | None:
    """The mesh named by ``cluster.mesh_shape`` / ``mesh_axis_names`` / ``layout_rules`` (None: none)."""
    shape = list(cluster.get("mesh_shape") or []) if "mesh_shape" in cluster else []
    if not shape:
        if "layout_rules" in cluster and cluster.layout_rules:
            raise ConfigError(
                "cluster.layout_rules is set but cluster.mesh_shape is empty; set both or neither"
            )
        return None
    return mesh_lib.create_mesh(shape, list(cluster.mesh_axis_names), cluster.layout_rules)


def staged_pipelines(task_params: Params) -> list[Params]:
    """The Params of every GPipe layer in ``task_params`` whose stages carry meshes of their own
    (``stage_mesh_shape`` set)."""
    return [node for node in gpipe_params_in(task_params) if list(node.stage_mesh_shape)]


def without_stage_meshes(task_params: Params) -> Params:
    """``task_params`` with every GPipe layer's stages on plain devices: the same variables, regular
    ones (a stage-mesh run's host mirror, what its checkpoints hold)."""
    p = task_params.copy()
    for node in staged_pipelines(p):
        clear_stage_meshes(node)
    return p


def placement_from_cluster(cluster: Params, task_params: Params | None = None) -> Placement:
    """A ``StageMeshPlacement`` when the task's GPipe stages carry meshes, a ``MeshPlacement`` when
    the cluster names a mesh, else the caller's device."""
    mesh = mesh_from_cluster(cluster)
    pipelines = staged_pipelines(task_params) if task_params is not None else []
    if pipelines:
        if mesh is not None:
            raise ConfigError(
                "cluster.mesh_shape and a GPipe layer's stage_mesh_shape both place the model; set "
                "one (each stage's mesh is the pipeline x mesh combination)"
            )
        if len(pipelines) > 1:
            raise ConfigError(
                f"{len(pipelines)} GPipe layers set stage_mesh_shape; the trainer places one pipeline "
                "over stage meshes"
            )
        return StageMeshPlacement(pipelines[0])
    return OnDevice() if mesh is None else MeshPlacement(mesh)


def make_train_step(cluster: Params, task_params: Params, input_params: Params) -> TrainStep:
    """The ``TrainStep`` placed on the cluster's mesh (or its stages' meshes), or on the caller's
    device without one."""
    return TrainStep(task_params, input_params, placement_from_cluster(cluster, task_params))


def device_name(device: str) -> str:
    """A device's name as the trainer prints it: ``CPU:0`` for ``/job:localhost/.../device:CPU:0``."""
    return device.split("device:")[-1]


def device_order(name: str) -> tuple[str, int]:
    """A sort key putting ``CPU:2`` before ``CPU:10``."""
    kind, _, index = name.rpartition(":")
    return (kind, int(index)) if index.isdigit() else (name, -1)


def variable_bytes(v: tf.Variable) -> int:
    """The bytes of a variable's whole (unsharded) value."""
    return v.shape.num_elements() * v.dtype.size


def weight_slices(variables: Iterable[tf.Variable]) -> dict[str, dict[str, int]]:
    """Per device (``device_name``): the bytes of each variable's part it holds, by variable name: a
    DVariable's local component on that device (a replicated one: a whole copy on each), a regular
    variable's whole value on its device. The weight estimate of the stage-mesh start line and of
    ``--mode=inspect_placement`` (optimizer slots and activations not counted)."""
    held: dict[str, dict[str, int]] = {}
    for v in variables:
        if isinstance(v, dtensor.DVariable):
            parts = [
                (p.device, p.shape.num_elements() * p.dtype.size) for p in dtensor.unpack(v.read_value())
            ]
        else:
            parts = [(v.device, variable_bytes(v))]
        for device, n in parts:
            per_variable = held.setdefault(device_name(device), {})
            per_variable[v.name] = per_variable.get(v.name, 0) + n
    return held


class MeshPlacement(OnDevice):
    """A DTensor mesh: the task's variables are DVariables in their layouts, the global step and the
    optimizer slots live on the mesh; each batch is copied onto the mesh eagerly, so ``run(n)`` is a
    Python loop of ``n`` compiled steps; gradients are laid out like their variables."""

    traces_on_batch = True  # a DTensor function takes only DTensors: a first batch copied onto the mesh

    def __init__(self, mesh: mesh_lib.DeviceMesh) -> None:
        self.mesh = mesh
        self._batch_axis = mesh.rules.get("batch")
        self._mirror: tuple | None = None
        self._task_params: Params | None = None
        self._layouts: list = []

    def build_task(self, task_params: Params) -> tf.Module:
        with mesh_lib.mesh_scope(self.mesh):
            task = task_params.instantiate()
        if any(isinstance(m, GPipeLayer) for m in task.submodules):
            raise ConfigError(
                f"task {task_params.cls.__name__}: a GPipe pipeline cannot run on a device mesh "
                "(cluster.mesh_shape); use one or the other"
            )
        self._task_params = task_params
        self._layouts = [dtensor.fetch_layout(v) for v in task.trainable_variables]  # eagerly: here
        return task

    def global_step(self) -> tf.Variable:
        with tf.init_scope():
            return self.mesh.variable(tf.constant(0, tf.int64), [], "global_step", trainable=False)

    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        del variables  # the task's trainable variables, whose layouts build_task fetched
        grads = [
            None if g is None else dtensor.relayout(tf.convert_to_tensor(g), layout)
            for g, layout in zip(grads, self._layouts)
        ]
        return loss, grads, values

    def to_device(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return self.to_mesh(batch)

    def to_mesh(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """A batch of regular tensors -> DTensors, the batch dimension split by the ``batch`` rule."""

        def one(x: tf.Tensor) -> tf.Tensor:
            x = tf.convert_to_tensor(x)
            rank = x.shape.rank
            mapping = [None] * rank
            if rank and self._batch_axis and x.shape[0] % self.mesh.axis_sizes[self._batch_axis] == 0:
                mapping[0] = self._batch_axis
            return self.mesh.to_layout(x, mapping)

        return tf.nest.map_structure(one, batch)

    def host(self, x: Any) -> Any:
        """A replicated DTensor's value as a regular tensor (its first component)."""
        try:
            return dtensor.unpack(x)[0]
        except (TypeError, ValueError, tf.errors.OpError):
            return x

    def compile(self, steps: StepFunctions) -> Callable[[int], StepOutputs]:
        """Up to ``n`` compiled steps, one batch copied onto the mesh before each; stops at the first
        non-finite loss (that step changes nothing). Outputs are regular (host) tensors."""
        compiled = tracing.graph_function(steps.guarded_step)

        def run(num_steps: int) -> StepOutputs:
            finite, outputs = tf.constant(True), steps.zero_outputs
            # Without Grappler's memory heuristics: they misread a DTensor step's sharded weights
            # and print an ERROR line per split matmul (tf_compat.memory_heuristics_off).
            with tf_compat.memory_heuristics_off():
                for _ in range(num_steps):
                    finite, outputs = compiled(self.to_mesh(steps.next_batch()))
                    finite = self.host(finite)
                    if not bool(finite.numpy()):
                        break
            return finite, tf.nest.map_structure(self.host, outputs)

        return run

    def checkpointer(self, train_dir: str, max_to_keep: int, state: TrainState) -> Checkpointer:
        return MeshCheckpointer(train_dir, max_to_keep, state, self)

    # ------------------------------------------------------------------------- host mirror
    def host_mirror(self) -> tuple[tf.Module, Learner, tf.Variable]:
        """(task, learner, global_step) built without a mesh: what a plain checkpoint holds."""
        if self._mirror is None:
            task = without_stage_meshes(self._task_params).instantiate()
            learner = Learner(self._task_params.train, list(task.trainable_variables))
            with tf.init_scope():
                global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self._mirror = (task, learner, global_step)
        return self._mirror

    def _pairs(self, state: TrainState) -> list[tuple[tf.Variable, tf.Variable]]:
        task, learner, global_step = self.host_mirror()
        sharded = {v.name: v for v in state.task.variables}
        pairs = [(sharded[v.name], v) for v in task.variables]
        pairs += list(zip(state.learner.slot_variables(), learner.slot_variables()))
        return pairs + [(state.global_step, global_step)]

    def store_host(self, state: TrainState) -> None:
        """Copies every DVariable's full value into the host mirror (before a save)."""
        for dvar, host in self._pairs(state):
            layout = dtensor.fetch_layout(dvar)
            full = dtensor.relayout(
                dvar.read_value(), dtensor.Layout.replicated(layout.mesh, dvar.shape.rank)
            )
            host.assign(dtensor.unpack(full)[0])

    def load_host(self, state: TrainState) -> None:
        """Copies the host mirror into the DVariables, split by their layouts (after a restore)."""
        for dvar, host in self._pairs(state):
            checkpoint_names.assign_whole(dvar, host.read_value())


class StageMeshPlacement(MeshPlacement):
    """A GPipe pipeline whose stages carry DTensor meshes of their own (``GPipeLayer``'s
    ``stage_mesh_shape``): pipeline x mesh in the one ``TrainStep``.

    DTensor runs no op on inputs from two meshes, so each part of the step sits on one: the layers
    before the pipeline (the embedding) and each batch on the first stage's mesh (``mesh``), the
    layers after it (final norm, softmax), the loss, the metrics, the global step and the learner's
    scalars on the last stage's (``home``). The pipeline moves activations and their gradients
    between stages; the task moves its head's inputs to the last stage (``to_output_mesh``); the
    learner copies its shared scalars (learning rate, clipping scale) onto each variable's mesh, and
    its slots take their variable's layout. Checkpoints are the plain format through the host mirror
    (``MeshCheckpointer``: the same task with the stages on plain devices)."""

    def __init__(self, pipeline_params: Params) -> None:
        p = pipeline_params
        rules = p.stage_layout_rules
        first = mesh_lib.create_mesh(list(p.stage_mesh_shape), list(p.stage_mesh_axis_names), rules)
        super().__init__(first)
        self._batch_axis = None  # a stage mesh holds no batch axis (GPipeLayer refuses one)
        self.home: mesh_lib.DeviceMesh = first
        self.pipeline: GPipeLayer | None = None

    def build_task(self, task_params: Params) -> tf.Module:
        with mesh_lib.mesh_scope(self.mesh):  # the layers before the pipeline: its first stage's mesh
            task = task_params.instantiate()
        pipes = [m for m in task.submodules if isinstance(m, GPipeLayer) and m.stage_meshes]
        self.pipeline = pipes[0]
        self.home = self.pipeline.output_mesh
        self._task_params = task_params
        self._layouts = [dtensor.fetch_layout(v) for v in task.trainable_variables]
        return task

    def global_step(self) -> tf.Variable:
        with tf.init_scope():
            return self.home.variable(tf.constant(0, tf.int64), [], "global_step", trainable=False)

    def build_learner(self, train_params: Params, variables: list) -> Learner:
        return Learner(train_params, variables, home=self.home.mesh)

    def home_scalar(self, x: Any) -> Any:
        return mesh_lib.scalar_on(x, self.home.mesh)

    def startup_line(self, task: tf.Module, steps: StepFunctions) -> str:
        """Per device: the bytes of the weights it holds (its slices), and an activation estimate:
        the pipeline inputs a stage keeps for its backward (one per micro-batch in flight, at most
        all of them under fill-drain), replicated on each of its devices (split over a data axis's
        replicas). Not counted: optimizer slots (Adam: twice the weights), activations inside a stage
        (recomputed in its backward)."""
        del steps
        slices = weight_slices(task.trainable_variables)
        whole = sum(variable_bytes(v) for v in task.trainable_variables)
        m_count, micro = self.pipeline.micro_batch_input_bytes or (0, 0)
        micro /= self.pipeline.stage_replicas
        devices = " ".join(
            f"{d}={sum(slices[d].values()) / 1e3:.1f}K" for d in sorted(slices, key=device_order)
        )
        return (
            f"trainer: pipeline {self.pipeline.num_stages} x mesh {self.home.describe()}: weight bytes per "
            f"device {devices} (unsharded model {whole / 1e3:.1f}K; optimizer slots not counted); "
            f"activations kept per stage device <= {m_count} micro-batches x {micro / 1e3:.1f}K of "
            "stage input (inside a stage: recomputed, not counted)"
        )

    def reduce(
        self, loss: tf.Tensor, grads: list, values: dict, variables: list
    ) -> tuple[tf.Tensor, list, dict]:
        """The gradients as the pipeline made them, on their variables' meshes: consumed in the same
        step, their layouts follow the variables' (relayouting them here made DTensor reject the
        step: "'tf.Sum' op CopyToMeshOp must be used to send data across mesh")."""
        del variables
        return loss, grads, values

    def update_if(self, finite: tf.Tensor, update: Callable) -> dict[str, tf.Tensor]:
        """Each variable's update under a condition of its own mesh: DTensor (TensorFlow 2.21)
        compiles no ``tf.cond`` whose branches run on several meshes ("All inputs to
        `tf_device.Cluster` must have same mesh configuration"), and a step split in two (gradients
        returned from one function, applied by another) fails too ("'tf.Sum' op CopyToMeshOp must
        be used to send data across mesh", for the last stage's weights)."""
        return update(finite)


class MeshCheckpointer(Checkpointer):
    """The ``Checkpointer`` of a step on a mesh, writing and reading the plain format (module doc)."""

    def __init__(self, train_dir: str, max_to_keep: int, state: TrainState, placement: MeshPlacement) -> None:
        self._placement = placement
        task, learner, global_step = placement.host_mirror()
        super().__init__(
            train_dir,
            max_to_keep,
            task=task,
            learner=learner,
            global_step=global_step,
            iterator=state.iterator,
        )
        self._state = state

    def restore_latest(self) -> str | None:
        path = super().restore_latest()
        if path is not None:
            self._placement.load_host(self._state)
        return path

    def save(self, step: int) -> str:
        self._placement.store_host(self._state)
        return super().save(step)
