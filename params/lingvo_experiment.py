"""Lingvo's experiment method names, ported when an Experiment subclass is defined.

A Lingvo model class returns its task from ``Task()`` and one input per data set from ``Train()``,
``Dev()``, ``Test()`` (any capitalised method taking no argument). Here they are ``task()`` and
``train()``, ``dev()``, ``test()``: ``port(cls)`` gives the class the lowercase method calling the
capitalised one, so a class carried over from Lingvo (with its base class and registration changed)
runs as written, and its data sets and job names (``evaler_dev``) are the lowercase ones, as Lingvo's
job names are. Lingvo's multi-task ``Model()`` is ``task()`` too, in a class derived from
``tasks.multi_task.MultiTaskExperiment``. What cannot be ported mechanically stops the class definition
with one ConfigError line: a class that defines both ``Dev()`` and ``dev()``, a capitalised name this
project's Experiment uses for something else, ``Model()`` in a single-task experiment class, and
``ProgramSchedule()``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from params.errors import ConfigError

# Lingvo model-class methods with no counterpart here, and what to do instead.
UNSUPPORTED = {
    "ProgramSchedule": "the trainer's jobs (--job=controller,trainer / evaler_<dataset>) replace "
    "program schedules; remove it",
}


def port(cls: type, reserved: set[str]) -> None:
    """Adds ``task`` / ``<dataset>`` methods calling ``cls``'s own ``Task`` / ``<Dataset>`` methods.

    ``reserved``: the names the Experiment base class defines (only ``task`` may come from Lingvo)."""
    for name, member in list(vars(cls).items()):
        if not name[:1].isupper():
            continue
        function = getattr(member, "__func__", member)
        if not inspect.isfunction(function) or _required_arguments(member, function):
            continue  # a nested class or a helper taking arguments: not a Lingvo data set
        where = f"{cls.__module__}.{cls.__qualname__}"
        if name in UNSUPPORTED:
            reason = UNSUPPORTED[name]
            raise ConfigError(f"{where}.{name}(): Lingvo's {name}() has no counterpart here; {reason}")
        if name == "Model" and not getattr(cls, "MULTI_TASK", False):
            raise ConfigError(
                f"{where}.Model(): Lingvo's Model() makes a multi-task model; derive the class from "
                "tasks.multi_task.MultiTaskExperiment (Lingvo's MultiTaskModelParams)"
            )
        target = "task" if name in ("Task", "Model") else name.lower()
        if target in vars(cls):
            raise ConfigError(
                f"{where} defines both {name}() and {target}(): they are the same method here "
                f"(Lingvo's {name}() is {target}()); keep one"
            )
        if target in reserved and target != "task":
            raise ConfigError(
                f"{where}.{name}(): as a data set it would be named {target!r}, which is the Experiment "
                "method of that name here; rename it"
            )
        setattr(cls, target, _calling(name, target))


def _required_arguments(member: Any, function: Callable) -> bool:
    """Whether the method needs an argument besides self (or cls)."""
    parameters = list(inspect.signature(function).parameters.values())
    if not isinstance(member, staticmethod):
        parameters = parameters[1:]
    return any(
        p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in parameters
    )


def _calling(name: str, target: str) -> Callable[[Any], Any]:
    def method(self: Any) -> Any:
        return getattr(self, name)()

    method.__name__ = method.__qualname__ = target
    method.__doc__ = f"Lingvo's {name}() under this project's name."
    return method
