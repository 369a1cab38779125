"""The compiled training step, and a loop of them in one ``tf.function`` call.

One step: next batch from the train iterator; ``ctx = FPropContext(training=True, step=global_step,
seed=task.params.random_seed)``; ``metrics = task.fprop(ctx, batch)``; gradients of ``metrics['loss']``;
``learner.apply_gradients``; ``ctx.apply_updates()`` (batch-norm statistics); ``global_step += 1``.

``run(n)`` runs up to ``n`` steps inside one ``tf.function`` call (a ``tf.while_loop``), so the Python
cost of a call is paid once per ``n`` steps; the host only looks at the results at the end of the call.
A step whose loss is NaN or Inf changes nothing (no update, no step increment) and ends the loop, so
the weights stay those of the last good step and the caller can refuse to save them.

What a step computes is written here once; where it runs is its placement (trainer/placement.py):
the caller's device, sync replicas (this worker's input shard, the loop in the strategy's replica
context, gradients and metrics averaged over the replicas before they are applied), parameter
servers (trainer/distributed/parameter_servers.py: steps dispatched to the trainers) or a DTensor mesh
(trainer/distributed/mesh_placement.py: a Python loop of compiled steps, each batch copied onto the mesh).
"""

from __future__ import annotations

import tensorflow as tf

from layers import tf_compat
from layers.base_layer import FPropContext
from params.errors import ConfigError
from params.hyperparams import Params
from tasks import loss_scale as loss_scale_lib
from trainer import tracing
from trainer.placement import OnDevice, Placement, StepFunctions, StepOutputs, TrainState

# Names the trainer writes next to the task's metrics in train summaries.
RESERVED_SUMMARY_NAMES = ("steps_per_sec", "examples_per_sec")


