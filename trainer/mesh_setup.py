"""The trainer on a device mesh: the mesh from ``cluster.mesh_*`` and a train step over DTensors.

``MeshTrainStep`` builds the task inside ``layers.mesh.mesh_scope`` (so its variables are DVariables in
their layouts), keeps the global step and the optimizer slots on the mesh, and runs the same
forward/backward/learner code as ``TrainStep``. Two differences, both forced by DTensor: a DTensor
function takes only DTensors, so each batch is read eagerly and copied onto the mesh (batch dimension
split by the ``batch`` rule) before the compiled step runs, and ``run(n)`` is therefore a Python loop
of ``n`` compiled steps rather than one ``tf.while_loop``. Gradients are laid out like their variables
before the learner sees them.

Checkpoints are the plain format, whatever the mesh: DTensor's saver takes only DTensors, so it cannot
write the input iterator's state next to DVariables. ``MeshCheckpointer`` therefore saves a host
mirror (the same task and learner built without a mesh, and a plain global step) into which each
save copies the full values of the DVariables, and out of which a restore copies them back, split by
each variable's layout. The file is exactly what an unsharded trainer writes: any mesh, or none, and
evalers and decoders restore it as usual. The cost is one full host copy of the weights and optimizer
state (on a CPU mesh the same memory; on accelerators host RAM, not device memory).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor

from layers import mesh as mesh_lib
from layers.base_layer import FPropContext
from layers.gpipe import GPipeLayer
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.learner import Learner
from trainer import tracing
from trainer.checkpointer import Checkpointer
from trainer.train_step import RESERVED_SUMMARY_NAMES, TrainStep


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


def make_train_step(cluster: Params, task_params: Params, input_params: Params) -> TrainStep:
    """A ``MeshTrainStep`` when the cluster names a mesh, else the plain ``TrainStep``."""
    mesh = mesh_from_cluster(cluster)
    if mesh is None:
        return TrainStep(task_params, input_params)
    return MeshTrainStep(mesh, task_params, input_params)


class MeshTrainStep(TrainStep):
    """``TrainStep`` over a DTensor mesh (same attributes: task, input, iterator, global_step, learner)."""

    def __init__(self, mesh: mesh_lib.DeviceMesh, task_params: Params, input_params: Params) -> None:
        self.mesh = mesh
        with mesh_lib.mesh_scope(mesh):
            self.task = task_params.instantiate()
        if any(isinstance(m, GPipeLayer) for m in self.task.submodules):
            raise ConfigError(
                f"task {task_params.cls.__name__}: a GPipe pipeline cannot run on a device mesh "
                "(cluster.mesh_shape); use one or the other"
            )
        self.input = input_params.instantiate()
        self.iterator = iter(self.input.dataset())
        with tf.init_scope():
            self.global_step = mesh.variable(tf.constant(0, tf.int64), [], "global_step", trainable=False)
        self._variables = list(self.task.trainable_variables)
        if not self._variables:
            raise ConfigError(f"task {task_params.cls.__name__} has no trainable variables")
        self._layouts = [dtensor.fetch_layout(v) for v in self._variables]
        self.learner = Learner(task_params.train, self._variables)
        self._seed = self.task.params.random_seed
        self._batch_axis = mesh.rules.get("batch")
        self._step_fn = tf.function(self._one_step)
        self._grads_fn = tf.function(self._loss_and_grads)
        self._task_params = task_params
        self._mirror: tuple | None = None

    # ------------------------------------------------------------------------- host mirror
    def host_mirror(self) -> tuple[tf.Module, Learner, tf.Variable]:
        """(task, learner, global_step) built without a mesh: what a plain checkpoint holds."""
        if self._mirror is None:
            task = self._task_params.instantiate()
            learner = Learner(self._task_params.train, list(task.trainable_variables))
            with tf.init_scope():
                global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self._mirror = (task, learner, global_step)
        return self._mirror

    def _pairs(self) -> list[tuple[tf.Variable, tf.Variable]]:
        task, learner, global_step = self.host_mirror()
        sharded = {v.name: v for v in self.task.variables}
        pairs = [(sharded[v.name], v) for v in task.variables]
        pairs += list(zip(self.learner.slot_variables(), learner.slot_variables()))
        return pairs + [(self.global_step, global_step)]

    def store_host(self) -> None:
        """Copies every DVariable's full value into the host mirror (before a save)."""
        for dvar, host in self._pairs():
            layout = dtensor.fetch_layout(dvar)
            full = dtensor.relayout(
                dvar.read_value(), dtensor.Layout.replicated(layout.mesh, dvar.shape.rank)
            )
            host.assign(dtensor.unpack(full)[0])

    def load_host(self) -> None:
        """Copies the host mirror into the DVariables, split by their layouts (after a restore)."""
        for dvar, host in self._pairs():
            layout = dtensor.fetch_layout(dvar)
            value = dtensor.copy_to_mesh(
                host.read_value(), dtensor.Layout.replicated(layout.mesh, dvar.shape.rank)
            )
            dvar.assign(dtensor.relayout(value, layout))

    # ------------------------------------------------------------------------------ batches
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

    # ---------------------------------------------------------------------------------- step
    def _forward(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list, FPropContext, dict]:
        ctx = FPropContext(training=True, step=self.global_step.read_value(), seed=self._seed)
        with tf.GradientTape() as tape:
            metrics = self.task.fprop(ctx, batch)
            if "loss" not in metrics:
                raise ConfigError(f"{type(self.task).__name__}.compute_loss must return a 'loss' entry")
            loss = metrics["loss"][0]
        grads = tape.gradient(loss, self._variables)
        grads = [
            None if g is None else dtensor.relayout(tf.convert_to_tensor(g), layout)
            for g, layout in zip(grads, self._layouts)
        ]
        values = {name: tf.cast(tf.reshape(value, []), tf.float32) for name, (value, _) in metrics.items()}
        return loss, grads, ctx, values

    def _loss_and_grads(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list]:
        loss, grads, _, _ = self._forward(batch)
        return loss, grads

    def loss_and_grads(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, list]:
        """Loss and gradients (in the variables' layouts) of one regular-tensor batch, no update."""
        with tracing.user_errors():
            return self._grads_fn(self.to_mesh(batch))

    def _one_step(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]:
        loss, grads, ctx, values = self._forward(batch)
        finite = tf.reduce_all(tf.math.is_finite(loss))
        clash = set(values) & set(RESERVED_SUMMARY_NAMES)
        if clash:
            raise ConfigError(
                f"{type(self.task).__name__}: metric name(s) {sorted(clash)} clash with the trainer's "
                "own summaries"
            )

        def apply() -> dict[str, tf.Tensor]:
            return self._apply(grads, ctx)

        if_finite = tf.cond(finite, apply, lambda: {k: tf.zeros([], tf.float32) for k in _LEARNER_OUTPUTS})
        return finite, {"task": values, "learner": if_finite}

    def run(self, num_steps: int) -> tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]:
        """Up to ``num_steps`` compiled steps, one batch copied onto the mesh before each; stops at the
        first non-finite loss (that step changes nothing). Outputs are regular (host) tensors."""
        finite, outputs = tf.constant(True), None
        with tracing.user_errors():
            for _ in range(int(num_steps)):
                batch = self.to_mesh(next(self.iterator))
                finite, outputs = self._step_fn(batch)
                finite = _host(finite)
                if not bool(finite.numpy()):
                    break
        return finite, tf.nest.map_structure(_host, outputs)

    def weights_finite(self) -> tf.Tensor:
        """Whether every float variable of the task is finite (a host tensor)."""
        return _host(self._weights_finite())

    @tf.function
    def _weights_finite(self) -> tf.Tensor:
        checks = [tf.reduce_all(tf.math.is_finite(v)) for v in self.task.variables if v.dtype.is_floating]
        return tf.reduce_all(tf.stack(checks))


