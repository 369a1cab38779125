"""``logdir/model_analysis.txt``: every variable of the model with its shape and size, and totals.

A task may add its own report (a pipeline's partition, say) by defining ``model_analysis() -> str``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


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
    report = getattr(task, "model_analysis", None)
    if callable(report):
        lines += ["", str(report()).rstrip()]
    return "\n".join(lines) + "\n"