class TrainStep:
    """The task, its learner, the global step and the train input iterator, and the compiled step,
    built and run where ``placement`` says (trainer/placement.py; default: the caller's device)."""

    def __init__(self, task_params: Params, input_params: Params, placement: Placement | None = None) -> None:
        self.placement: Placement = placement or OnDevice()
        placement = self.placement
        with placement.scope():
            self.task = placement.build_task(task_params)
            self.input = input_params.instantiate()
            self.input.shard(*placement.shard())
            self.iterator = iter(self.input.dataset())
            self.global_step = placement.global_step()
            self._variables = list(self.task.trainable_variables)
            if not self._variables:
                raise ConfigError(f"task {task_params.cls.__name__} has no trainable variables")
            self.learner = placement.build_learner(task_params.train, self._variables)
            self.loss_scale = self._build_loss_scale(task_params)
        self._seed = self.task.params.random_seed
        self._task_params = task_params
        self.traced_step, self.zero_outputs = self._trace_step()
        self.functions = StepFunctions(
            run_steps=self.run_steps,
            guarded_step=self.guarded_step,
            zero_outputs=self.zero_outputs,
            next_batch=self._next_batch,
            dataset=self.input.dataset,
            release_trace=self._release_trace,
            step_graph=self.step_graph,
            batch_size=self.batch_size,
        )
        self._run = placement.compile(self.functions)
        self._weights_finite = tracing.graph_function(self._all_finite)
        self._grads = tracing.graph_function(self._loss_and_grads)

    def _build_loss_scale(self, task_params: Params) -> loss_scale_lib.LossScale | None:
        """mixed_float16's loss scale, held by the learner (so the checkpoint has it); else None."""
        if (task_params.get("precision") if "precision" in task_params else None) != "mixed_float16":
            return None
        if type(self.placement) is not OnDevice:
            raise ConfigError(
                f"task.precision 'mixed_float16' (loss scaling) runs in one process only, not under the "
                f"{type(self.placement).__name__} placement; use mixed_bfloat16"
            )
        self.learner.loss_scale = loss_scale_lib.LossScale()
        return self.learner.loss_scale

    @property
    def batch_size(self) -> int:
        return int(self.input.params.batch_size)

    def state(self) -> TrainState:
        """What a checkpoint of this step holds (the input iterator as it is now)."""
        return TrainState(self.task, self.learner, self.global_step, self.iterator)

    def skip_to(self, step: int) -> None:
        """Moves the input, still at its start, to the batch of ``step``: a resumed run whose
        checkpoint holds no iterator (sync replicas, a mesh across processes: the position is a
        function of the step). The iterator advances in place, so it stays the one the checkpointer
        saves (its next save holds this position, restorable into the same input pipeline) and the
        one the compiled loop reads. An input that ends first is left at its end (the first step
        then reports it)."""
        try:
            _advance(self.iterator, tf.constant(step, tf.int64))
        except tf.errors.OutOfRangeError:
            pass

    def run(self, num_steps: int) -> StepOutputs:
        """Runs up to ``num_steps`` steps; returns (all losses finite, outputs of the last step run).

        Outputs are ``{'task': {metric: value}, 'learner': {name: value}}`` scalars, not fetched.
        """
        with tracing.user_errors():
            return self._run(int(num_steps))

    # ----------------------------------------------------------------------------------- the step
    def _forward_backward(self, batch: dict | None = None) -> tuple[tf.Tensor, list, FPropContext, dict]:
        batch = next(self.iterator) if batch is None else batch
        step = self.global_step.read_value()
        ctx = FPropContext(training=True, step=step, seed=self._seed)
        with tf.GradientTape() as tape:
            metrics = self.task.fprop(ctx, batch)
            if "loss" not in metrics:
                raise ConfigError(f"{type(self.task).__name__}.compute_loss must return a 'loss' entry")
            loss = metrics["loss"][0]
            target = loss if self.loss_scale is None else self.loss_scale.scaled(loss)
        grads = tape.gradient(target, self._variables)
        if self.loss_scale is not None:
            grads = self.loss_scale.unscaled(grads)
        values = {name: tf.cast(tf.reshape(value, []), tf.float32) for name, (value, _) in metrics.items()}
        loss, grads, values = self.placement.reduce(loss, grads, values, self._variables)
        return loss, grads, ctx, values

    def _apply(self, grads: list, ctx: FPropContext, finite: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        """One update and the learner's scalars. ``finite`` None: unconditional (the placement's
        ``update_if`` runs it under one ``tf.cond``); else each variable changes only where it is true
        (a placement over several meshes) and a skipped step's scalars are zeros."""
        if finite is not None and ctx.updates:
            raise ConfigError(
                f"{type(self.task).__name__}: layers that update state in the forward pass (batch "
                f"statistics) are not supported by the {type(self.placement).__name__} placement"
            )
        step = self.global_step.read_value()
        guard = finite
        if self.loss_scale is not None:  # a step with non-finite gradients changes no weight or slot
            grads_finite = self.loss_scale.all_finite(grads)
            guard = grads_finite if finite is None else tf.logical_and(finite, grads_finite)
        out = self.learner.apply_gradients(zip(grads, self._variables), step, finite=guard)
        ctx.apply_updates()
        self.global_step.assign_add(1 if finite is None else tf.cast(finite, tf.int64))
        values = {name: tf.cast(tf.reshape(value, []), tf.float32) for name, value in out.items()}
        if finite is None:
            return values
        return {name: tf.where(finite, value, 0.0) for name, value in values.items()}

    def _trace_step(self) -> tuple[tf.types.experimental.ConcreteFunction, dict]:
        """One step traced and not yet run, and zeros shaped like its outputs (the loop's initial
        value and a skipped step's result). A placement whose loop runs in the context the step was
        traced in (``OnDevice.compile``) loops this traced step rather than tracing it again: for a
        GPipe model, tracing is most of the time a trainer takes to start."""
        # The step takes its gradients inside: TensorFlow's registry of its custom gradients (a
        # pipeline's) need not keep the trace alive once nothing else does (layers/tf_compat.py).
        with tracing.user_errors(), tf_compat.custom_gradients_released():
            if self.placement.traces_on_batch:  # a first batch of a pipeline of its own: the iterator stays
                batch = self.placement.to_device(next(iter(self.input.dataset())))
                traced = tracing.graph_function(self.guarded_step).get_concrete_function(batch)
            else:  # the iterator is an argument: the loop passes the one set when it is traced
                traced = tracing.graph_function(self._step_on).get_concrete_function(self.iterator)
        spec = traced.structured_outputs[1]
        clash = set(spec["task"]) & (set(spec["learner"]) | set(RESERVED_SUMMARY_NAMES))
        if clash:
            raise ConfigError(
                f"{type(self.task).__name__}: metric name(s) {sorted(clash)} clash with the trainer's "
                "own summaries"
            )
        return traced, tf.nest.map_structure(lambda t: tf.zeros([], t.dtype), spec)

    def guarded_step(self, batch: dict | None = None) -> tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]:
        """One step on ``batch`` (None: the next from ``iterator``): (loss finite, outputs); a step
        whose loss is not finite changes nothing. Async training schedules this on the workers."""
        loss, grads, ctx, values = self._forward_backward(batch)
        finite = tf.reduce_all(tf.math.is_finite(loss))
        learner_out = self.placement.update_if(finite, lambda guard: self._apply(grads, ctx, guard))
        if self.loss_scale is not None:  # lowered after non-finite gradients, raised after a good run
            learner_out = {**learner_out, **self.loss_scale.update(self.loss_scale.all_finite(grads))}
        return finite, {"task": values, "learner": learner_out}

    def _next_batch(self) -> dict:
        return next(self.iterator)

    def _release_trace(self) -> None:
        self.traced_step = None

    def _step_on(self, iterator: tf.data.Iterator) -> tuple[tf.Tensor, dict[str, dict[str, tf.Tensor]]]:
        return self.guarded_step(next(iterator))

    def run_steps(self, num_steps: tf.Tensor, traced: bool = False) -> StepOutputs:
        """Up to ``num_steps`` steps in one tf.while_loop (a placement compiles it), stopping after
        the first whose loss is not finite. ``traced``: loop the step traced at construction (the
        loop is traced in the same context, e.g. not in a replica's) on ``self.iterator`` as it is
        when the loop is traced, else trace the step in the loop."""
        traced_step = self.traced_step
        one_step = (lambda: traced_step(self.iterator)) if traced else self.guarded_step

        def cond(i, finite, outputs):
            return tf.logical_and(i < num_steps, finite)

        def body(i, finite, outputs):
            finite, outputs = one_step()
            return i + 1, finite, outputs

        _, finite, outputs = tf.while_loop(
            cond, body, (tf.constant(0), tf.constant(True), self.zero_outputs), parallel_iterations=1
        )
        return finite, outputs

    def loss_and_grads(self, batch: dict) -> tuple[tf.Tensor, list]:
        """Loss and gradients of one host batch, updating nothing (compiled where the step runs)."""
        with tracing.user_errors():
            return self._grads(self.placement.to_device(batch))

    def _loss_and_grads(self, batch: dict) -> tuple[tf.Tensor, list]:
        loss, grads, _, _ = self._forward_backward(batch)
        return loss, grads

    def step_graph(self) -> tf.Graph:
        """The graph of one training step on the next train batch (forward, backward, update),
        traced and never run: for looking at what a step computes and where."""

        def one_step() -> tf.Tensor:
            loss, grads, ctx, _ = self._forward_backward()
            self._apply(grads, ctx)
            return loss

        with tracing.user_errors():
            return tracing.graph_function(one_step).get_concrete_function().graph

    def gradients_function(self):
        """A compiled forward and backward pass on the next train batch that updates nothing: returns
        (loss, gradients). For looking at a step (profiling), not for training."""

        def forward_backward() -> tuple[tf.Tensor, list]:
            with tracing.user_errors():
                loss, grads, _, _ = self._forward_backward()
            return loss, [g for g in grads if g is not None]

        return tracing.graph_function(forward_backward)

    # ---------------------------------------------------------------------------------- checks
    def weights_finite(self) -> tf.Tensor:
        """Whether every float variable of the task is finite (checked before each save; a host
        tensor)."""
        return self.placement.host(self._weights_finite())

    def _all_finite(self) -> tf.Tensor:
        home = self.placement.home_scalar
        checks = [
            home(tf.reduce_all(tf.math.is_finite(v))) for v in self.task.variables if v.dtype.is_floating
        ]
        return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def _drop_batches(iterator: tf.data.Iterator, num_batches: tf.Tensor) -> tf.Tensor:
    """Reads and drops ``num_batches`` batches of ``iterator``; returns how many."""

    def body(i: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies(tf.nest.flatten(iterator.get_next())):
            return i + 1

    return tf.while_loop(lambda i: i < num_batches, body, [tf.constant(0, tf.int64)])[0]


_advance = tracing.graph_function(_drop_batches)  # one call, not one per batch
