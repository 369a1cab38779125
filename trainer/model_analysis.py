"""``logdir/model_analysis.txt``: every variable of the model with its shape and size, and totals.

Variables on a device mesh (DVariables) get a second table: each one's layout (the mesh axis or
``-`` per dimension) and the bytes one device holds. A task may add its own report (a pipeline's
partition, say) by defining ``model_analysis() -> str``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor


def _size(var: tf.Variable) -> int:
    return int(np.prod(var.shape.as_list())) if var.shape.rank else 1


def _name(var: tf.Variable) -> str:
    return var.name.split(":")[0]


def model_analysis(task: tf.Module, learner: tf.Module | None = None) -> str:
    """The analysis text of a task (and the size of its learner's state)."""
    variables = sorted(task.variables, key=_name)
    width = max([len(_name(v)) for v in variables] + [8])
    lines = [f"{'variable':<{width}}  {'shape':<20}  {'dtype':<8}  {'size':>12}  trainable"]
    for var in variables:
        shape = str(var.shape.as_list())
        lines.append(
            f"{_name(var):<{width}}  {shape:<20}  {var.dtype.name:<8}  {_size(var):>12,}  {var.trainable}"
        )
    trainable = sum(_size(v) for v in variables if v.trainable)
    other = sum(_size(v) for v in variables if not v.trainable)
    lines += [
        "",
        f"variables: {len(variables)}",
        f"trainable parameters: {trainable:,}",
        f"non-trainable parameters: {other:,}",
    ]
    if learner is not None:
        lines.append(f"learner state (optimizer slots): {sum(_size(v) for v in learner.variables):,}")
    layouts = mesh_layouts(variables)
    if layouts:
        lines += ["", layouts.rstrip()]
    report = getattr(task, "model_analysis", None)
    if callable(report):
        lines += ["", str(report()).rstrip()]
    return "\n".join(lines) + "\n"


def mesh_layouts(variables: list[tf.Variable]) -> str:
    """The layout table of the DVariables among ``variables`` ('' when none is on a mesh)."""
    sharded = [v for v in variables if isinstance(v, dtensor.DVariable)]
    if not sharded:
        return ""
    mesh = dtensor.fetch_layout(sharded[0]).mesh
    axes = " x ".join(f"{name}={mesh.dim_size(name)}" for name in mesh.dim_names)
    width = max([len(_name(v)) for v in sharded] + [8])
    lines = [f"mesh: {axes} ({mesh.size} devices)"]
    lines.append(f"{'variable':<{width}}  {'layout':<24}  {'bytes/device':>12}  {'bytes':>12}")
    local_total = total = 0
    for var in sharded:
        specs = dtensor.fetch_layout(var).sharding_specs
        layout = "[" + ", ".join("-" if s == dtensor.UNSHARDED else s for s in specs) + "]"
        local = int(dtensor.unpack(var.read_value())[0].shape.num_elements()) * var.dtype.size
        full = _size(var) * var.dtype.size
        local_total, total = local_total + local, total + full
        lines.append(f"{_name(var):<{width}}  {layout:<24}  {local:>12,}  {full:>12,}")
    lines.append(f"task bytes per device: {local_total:,} of {total:,} ({local_total / max(total, 1):.3f})")
    return "\n".join(lines) + "\n"
