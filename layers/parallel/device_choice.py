"""Devices for the parts of a model cut across devices (GPipe's stages, local parallelism's blocks).

A placement may name other devices for the parts than this process's own (``parts_on``: the tasks
of a cluster, trainer/distributed/remote_stages.py); a layer's explicit ``params.devices`` still wins.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import tensorflow as tf

from params.errors import ConfigError

_PART_DEVICES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "tensorpipe_part_devices", default=None
)


@contextlib.contextmanager
def parts_on(devices: list[str], where: str) -> Iterator[None]:
    """Layers built inside put part k (stage or block) on ``devices[k]`` when their
    ``params.devices`` is empty; ``where`` names the devices in errors (e.g. a cluster job)."""
    token = _PART_DEVICES.set((where, *devices))
    try:
        yield
    finally:
        _PART_DEVICES.reset(token)


def resolve(path: str, explicit: list[str], k: int, unit: str = "stage") -> list[str | None]:
    """One device per part: ``explicit`` if given (it must list k), else the caller's device for one
    part, else the first k GPUs, else the first k logical CPU devices. ``unit`` names a part in errors."""
    if explicit:
        if len(explicit) != k:
            raise ConfigError(
                f"{path}: params.devices lists {len(explicit)} devices for {k} {unit}s; give one device "
                f"per {unit}"
            )
        return list(explicit)
    placed = _PART_DEVICES.get()
    if placed is not None:
        where, devices = placed[0], list(placed[1:])
        if k > len(devices):
            raise ConfigError(
                f"{path}: {k} {unit}s need {k} tasks but {where} has {len(devices)}; give it {k} tasks"
            )
        return devices[:k]
    if k == 1:
        return [None]
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) >= k:
        return [short_name(d.name) for d in gpus[:k]]
    cpus = tf.config.list_logical_devices("CPU")
    if len(cpus) >= k:
        return [short_name(d.name) for d in cpus[:k]]
    raise ConfigError(
        f"{path}: {k} {unit}s need {k} devices but there are {len(cpus)} logical CPU devices and "
        f"{len(gpus)} GPUs; set cluster.num_logical_cpu_devices={k} (or params.devices)"
    )


def on(device: str | None) -> contextlib.AbstractContextManager:
    """``tf.device(device)``, or nothing for None (the caller's device)."""
    return tf.device(device) if device else contextlib.nullcontext()


def short_name(name: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:1`` -> ``/device:CPU:1``."""
    return "/device:" + name.split("/device:")[-1]