class MeshCheckpointer(Checkpointer):
    """A ``Checkpointer`` of a ``MeshTrainStep`` writing and reading the plain format (module doc)."""

    def __init__(self, train_dir: str, max_to_keep: int, step: MeshTrainStep) -> None:
        task, learner, global_step = step.host_mirror()
        super().__init__(
            train_dir,
            max_to_keep,
            task=task,
            learner=learner,
            global_step=global_step,
            iterator=step.iterator,
        )
        self._step = step

    def restore_latest(self) -> str | None:
        path = super().restore_latest()
        if path is not None:
            self._step.load_host()
        return path

    def save(self, step: int) -> str:
        self._step.store_host()
        return super().save(step)


def make_checkpointer(train_dir: str, max_to_keep: int, step: TrainStep) -> Checkpointer:
    """The checkpointer of a train step: the task, learner, global step and input position."""
    if isinstance(step, MeshTrainStep):
        return MeshCheckpointer(train_dir, max_to_keep, step)
    return Checkpointer(
        train_dir,
        max_to_keep,
        task=step.task,
        learner=step.learner,
        global_step=step.global_step,
        iterator=step.iterator,
    )


_LEARNER_OUTPUTS = ("learning_rate", "grad_norm", "grad_scale")


def _host(x: Any) -> tf.Tensor:
    """A replicated DTensor's value as a regular tensor (its first component)."""
    try:
        return dtensor.unpack(x)[0]
    except (TypeError, ValueError, tf.errors.OpError):
        return x
