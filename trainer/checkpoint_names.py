"""Variable names across placements: the one mapping by which a checkpoint restores into a task
placed otherwise (pipelined or not; docs/parallelism/compose.md).

A checkpoint (TensorFlow's object-based format) keys each variable by its path of attributes, and its
object graph records the variable's name beside that key. A mesh, a device or a stage's mesh changes
neither: the trainer writes the plain format whatever the mesh (``mesh_placement.MeshCheckpointer``).
A GPipe layer does: its layers are its children, one level down, while the same stack without one
holds them itself in a list::

    pipelined  task.stack.pipeline.layers_0.ffn.fc1.w   key task/stack/pipeline/layers_0/ffn/fc1/vars/w
    plain      task.stack.layers_0.ffn.fc1.w            key task/stack/layers/0/ffn/fc1/vars/w

So a variable of the restoring task is the checkpoint's variable whose name is the same without the
levels of GPipe layers (``canonical``):

- the task's levels: the path of each ``GPipeLayer`` in it;
- the checkpoint's levels (its writer's pipelines, which the restoring task may lack): each name
  prefix whose last component, left out, turns a name of the checkpoint into a name of the task that
  the checkpoint lacks (``task.stack.pipeline``, for a task holding ``task.stack.layers_0.ffn.fc1.w``).

The match must be one to one and cover every variable of the task, with the same shapes; values are
assigned whole (a DVariable's split by its layout). ``checkpointer.restore_task`` (evalers, decoders,
``tools.export``) uses it when the checkpoint's object graph does not match the task's, and the logdir
guard lets an evaler or decoder of the other placement into the logdir when ``differences`` finds
none. A trainer resumes only the placement that saved (its checkpoints hold the optimizer's slots by
the variables' order, and the input position): the guard stops it in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from trainer import tf_compat

TASK = "task"  # the name of the task in the trainer's checkpoints (tf.train.Checkpoint(task=...))
SHOWN = 3


def name_of(v: tf.Variable) -> str:
    """A variable's name without its ``:0`` (DVariables and regular ones alike)."""
    return v.name.split(":")[0]


def drop_levels(name: str, levels: Iterable[str]) -> str:
    """``name`` without the last component of each level it lies under:
    ``drop_levels("task.stack.pipeline.layers_0.w", ["task.stack.pipeline"]) == "task.stack.layers_0.w"``."""
    for level in sorted(levels, key=len, reverse=True):  # the innermost first: outer prefixes stay
        if name.startswith(level + "."):
            parent = level.rpartition(".")[0]
            name = (f"{parent}." if parent else "") + name[len(level) + 1 :]
    return name


def task_levels(task: tf.Module) -> list[str]:
    """The levels of the task's own GPipe layers (their paths, as variable names spell them)."""
    from layers.base_layer import layers_of_type
    from layers.parallel.pipeline.gpipe import GPipeLayer

    return [layer.path.replace("/", ".") for layer in layers_of_type(task, GPipeLayer)]


def inferred_levels(saved: Iterable[str], wanted: Iterable[str]) -> set[str]:
    """The checkpoint's levels (module doc): prefixes of ``saved`` names whose last component, left
    out, gives a ``wanted`` name that is not saved."""
    saved = list(saved)
    missing = set(wanted) - set(saved)
    levels = set()
    for name in saved:
        parts = name.split(".")
        for i in range(1, len(parts) - 1):  # neither the root (task) nor the variable itself
            if ".".join(parts[:i] + parts[i + 1 :]) in missing:
                levels.add(".".join(parts[: i + 1]))
    return levels


