"""The jobs of a multi-task model (tasks/multi_task.py): one evaler and decoder per task, and
``--model_task_name``.

A job ``evaler_<dataset>`` (``decoder_<dataset>``) of a multi-task experiment runs one evaler (decoder)
per task, each on the task's input of that data set, writing ``eval_<dataset>_<task>/``
(``decoder_<dataset>_<task>/``): Lingvo's directory names for an evaler run with
``--model_task_name=<task>``. Decoders run for the tasks that implement ``decode``.

``--model_task_name=<task>`` (Lingvo's flag) picks one task: the evalers and decoders of this process
run for it alone, and a trainer in this process trains it alone (every step, no scheduler). It picks
jobs, as ``--job`` does, so it is not a setting of the run: params.txt stays that of the experiment,
and evalers of each task can run as processes of their own beside one trainer.

``check_placement``: an adaptive scheduler trains in one program only (one line otherwise).
"""

from __future__ import annotations

from params.errors import ConfigError
from params.hyperparams import Params
from tasks import multi_task, task_scheduler
from trainer.decoder_job import implements_decode
from trainer.distributed.remote_stages import RemoteStages
from trainer.placement import OnDevice


def check_model_task_name(root: Params, model_task_name: str) -> None:
    """ConfigError unless ``model_task_name`` is empty or a task of the experiment's multi-task model."""
    if not model_task_name:
        return
    if not multi_task.is_multi_task(root.task):
        raise ConfigError(
            f"--model_task_name={model_task_name}: {root.model} is a single-task experiment; the flag "
            "picks a task of a multi-task model (tasks/multi_task.py)"
        )
    names = multi_task.task_names(root.task)
    if model_task_name not in names:
        raise ConfigError(
            f"--model_task_name={model_task_name}: no such task; {root.model} has {', '.join(names)}"
        )


def model_tasks(root: Params, kind: str, model_task_name: str = "") -> list[str]:
    """The tasks a job of ``kind`` (evaler, decoder) runs for: [""] (the task) for a single-task model."""
    check_model_task_name(root, model_task_name)
    if not multi_task.is_multi_task(root.task):
        return [""]
    names = [model_task_name] if model_task_name else multi_task.task_names(root.task)
    if kind == "decoder":
        names = [n for n in names if implements_decode(root.task.task_params.get(n).cls)]
    return names


def for_training(task_params: Params, model_task_name: str) -> Params:
    """The task Params a trainer runs: with ``--model_task_name``, the multi-task model training that
    task alone (frozen, as given)."""
    if not model_task_name:
        return task_params
    p = task_params.copy()
    p.model_task_name = model_task_name
    return p.freeze()


def check_placement(placement: object, task_params: Params) -> None:
    """ConfigError when the trainer's placement cannot run the model's scheduler: an adaptive one keeps
    scores that the forward pass updates, which only a placement in one program (this process's
    devices, or stages on other processes) applies as it trains; replicas, parameter servers and
    meshes would each keep their own or none."""
    if not multi_task.is_multi_task(task_params) or task_params.model_task_name:
        return
    schedule = task_params.task_schedule
    adaptive = schedule is not None and issubclass(schedule.cls, task_scheduler.AdaptiveScheduler)
    if adaptive and type(placement) not in (OnDevice, RemoteStages):
        raise ConfigError(
            f"task.task_schedule: {schedule.cls.__name__} keeps scores the forward pass updates, which the "
            f"{type(placement).__name__} placement does not apply; train this multi-task model in one "
            "process (--mode=train), or use a ConstantScheduler or ExponentialScheduler"
        )
