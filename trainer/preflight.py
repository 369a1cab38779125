"""What a run would refuse, checked before anything is written: one validation for
``--mode=inspect_params`` and training alike.

``check(root)`` runs after ``experiment.resolve`` (types, keys, task_overrides) and adds what only the
objects know: the learner's enum values and cross-field rules (``tasks.learner.validate``), each input's
settings (its constructor), and the model itself: the task is built on the host CPU (its variables
are created, so every layer checks its settings) and its forward pass is traced once on the train
input's batch signature (so a layer whose ``input_dim`` does not match its input is found), all before
the launcher creates the logdir. A refusal is one ConfigError line naming the param's full key.

``finished(root, logdir, jobs)`` says, in one line, that a run asked to go on is already over (its
last checkpoint at max_steps, every job in this process done), so a rerun writes nothing.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import tensorflow as tf
from absl import logging

from layers.base_layer import FPropContext
from params import experiment, text_format, text_tree
from params.errors import ConfigError, UserError
from params.hyperparams import Params
from tasks import learner
from tasks.base_task import BaseTask
from trainer import checkpointer, files, tf_settings, tracing

SHOWN = 3  # keys named when several hold the refused value


def check(root: Params, *, build: bool = True, report: bool = True) -> None:
    """Raises ConfigError for anything the jobs would refuse. ``build=False`` (a cluster process,
    whose strategy must be made before TensorFlow starts): only the checks that need no TensorFlow.
    ``report=False`` (a mode that builds the task again): the layers' information lines while the
    task is built here (a GPipe layer's partition table) are left to that build, so they show once."""
    task_cls = root.task.get("cls") if "cls" in root.task.names() else None
    if not (isinstance(task_cls, type) and issubclass(task_cls, BaseTask)):
        return  # not a task of this project (a stand-in of the params tests): nothing to build
    try:
        learner.validate(root.task.train)
        if not build:
            return
        tf_settings.configure(root.cluster)
        for name in root.input.names():
            root.input.get(name).instantiate()
        with tf.device("/CPU:0"), contextlib.nullcontext() if report else _warnings_only():
            _trace_forward(root)
    except ValueError as e:  # TensorFlow's shape errors while tracing: the model does not fit its input
        if isinstance(e, ConfigError):
            raise ConfigError(name_the_key(root, str(e))) from None
        detail = next((line.strip() for line in str(e).splitlines() if "Error:" in line), str(e).strip())
        raise ConfigError(f"the task's forward pass does not fit its input: {detail[:500]}") from None
    except ConfigError as e:
        raise ConfigError(name_the_key(root, str(e))) from None


@contextlib.contextmanager
def _warnings_only() -> Iterator[None]:
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.WARNING)
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)


def _trace_forward(root: Params) -> None:
    """Builds the task of the first data set (train if there is one) and traces one forward pass on
    its input's batch signature: nothing runs, no data is read beyond the input's set-up."""
    names = root.input.names()
    if not names:
        return
    dataset = "train" if "train" in names else names[0]
    task = experiment.task_params_for(root, dataset).instantiate()
    spec = root.input.get(dataset).instantiate().dataset().element_spec
    seed = task.params.random_seed

    def forward(batch: dict) -> object:
        step = tf.constant(0, tf.int64)
        return task.fprop(FPropContext(training=True, step=step, seed=seed), batch)

    with tracing.user_errors():
        tracing.graph_function(forward).get_concrete_function(spec)


def name_the_key(root: Params, message: str) -> str:
    """``message`` prefixed with the full key(s) of the param it is about, when it names none (a
    layer says ``task/body/bn0: params.decay ...`` or ``unknown activation 'relux'``): the task
    params whose value the message shows (and whose name it gives, if it gives one)."""
    if re.search(r"(?<![\w/])(task|input|cluster)\.\w", message):
        return message
    names = set(re.findall(r"params\.(\w+)", message)) | set(re.findall(r"\b(\w+)=", message))
    keys = []
    for key, value in root.task:
        if names and key.rsplit(".", 1)[-1].split("[")[0] not in names:
            continue
        if isinstance(value, (Params, list, tuple, dict, type)) or value is None or isinstance(value, bool):
            continue
        shown = text_format.format_value(value)
        if re.search(rf"(?<![\w.]){re.escape(shown)}(?![\w.])", message):
            keys.append(f"task.{key}")
    if not keys:
        return message
    named = ", ".join(repr(k) for k in keys[:SHOWN]) + (
        f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    )
    return f"param {named}: {message}"


def finished(root: Params, logdir: str, jobs: list[str]) -> str | None:
    """One line if the run in ``logdir`` is over for ``jobs`` and would only write files again: the
    same Params as its params.txt, its last checkpoint at ``task.train.max_steps``, and every evaler
    and decoder among ``jobs`` done with it. None otherwise (then the launcher runs as usual)."""
    try:
        written = files.read_text(files.join(logdir, "params.txt"))
        if written is None or not text_tree.same(written, root.to_text()):
            return None  # a new run, or changed Params: the logdir guard decides
        listed = checkpointer.list_checkpoints(files.join(logdir, "train"))
    except UserError:
        return None  # an unreadable logdir: the launcher says why, in its words
    max_steps = int(root.task.train.max_steps)
    if not listed or listed[-1][0] < max_steps:
        return None
    from trainer.multi_task_jobs import model_tasks  # a multi-task model's jobs write one directory per task

    for job in jobs:
        kind, _, dataset = job.partition("_")
        directory = {"evaler": "eval", "decoder": "decoder"}.get(kind)
        if directory is None:
            continue
        for task in model_tasks(root, kind):
            name = f"{directory}_{dataset}" + (f"_{task}" if task else "")
            try:
                records = files.read_jsonl(files.join(logdir, name, "scores.jsonl"))
            except UserError:
                return None
            if not any(isinstance(r, dict) and r.get("step", -1) >= max_steps for r in records):
                return None
    return (
        f"trainer: {logdir} holds a finished run (checkpoint at step {listed[-1][0]}, "
        f"task.train.max_steps {max_steps}; every job done): nothing to do, nothing written "
        "(raise task.train.max_steps to continue it)"
    )
