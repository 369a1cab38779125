"""Process-level TensorFlow settings from ``root.cluster``: threads, logical CPU devices, determinism.

TensorFlow accepts these only before it initializes its devices (the first op or logical-device
query). ``configure`` is therefore the first thing a job does; if TensorFlow has already started with
different settings it stops with one line naming the setting, and if the live settings already match
(a test process that set up its own devices) it accepts them.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from params.errors import ConfigError
from params.hyperparams import Params


def configure(cluster: Params, deterministic: bool = True) -> None:
    """Applies ``cluster.*`` and makes every op deterministic (a resumed run repeats a fresh one).

    ``deterministic=False``: an async trainer, whose runs are not reproducible anyway."""
    _set_threads(
        "intra_op_threads",
        cluster.intra_op_threads,
        tf.config.threading.get_intra_op_parallelism_threads,
        tf.config.threading.set_intra_op_parallelism_threads,
    )
    _set_threads(
        "inter_op_threads",
        cluster.inter_op_threads,
        tf.config.threading.get_inter_op_parallelism_threads,
        tf.config.threading.set_inter_op_parallelism_threads,
    )
    _set_logical_cpu_devices(cluster.num_logical_cpu_devices)
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def _set_threads(name: str, value: int, get: Callable[[], int], set_: Callable[[int], None]) -> None:
    if value < 0:
        raise ConfigError(f"cluster.{name}: expected an int >= 0 (0: TensorFlow's default), got {value}")
    if value == 0 or get() == value:
        return
    try:
        set_(value)
    except RuntimeError:
        raise ConfigError(
            f"cluster.{name} : {value} cannot be applied: TensorFlow already started with "
            f"{get() or 'its default'} (configure the cluster before any TensorFlow op runs)"
        ) from None


def _set_logical_cpu_devices(count: int) -> None:
    if count < 0:
        raise ConfigError(f"cluster.num_logical_cpu_devices: expected an int >= 0, got {count}")
    if count == 0:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        live = len(tf.config.list_logical_devices("CPU"))
        if live != count:
            raise ConfigError(
                f"cluster.num_logical_cpu_devices : {count} cannot be applied: TensorFlow already "
                f"initialized {live} CPU device(s) (configure the cluster before any TensorFlow op runs)"
            ) from None