def saved_variables(reader: Any) -> dict[str, str]:
    """{variable name: checkpoint key} of the task's variables in the checkpoint ``reader``
    (``tf.train.load_checkpoint``) reads."""
    graph = tf_compat.checkpoint_object_graph(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return {
        a.full_name: a.checkpoint_key
        for node in graph.nodes
        for a in node.attributes
        if a.name == "VARIABLE_VALUE" and a.checkpoint_key.startswith(f"{TASK}/")
    }


def match(task: tf.Module, saved: dict[str, str]) -> dict[str, tuple[tf.Variable, str]]:
    """{canonical name: (the task's variable, its checkpoint key)} for every variable of the task;
    ValueError naming what does not match (a variable missing, two that map to one name)."""
    own = task_levels(task)
    wanted: dict[str, tf.Variable] = {}
    for v in task.variables:
        canonical = drop_levels(name_of(v), own)
        if canonical in wanted:
            raise ValueError(f"the task's variables {name_of(wanted[canonical])} and {name_of(v)} are one")
        wanted[canonical] = v
    levels = inferred_levels(saved, wanted)
    keys: dict[str, str] = {}
    for name, key in saved.items():
        canonical = drop_levels(name, levels)
        if canonical in keys:
            raise ValueError(f"two variables of the checkpoint are one without the levels {sorted(levels)}")
        keys[canonical] = key
    missing = [name for name in wanted if name not in keys]
    if missing:
        more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
        raise ValueError(
            f"the checkpoint holds no variable named {', '.join(missing[:SHOWN])}{more} (GPipe levels "
            f"left out: the task's {own or 'none'}, the checkpoint's {sorted(levels) or 'none'})"
        )
    return {name: (v, keys[name]) for name, v in wanted.items()}


def differences(task: tf.Module, path: str) -> list[str]:
    """What keeps the checkpoint at ``path`` from restoring into ``task`` by name: ``<name> added``
    (the task has it, the checkpoint not), ``<name> removed``, ``<name> [shape] -> [shape]``, names
    without the GPipe levels; [] when ``restore_by_name`` restores it."""
    reader = tf.train.load_checkpoint(path)
    saved = saved_variables(reader)
    shapes = reader.get_variable_to_shape_map()
    own = task_levels(task)
    wanted = {drop_levels(name_of(v), own): v.shape.as_list() for v in task.variables}
    levels = inferred_levels(saved, wanted)
    have = {drop_levels(name, levels): list(shapes[key]) for name, key in saved.items()}
    return shape_changes(have, wanted)


def shape_changes(saved: dict[str, list[int]], wanted: dict[str, list[int]]) -> list[str]:
    """``<name> added`` (in ``wanted`` only), ``<name> removed``, ``<name> [shape] -> [shape]``, by name."""
    out = []
    for name in sorted(set(saved) | set(wanted)):
        if name not in saved:
            out.append(f"{name} added")
        elif name not in wanted:
            out.append(f"{name} removed")
        elif saved[name] != wanted[name]:
            out.append(f"{name} {saved[name]} -> {wanted[name]}")
    return out


def restore_by_name(task: tf.Module, path: str) -> int:
    """Assigns every variable of ``task`` from the checkpoint at ``path``, matched by name (module
    doc); returns how many. ValueError when they do not match."""
    reader = tf.train.load_checkpoint(path)
    pairs = match(task, saved_variables(reader))
    values = {}
    for name, (v, key) in pairs.items():
        value = reader.get_tensor(key)
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"{name}: shape {list(value.shape)} in the checkpoint, {v.shape.as_list()} here")
        values[name] = value
    for name, (v, _) in pairs.items():
        assign_whole(v, values[name])
    return len(pairs)


def assign_whole(v: tf.Variable, value: tf.Tensor) -> None:
    """``v.assign(value)`` for a whole value: a DVariable's split by its layout."""
    from tensorflow.experimental import dtensor

    if not isinstance(v, dtensor.DVariable):
        v.assign(value)
        return
    layout = dtensor.fetch_layout(v)
    full = dtensor.copy_to_mesh(
        tf.convert_to_tensor(value, v.dtype), dtensor.Layout.replicated(layout.mesh, v.shape.rank)
    )
    v.assign(dtensor.relayout(full, layout))
