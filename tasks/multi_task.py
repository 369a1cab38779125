"""Multi-task models (Lingvo's ``MultiTaskModel``): several tasks, layers shared by name, a scheduler.

A ``MultiTaskModel`` is a task whose children are tasks, one per entry of ``task_params`` (built in
sorted order), and a ``task_schedule`` (``tasks/task_scheduler.py``; None: a ConstantScheduler over
``task_probs``, as in Lingvo). Children named in ``share_layers`` (say ``body``) are one layer for
every task that has them: built by the first task (in sorted order) and given to the others, whose own
Params for it must equal the first's.

Its batch is a NestedMap of the tasks' batches (``batch.digit``, ``batch.parity``), from a
``MultiTaskInput`` whose ``tasks`` hold one input per task. A training step runs every task's forward
pass on its batch, draws the step's task from the scheduler (seeded by the global step) and trains on
that task's loss alone: the other tasks' gradients are zero, and their metrics are still reported, so
TensorBoard has every task's training curves (``<task>/loss``, ``<task>/accuracy``, ...) beside the
scheduler's ``task_schedule/prob_<task>`` and ``task_schedule/task`` (the index of the step's task
among the sorted names). One learner, this model's ``train``, updates the union of the tasks'
variables (Lingvo keeps one per task); the tasks' own ``train`` settings are not used.

Evaluation, decoding and export are per task (trainer/launcher.py): a job ``evaler_<dataset>`` runs one
evaler per task over the task's input of that data set, writing ``eval_<dataset>_<task>/`` (Lingvo's
directory names, where an evaler ran with ``--model_task_name=<task>``); ``decoder_<dataset>`` likewise
for the tasks that decode; ``inference()`` gives each task's signatures under the task's name.

``MultiTaskExperiment`` is the experiment base (Lingvo's ``MultiTaskModelParams``): ``Model()`` or
``task()`` returns the MultiTaskModel's Params; each data set method returns Params with one input per
task (Lingvo's form), which it wraps in a MultiTaskInput.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext
from layers.nested_map import NestedMap
from params.errors import ConfigError
from params.experiment import Experiment
from params.hyperparams import InstantiableParams, Params
from tasks import base_task, task_scheduler
from tasks.base_input import BaseInput


class MultiTaskModel(base_task.BaseTask):
    """Tasks sharing layers by name, trained one per step as ``task_schedule`` draws them."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.name = "multi_task"
        p.define("task_params", Params(), "One task Params per task name.")
        p.define(
            "task_probs",
            Params(),
            "Task name -> relative probability of training it at a step (used when task_schedule is None).",
        )
        p.define(
            "task_schedule",
            None,
            "A task scheduler's Params (tasks/task_scheduler.py); None: a ConstantScheduler over task_probs.",
            value_type=Params,
        )
        p.define(
            "share_layers",
            [],
            "Names of task children that are one layer for every task having them (e.g. ['body']).",
        )
        p.define(
            "model_task_name",
            "",
            "'' draws a task per step from task_schedule; a task's name trains only that task. The "
            "trainer's --model_task_name sets it for its own run (not in params.txt).",
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        names = sorted(p.task_params.names())
        if not names:
            raise ConfigError(f"{self.path}.task_params: no task (define one Params per task name)")
        for name in names:
            task_p = p.task_params.get(name)
            if not (isinstance(task_p, InstantiableParams) and issubclass(task_p.cls, base_task.BaseTask)):
                raise ConfigError(f"{self.path}.task_params.{name}: expected a task's Params (a BaseTask)")
        if p.model_task_name and p.model_task_name not in names:
            raise ConfigError(
                f"--model_task_name={p.model_task_name}: no such task; {self.path} has {', '.join(names)}"
            )
        self._task_names = names
        shared: dict[str, BaseLayer] = {}
        for name in names:
            task = self.create_child(name, p.task_params.get(name))
            for layer_name in p.share_layers:
                self._share(task, layer_name, shared)
        schedule = p.task_schedule
        if schedule is None:
            probs = p.task_probs
            missing = [n for n in names if n not in probs.names()]
            if missing or set(probs.names()) - set(names):
                raise ConfigError(
                    f"{self.path}.task_probs: expected one probability per task ({', '.join(names)}), "
                    f"got {', '.join(probs.names()) or 'none'}"
                )
            schedule = task_scheduler.ConstantScheduler.Params().set(
                task_probs=[(n, probs.get(n)) for n in names]
            )
        self.create_child("task_schedule", schedule)
        if not isinstance(self.task_schedule, task_scheduler.TaskScheduler):
            raise ConfigError(f"{self.path}.task_schedule: expected a TaskScheduler's Params")
        self.task_schedule.check_tasks(f"{self.path}.task_schedule", names)

    def _share(self, task: BaseLayer, layer_name: str, shared: dict[str, BaseLayer]) -> None:
        if layer_name not in task.children():
            return
        mine = task.children()[layer_name]
        if layer_name not in shared:
            shared[layer_name] = mine
            return
        first = shared[layer_name]
        if not isinstance(mine, BaseLayer) or mine.params.to_text() != first.params.to_text():
            raise ConfigError(
                f"{task.path}/{layer_name}: share_layers shares {layer_name!r} with {first.path}, but its "
                "Params differ; layers shared by name need equal Params"
            )
        setattr(task, layer_name, first)  # the task computes with the first task's layer and weights

    # ------------------------------------------------------------------------------- the tasks
    @property
    def task_names(self) -> list[str]:
        """The tasks' names, sorted (Lingvo's ``task_names``)."""
        return list(self._task_names)

    @property
    def tasks(self) -> list[base_task.BaseTask]:
        return [getattr(self, name) for name in self._task_names]

    def get_task(self, name: str) -> base_task.BaseTask:
        """The task ``name`` (Lingvo's ``GetTask``)."""
        if name not in self._task_names:
            raise ConfigError(f"{self.path}: no task {name!r}; it has {', '.join(self._task_names)}")
        return getattr(self, name)

    GetTask = get_task  # noqa: N815 (Lingvo's name)

    # ---------------------------------------------------------------------------- computation
    def fprop(self, ctx: FPropContext, batch: dict[str, Any]) -> base_task.Metrics:
        """Every trained task's metrics on its batch; ``loss`` is the step's task's (training) or the
        tasks' mean (evaluation)."""
        only = self.params.model_task_name
        names = [only] if only else self._task_names
        for name in names:
            if name not in batch:
                raise ConfigError(
                    f"{self.path}: the batch has no {name!r} (it has {', '.join(sorted(batch))}); a "
                    "multi-task model's input is a MultiTaskInput with one input per task"
                )
        per_task = {name: self.get_task(name).fprop(ctx, batch[name]) for name in names}
        losses = tf.stack([tf.cast(tf.reshape(per_task[n]["loss"][0], []), tf.float32) for n in names])
        metrics: base_task.Metrics = {}
        one = tf.constant(1.0)
        if ctx.training and not only:
            probs = self.task_schedule.probs(ctx, names)
            choice = self.task_schedule.sample(ctx, probs)
            loss = tf.reduce_sum(tf.stop_gradient(tf.one_hot(choice, len(names))) * losses)
            self.task_schedule.observe(ctx, per_task)
            metrics["task_schedule/task"] = (tf.cast(choice, tf.float32), one)
            for i, name in enumerate(names):
                metrics[f"task_schedule/prob_{name}"] = (probs[i], one)
        else:
            loss = tf.reduce_mean(losses)
        metrics["loss"] = (loss, one)
        for name in names:
            for metric, value in per_task[name].items():
                metrics[f"{name}/{metric}"] = value
        return metrics

    def decode(self, ctx: FPropContext, batch: dict[str, Any]) -> dict[str, tf.Tensor]:
        raise ConfigError(
            f"{self.path}: a multi-task model decodes per task (decoder_<dataset> runs each task's decode)"
        )

    def inference(self, input_generator: Any) -> dict[str, Any]:
        """Each task's serving functions under its name (``<task>``, ``<task>_<name>``);
        ``serving_default`` is the first task's (sorted names) that has one."""
        functions: dict[str, Any] = {}
        for name in self._task_names:
            task = self.get_task(name)
            try:
                own = task.inference(input_generator.task_input(name))
            except NotImplementedError:
                continue
            for signature, function in own.items():
                functions[name if signature == "serving_default" else f"{name}_{signature}"] = function
                if signature == "serving_default":
                    functions.setdefault("serving_default", function)
        if not functions:
            raise NotImplementedError(f"no task of {type(self).__name__} has an inference() to export")
        return functions


def is_multi_task(task_params: Params) -> bool:
    """Whether ``task_params`` are a MultiTaskModel's."""
    cls = task_params.get("cls") if "cls" in task_params else None
    return isinstance(cls, type) and issubclass(cls, MultiTaskModel)


def task_names(task_params: Params) -> list[str]:
    """The sorted task names of a MultiTaskModel's Params."""
    return sorted(task_params.task_params.names())


# ------------------------------------------------------------------------------------------ input
class MultiTaskInput(BaseInput):
    """One input per task (``tasks.<name>``): each batch is a NestedMap ``{task: that task's batch}``,
    every task's next batch at every step, so the input's position is a function of the step. Its own
    ``batch_size`` counts one step's examples, all tasks together (the progress line's examples/s);
    reading, shuffling and batching are each task input's own settings."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("tasks", Params(), "One input Params per task name.")
        p.batch_size = 1
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        names = sorted(self.params.tasks.names())
        if not names:
            raise ConfigError(f"input {self.params.name!r}: tasks holds no input")
        self._inputs = {}
        for name in names:
            p = self.params.tasks.get(name)
            if not isinstance(p, InstantiableParams):
                raise ConfigError(f"input {self.params.name!r}: tasks.{name} is not an input's Params")
            self._inputs[name] = p.instantiate()

    def task_input(self, name: str) -> BaseInput:
        """The input of task ``name``."""
        if name not in self._inputs:
            raise ConfigError(
                f"input {self.params.name!r} has no input for task {name!r}; it has {', '.join(self._inputs)}"
            )
        return self._inputs[name]

    def shard(self, index: int, count: int) -> None:
        for task_input in self._inputs.values():
            task_input.shard(index, count)
        self._shard = (index, count)

    def files_to_keep(self) -> list[str]:
        return sorted({path for task_input in self._inputs.values() for path in task_input.files_to_keep()})

    def inspect(self) -> str:
        return "".join(task_input.inspect() for task_input in self._inputs.values())

    def dataset(self, by_row: bool = True) -> tf.data.Dataset:
        return tf.data.Dataset.zip(NestedMap({n: i.dataset(by_row) for n, i in self._inputs.items()}))


def multi_task_input(name: str, inputs: Params) -> InstantiableParams:
    """A MultiTaskInput's Params over ``inputs`` (Params with one input Params per task);
    ``batch_size`` is the examples of one step, all tasks together."""
    p = MultiTaskInput.Params()
    p.name = name
    p.tasks = inputs.copy()
    p.batch_size = sum(int(inputs.get(n).batch_size) for n in inputs.names()) or 1
    return p


class MultiTaskExperiment(Experiment):
    """Base of multi-task experiments (Lingvo's ``base_model_params.MultiTaskModelParams``).

    ``task()`` (or Lingvo's ``Model()``) returns a MultiTaskModel's Params; each data set method returns
    Params with one input Params per task (Lingvo's form) or a MultiTaskInput's Params."""

    MULTI_TASK = True

    def dataset(self, name: str) -> Params:
        p = super().dataset(name)
        if isinstance(p, InstantiableParams):
            return p
        return multi_task_input(name, p)

    def task(self) -> Params:
        raise ConfigError(f"{type(self).__name__} must define Model() or task(): the MultiTaskModel's Params")
