"""A GPipe layer's ``schedule_file``: torch.distributed.pipelining's CSV read from a file (any
``tf.io.gfile`` path), checked against the layer, with one ConfigError line naming the file for a
directory, text that is not UTF-8, a number past any int, or a schedule of another shape."""

from __future__ import annotations

import tensorflow as tf

from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import torch_format
from params.errors import ConfigError


def placement(file: str, num_stages: int, num_devices: int) -> list[int]:
    """The device of each stage: where the schedule in ``file`` puts it, else the looped s % K (also
    when the file cannot be read or does not fit: ``load`` then says why in one line)."""
    looped = [s % num_devices for s in range(num_stages)]
    if not file or not tf.io.gfile.exists(file) or tf.io.gfile.isdir(file):
        return looped
    try:
        with tf.io.gfile.GFile(file) as f:
            sched = torch_format.from_actions(torch_format.read_csv(f.read()))
    except (ValueError, UnicodeDecodeError, tf.errors.OpError):  # ScheduleError too; ``load`` says why
        return looped
    if (sched.num_stages, sched.num_devices) != (num_stages, num_devices):
        return looped
    return [sched.device_of(s) for s in range(num_stages)]


def load(path: str, file: str, want: tuple[int, int, int], remat: str) -> schedules.Schedule:
    """The schedule in ``file`` (torch.distributed.pipelining's CSV) for the layer at ``path`` with
    ``want`` (devices, stages, micro-batches), re-materialized by ``remat``."""
    if not tf.io.gfile.exists(file):
        raise ConfigError(f"{path}: params.schedule_file {file!r} does not exist")
    if tf.io.gfile.isdir(file):
        raise ConfigError(f"{path}: params.schedule_file {file!r} is a directory, not a CSV file")
    try:
        with tf.io.gfile.GFile(file) as f:
            rows = torch_format.read_csv(f.read())
        sched = torch_format.from_actions(rows, name=f"file:{file}")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: params.schedule_file {file} is not UTF-8 text ({e.reason})") from None
    except (ValueError, tf.errors.OpError) as e:  # ScheduleError, a number past int's digits
        raise ConfigError(f"{path}: params.schedule_file {file}: {str(e)[:200]}") from None
    got = (sched.num_devices, sched.num_stages, sched.num_micro_batches)
    if got != want:
        raise ConfigError(
            f"{path}: params.schedule_file {file} has {got[0]} ranks, {got[1]} stages and "
            f"{got[2]} micro-batches; the layer has {want[0]} devices, {want[1]} stages and {want[2]} "
            "micro-batches: set num_stages, virtual_stages and num_micro_batches to match"
        )
    return schedules.with_remat(sched, remat)
