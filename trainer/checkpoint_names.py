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
``tools.export``) uses it when the checkpoint's object graph does not match the task's, and so does a
trainer's ``Checkpointer.restore_latest`` (``match_training_state``): there the checkpoint must hold
exactly the task's variables, and each optimizer slot is found by its variable's name too. A
checkpoint keys the slots by position (the i-th variable the learner was built for, an order each
placement makes), and names each ``<variable>/<optimizer>/<slot>`` (tasks/optimizers.py), a name its
object graph records (TensorFlow's ``slot_variables`` links are written only for optimizers whose
slots are not their own tracked variables, which ours are). The global step, input position and save
counter restore by the object graph, as in any resume. The logdir guard lets an evaler, decoder or
trainer of the other placement into the logdir when ``differences`` finds none (a trainer not for a
checkpoint whose slots are named by position alone: ``saved_slots``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from layers import tf_compat
from tasks import optimizers

TASK = "task"  # the name of the task in the trainer's checkpoints (tf.train.Checkpoint(task=...))
LEARNER = "learner"  # ... and of its learner, whose only variables are the optimizer's slots
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


def _attributes(reader: Any, prefix: str) -> list[tuple[str, str]]:
    """(name, checkpoint key) of the variables whose key starts with ``prefix``, from the object graph
    of the checkpoint ``reader`` (``tf.train.load_checkpoint``) reads."""
    graph = tf_compat.checkpoint_object_graph(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    return [
        (a.full_name, a.checkpoint_key)
        for node in graph.nodes
        for a in node.attributes
        if a.name == "VARIABLE_VALUE" and a.checkpoint_key.startswith(prefix)
    ]


def saved_variables(reader: Any) -> dict[str, str]:
    """{variable name: checkpoint key} of the task's variables in the checkpoint ``reader`` reads."""
    return dict(_attributes(reader, f"{TASK}/"))


def saved_slots(reader: Any) -> dict[str, dict[str, str]]:
    """{variable name: {slot: checkpoint key}} of the learner's slots in the checkpoint ``reader``
    reads, by the variable names in the slots' names (tasks/optimizers.py); ValueError for a checkpoint
    whose slots are known by position only."""
    out: dict[str, dict[str, str]] = {}
    for name, key in _attributes(reader, f"{LEARNER}/"):
        owner = optimizers.slot_owner(name)
        if owner is None:
            raise ValueError(
                f"its optimizer slots are known by position only (slot {name}: written before slots "
                "were named by their variables), so they cannot follow the variables into another "
                "placement; resume it once with the placement that wrote it, and that run's next "
                "checkpoint resumes in any"
            )
        out.setdefault(owner, {})[name.rpartition("/")[2]] = key
    return out


def placed_otherwise(task: tf.Module, saved: dict[str, str]) -> bool:
    """Whether the checkpoint's variables (``saved``: ``saved_variables``) are the task's placed
    otherwise: other names, the same without the GPipe levels of either side. The checkpoint then
    restores by name; any other difference is left to the restore by the object graph (and its
    error)."""
    names = {name_of(v) for v in task.variables}
    if set(saved) == names:
        return False
    own = task_levels(task)
    wanted = {drop_levels(n, own) for n in names}
    levels = inferred_levels(saved, wanted)
    return {drop_levels(n, levels) for n in saved} == wanted


def match(task: tf.Module, saved: dict[str, str]) -> dict[str, tuple[tf.Variable, str]]:
    """{canonical name: (the task's variable, its checkpoint key)} for every variable of the task;
    ValueError naming what does not match (a variable missing, two that map to one name)."""
    return _match(task, saved)[0]


def _match(task: tf.Module, saved: dict[str, str]) -> tuple[dict[str, tuple[tf.Variable, str]], set[str]]:
    """``match``'s pairs, and the checkpoint's levels."""
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
    return {name: (v, keys[name]) for name, v in wanted.items()}, levels


def match_training_state(task: tf.Module, optimizer: Any, reader: Any) -> list[tuple[str, tf.Variable, str]]:
    """(name, variable, checkpoint key) for every variable of ``task`` and every slot of ``optimizer``
    (tasks/optimizers.py, built for the task's trainable variables), each slot found by its variable's
    name; the checkpoint must hold exactly these, at the same shapes. ValueError naming the first
    mismatch (a variable missing or left over, a slot missing or left over, a shape)."""
    saved = saved_variables(reader)
    pairs, levels = _match(task, saved)
    left_over = sorted({drop_levels(name, levels) for name in saved} - set(pairs))
    if left_over:
        raise ValueError(f"the checkpoint's variable {left_over[0]} has no place in this model")
    slots = {drop_levels(owner, levels): by_slot for owner, by_slot in saved_slots(reader).items()}
    out = [(name, v, key) for name, (v, key) in pairs.items()]
    for name, (v, _) in pairs.items():
        own = optimizer.slots_of(v) if v.trainable else {}
        have = slots.pop(name, {})
        for slot in sorted(set(own) | set(have)):
            if slot not in have:
                raise ValueError(f"the checkpoint holds no optimizer slot {slot} of {name}")
            if slot not in own:
                raise ValueError(f"the checkpoint's optimizer slot {slot} of {name} has no place here")
            out.append((f"{name}/{slot}", own[slot], have[slot]))
    if slots:
        raise ValueError(f"the checkpoint holds optimizer slots of {sorted(slots)[0]}, not a variable here")
    shapes = reader.get_variable_to_shape_map()
    for name, v, key in out:
        if list(shapes[key]) != v.shape.as_list():
            raise ValueError(f"{name}: shape {list(shapes[key])} in the checkpoint, {v.shape.as_list()} here")
    return out


def restore_training_by_name(task: tf.Module, optimizer: Any, reader: Any) -> int:
    """Assigns every variable of ``task`` and every slot of ``optimizer`` from the training checkpoint
    ``reader`` reads (``tf.train.load_checkpoint``), matched by name (``match_training_state``;
    nothing is assigned unless all match and all values are read); returns how many."""
    triples = match_training_state(task, optimizer, reader)
    values = [reader.get_tensor(key) for _, _, key in triples]
    for (_, v, _), value in zip(triples, values):
        assign_whole(v, value)
    return len(triples)


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
