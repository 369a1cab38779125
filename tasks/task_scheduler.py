"""Task schedulers of a multi-task model: which task trains at each step (Lingvo's ``task_scheduler``).

Each scheduler gives the tasks' probabilities at a step; ``sample`` draws the step's task from them
with a stateless generator seeded by (random_seed, the scheduler's path, the global step), so the
choice is a function of the step and of what the checkpoint holds: a resumed run, or a rerun, chooses
as the uninterrupted one did. Lingvo's names and meaning:

- ``ConstantScheduler``: ``task_probs`` ``[(task, p), ...]``, fixed relative probabilities.
- ``ExponentialScheduler``: ``task_probs`` ``[(task, (p0, p1)), ...]`` and ``alpha``: each task's
  unnormalized probability ``p1 + (p0 - p1) * exp(-alpha * step)`` (from p0 towards p1).
- ``SigmoidScheduler``: ``p1 + (2 * p0 - p1) * exp(-alpha * step)``.
- ``RoundRobinScheduler``: ``tasks``, in sorted order, one per step.
- ``SimpleAdaptiveScheduler``: ``tasks``, ``expected`` (each task's expected final score), ``epsilon``,
  ``alpha``: a task with score ``s`` has ``1 + epsilon - min(1, s / expected) ** alpha``, so a task
  far from its expected score is trained more often. ``InverseRatioAdaptiveScheduler``:
  ``1 / (min(1, s / expected) ** alpha + epsilon)``.

The adaptive schedulers' scores differ from Lingvo's in where they come from: Lingvo reads each task's
last dev score from the evaler's metric history file; here a task's score is the moving average
(``decay``) of its training ``metric`` (every task's forward pass runs each step, on its own batch),
kept in a variable of the checkpoint, so the choices resume exactly and do not depend on when an
evaler ran.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext, stateless_seed, weight_init_params, weight_params
from params.errors import ConfigError
from params.hyperparams import InstantiableParams

# The per-task metrics a scheduler sees at a step: {task: {metric: (value, weight)}}.
TaskMetrics = dict[str, dict[str, tuple[tf.Tensor, tf.Tensor]]]


class TaskScheduler(BaseLayer):
    """Base: ``probs(ctx, tasks)`` and the step's ``sample``; ``observe`` sees each step's metrics."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.name = "task_schedule"
        return p

    def tasks(self) -> list[str]:
        """The task names this scheduler chooses among."""
        raise NotImplementedError(f"{type(self).__name__}.tasks")

    def unnormalized(self, ctx: FPropContext) -> tf.Tensor:
        """[len(tasks())] float32 weights at ``ctx.step``, in ``tasks()`` order."""
        raise NotImplementedError(f"{type(self).__name__}.unnormalized")

    def probs(self, ctx: FPropContext, tasks: list[str]) -> tf.Tensor:
        """[len(tasks)] float32 probabilities at ``ctx.step``, in the order of ``tasks``."""
        mine = self.tasks()
        weights = self.unnormalized(ctx)
        ordered = tf.stack([weights[mine.index(name)] for name in tasks])
        return ordered / tf.reduce_sum(ordered)

    def sample(self, ctx: FPropContext, probs: tf.Tensor) -> tf.Tensor:
        """The index (int32 scalar) of the step's task, drawn from ``probs``, seeded by the step."""
        seed = stateless_seed(self.params.random_seed, self.path, ctx.step)
        logits = tf.math.log(tf.maximum(probs, 1e-30))[tf.newaxis]
        return tf.cast(tf.random.stateless_categorical(logits, 1, seed)[0, 0], tf.int32)

    def observe(self, ctx: FPropContext, metrics: TaskMetrics) -> None:
        """Sees the step's per-task metrics (training only). Default: nothing."""
        del ctx, metrics

    def check_tasks(self, where: str, tasks: list[str]) -> None:
        """ConfigError unless this scheduler names exactly ``tasks``."""
        mine = self.tasks()
        if sorted(mine) != sorted(tasks) or len(set(mine)) != len(mine):
            raise ConfigError(
                f"{where}: {type(self).__name__} names tasks {sorted(mine)}, the model has {sorted(tasks)}"
            )


