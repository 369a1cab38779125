"""Devices for the parts of a model cut across devices (GPipe's stages, local parallelism's blocks)."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from params.errors import ConfigError


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