class ShiftedExponentialScheduler(TaskScheduler):
    """Each task's unnormalized probability is ``a + b * exp(-alpha * step)`` (subclasses say a, b)."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("alpha", 0.0, "How fast the schedule moves towards its final values (per step).")
        p.define(
            "task_probs",
            [],
            "[(task, prob)], or for the non-constant schedules [(task, (initial_prob, final_prob))].",
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._descriptors = []
        for entry in self.params.task_probs:
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], str)):
                raise ConfigError(f"{self.path}.task_probs: expected (task, prob) pairs, got {entry!r}")
            self._descriptors.append(self.descriptor(entry[0], entry[1]))
        if not self._descriptors:
            raise ConfigError(f"{self.path}.task_probs: no task")

    def descriptor(self, task: str, value: Any) -> tuple[float, float]:
        raise NotImplementedError

    def _pair(self, task: str, value: Any) -> tuple[float, float]:
        if not (isinstance(value, (list, tuple)) and len(value) == 2):
            raise ConfigError(
                f"{self.path}.task_probs: task {task!r} needs (initial_prob, final_prob), got {value!r}"
            )
        return float(value[0]), float(value[1])

    def tasks(self) -> list[str]:
        return [task for task, _ in self.params.task_probs]

    def unnormalized(self, ctx: FPropContext) -> tf.Tensor:
        decay = tf.exp(-float(self.params.alpha) * tf.cast(ctx.step, tf.float32))
        return tf.stack([a + b * decay for a, b in self._descriptors])


class ConstantScheduler(ShiftedExponentialScheduler):
    """Tasks drawn from fixed relative probabilities ``task_probs``: ``[(task, prob)]``."""

    def descriptor(self, task: str, value: Any) -> tuple[float, float]:
        if not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(
                f"{self.path}.task_probs: task {task!r} needs a probability >= 0, got {value!r}"
            )
        return float(value), 0.0


class ExponentialScheduler(ShiftedExponentialScheduler):
    """``p1 + (p0 - p1) * exp(-alpha * step)`` for ``task_probs`` ``[(task, (p0, p1))]``."""

    def descriptor(self, task: str, value: Any) -> tuple[float, float]:
        p0, p1 = self._pair(task, value)
        return p1, p0 - p1


class SigmoidScheduler(ShiftedExponentialScheduler):
    """``p1 + (2 * p0 - p1) * exp(-alpha * step)`` for ``task_probs`` ``[(task, (p0, p1))]``."""

    def descriptor(self, task: str, value: Any) -> tuple[float, float]:
        p0, p1 = self._pair(task, value)
        return p1, 2 * p0 - p1


class RoundRobinScheduler(TaskScheduler):
    """The ``tasks``, sorted, one after the other: step s trains ``sorted(tasks)[s % len(tasks)]``."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("tasks", [], "Task names (no repetitions).")
        return p

    def tasks(self) -> list[str]:
        return sorted(self.params.tasks)

    def unnormalized(self, ctx: FPropContext) -> tf.Tensor:
        n = len(self.tasks())
        return tf.one_hot(tf.cast(ctx.step % n, tf.int32), n)

    def sample(self, ctx: FPropContext, probs: tf.Tensor) -> tf.Tensor:
        return tf.cast(tf.argmax(probs), tf.int32)


class AdaptiveScheduler(TaskScheduler):
    """Tasks with low scores (relative to ``expected``) are drawn more often; scores >= 0, larger is
    better. A task's score: the moving average of its training ``metric`` (see the module doc)."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("tasks", [], "Task names.")
        p.define("expected", [], "Each task's expected final score, in the order of tasks.")
        p.define("epsilon", 0.05, "Regularization: a larger epsilon gives a more uniform choice.")
        p.define("alpha", 1.0, "Normalized scores are raised to this power.")
        p.define("metric", "accuracy", "The training metric every task reports that is its score.")
        p.define("decay", 0.99, "Decay of the scores' moving average, per step.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        if len(p.tasks) != len(p.expected) or not p.tasks:
            raise ConfigError(f"{self.path}: tasks {p.tasks} and expected {p.expected} need one entry each")
        if p.epsilon < 0:
            raise ConfigError(f"{self.path}.epsilon must be >= 0, got {p.epsilon}")
        if any(e <= 0 for e in p.expected):
            raise ConfigError(f"{self.path}.expected: scores must be > 0, got {p.expected}")
        if not 0.0 <= p.decay < 1.0:
            raise ConfigError(f"{self.path}.decay must be in [0, 1), got {p.decay}")
        self.create_variable(
            "scores",
            weight_params(
                [len(p.tasks)], init=weight_init_params("constant", 0.0), dtype=tf.float32, trainable=False
            ),
        )

    def tasks(self) -> list[str]:
        return list(self.params.tasks)

    def normalized_scores(self) -> tf.Tensor:
        expected = tf.constant([float(e) for e in self.params.expected], tf.float32)
        return tf.minimum(1.0, self.vars["scores"] / expected) ** float(self.params.alpha)

    def observe(self, ctx: FPropContext, metrics: TaskMetrics) -> None:
        metric = self.params.metric
        values = []
        for task in self.tasks():
            if metric not in metrics[task]:
                raise ConfigError(
                    f"{self.path}.metric: task {task!r} reports no {metric!r} (it has "
                    f"{', '.join(sorted(metrics[task]))})"
                )
            values.append(tf.cast(tf.reshape(metrics[task][metric][0], []), tf.float32))
        ctx.add_update(self, "scores", tf.stack(values), 1.0)

    def apply_update(self, name: str, value: tf.Tensor) -> None:
        decay = float(self.params.decay)
        scores = self.vars["scores"]
        scores.assign(decay * scores + (1.0 - decay) * tf.cast(value, tf.float32))


class SimpleAdaptiveScheduler(AdaptiveScheduler):
    """A task with normalized score ``s`` weighs ``1 + epsilon - s``."""

    def unnormalized(self, ctx: FPropContext) -> tf.Tensor:
        return 1.0 + float(self.params.epsilon) - self.normalized_scores()


class InverseRatioAdaptiveScheduler(AdaptiveScheduler):
    """A task with normalized score ``s`` weighs ``1 / (s + epsilon)``."""

    def unnormalized(self, ctx: FPropContext) -> tf.Tensor:
        return 1.0 / tf.maximum(self.normalized_scores() + float(self.params.epsilon), 1e-6)
