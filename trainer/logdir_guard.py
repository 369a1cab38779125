"""The logdir guard: before a run writes anything, compare its resolved Params with the logdir's
``params.txt``, so that reusing a log directory never mixes two runs silently.

- No params.txt, or the same Params: go on.
- Another experiment (``model``): stop, one line.
- Other model shapes than the latest checkpoint holds (a task variable added, removed or reshaped,
  found by comparing the checkpoint's variables with the new task's): stop, one line naming them and
  pointing to a new logdir, even with ``--allow_params_change`` (no checkpoint there could be restored).
  Another placement of the same model (a GPipe level more or less in the variables' paths: pipelined
  or not, on stage meshes or not) is no shape change: its checkpoint restores by the variables' names
  (trainer/checkpoint_names.py), a trainer's with the optimizer's slots, and the Params change that
  chose it follows the rules below like any other.
- A finished run (latest checkpoint at ``task.train.max_steps``) with changed settings: stop, one line;
  the changes could not train anything (raise max_steps to continue it).
- Otherwise (say a new learning rate for a run that goes on): go on, print what changed, and the
  controller appends it to ``params_changes.txt`` (step and ``<``/``>`` lines) as it rewrites
  params.txt, after the checkpoint is restored.

``--allow_params_change`` turns each other stop into a warning. Nothing here writes to the logdir.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable

import tensorflow as tf

from params import experiment, text_tree
from params.errors import ConfigError, UserError
from params.hyperparams import Params, parse_typed
from trainer import checkpoint_names, checkpointer, files

FLAG = "--allow_params_change"
CHANGES_FILE = "params_changes.txt"
SHOWN = 5  # keys named in a one-line refusal


def check(
    root: Params,
    logdir: str,
    *,
    trains: bool,
    allow: bool = False,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Raises ConfigError if ``root`` may not run in ``logdir`` (unless ``allow``); returns the
    Lingvo-style diff lines against its params.txt ([] when it has none or the same)."""
    path = files.join(logdir, "params.txt")
    try:
        old_text = files.read_text(path)
    except UserError:
        return []  # an unusable logdir: the writability check that follows says why, in its words
    new_text = root.to_text()
    if old_text is None or old_text == new_text:
        return []
    old = text_tree.parse_lines(old_text, path)
    _refuse_ill_typed(root, logdir, old)
    new = text_tree.parse_lines(new_text)
    changes = text_tree.diff(old, new)
    if not changes:
        return []
    if allow or old.get("model") == new.get("model"):  # else the refusal below names the experiment
        _refuse_shape_changes(root, logdir, trains)
    problem = _problem(root, logdir, old, new, trains)
    if problem and not allow:
        raise ConfigError(
            f"--logdir={logdir}: {problem}; use another --logdir, or pass {FLAG} to go on anyway"
        )
    if problem:
        log(f"trainer: warning: {problem}; going on ({FLAG})")
    log(f"trainer: the Params differ from {path} (< there, > now):")
    for line in changes:
        log(f"  {line}")
    return changes


def _refuse_ill_typed(root: Params, logdir: str, old: dict[str, str]) -> None:
    """ConfigError if a value of the logdir's params.txt is not of its param's type in ``root`` (an
    int written 2.5, a number written 'four'): a damaged file, not a change to record and rewrite."""
    for key, text in old.items():
        if key == "model" or key not in root or isinstance(root.get(key), Params):
            continue  # a group there (a pipeline where the file's run had none) is a change, not damage
        try:
            parse_typed(key, text, root.get(key), root.declared(key))
        except ConfigError as e:
            raise ConfigError(
                f"--logdir={logdir}: its params.txt is damaged ({e}); this run's Params could not have "
                "written it: restore the file, or use another --logdir"
            ) from None


def _problem(root: Params, logdir: str, old: dict, new: dict, trains: bool) -> str | None:
    if old.get("model") != new.get("model"):
        was = text_tree.parse_untyped(old.get("model", "'an unnamed model'"))
        return f"it holds a run of {was} (its params.txt), not {root.model}"
    listed = checkpointer.list_checkpoints(files.join(logdir, "train"))
    if not listed:
        return None
    step = listed[-1][0]
    max_steps = int(root.task.train.max_steps)
    if trains and step >= max_steps:
        keys = sorted({line[2:].split(" : ")[0] for line in text_tree.diff(old, new)})
        shown = ", ".join(keys[:SHOWN]) + (f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else "")
        return (
            f"its run finished at step {step} (task.train.max_steps {max_steps}), so the changed "
            f"settings ({shown}) would train nothing; raise task.train.max_steps to continue it"
        )
    return None


def _refuse_shape_changes(root: Params, logdir: str, trains: bool = True) -> None:
    """ConfigError if the model's variables differ from the logdir's latest checkpoint's (added,
    removed, reshaped), before any restore. Every checkpoint of the logdir holds the old shapes, so none
    could be restored into the new model (a restore would fail after the run had started). Variables
    that differ only by a GPipe level (the same experiment pipelined or not) restore by name
    (trainer/checkpoint_names.py), into a trainer too, with the optimizer's slots, the global step and
    the input position; only a checkpoint whose slots are known by position alone (written before
    they were named by their variables) stops a trainer, in its own line."""
    listed = checkpointer.list_checkpoints(files.join(logdir, "train"))
    if not listed:
        return
    path = listed[-1][1]
    from trainer.distributed.mesh_placement import without_stage_meshes

    # Stages on meshes of their own: their checkpoints hold the task on plain devices (the host
    # mirror), and DTensor cannot write one checkpoint of variables on several meshes.
    task = without_stage_meshes(experiment.task_params_for(root, "train")).instantiate()
    shapes = _shape_changes(task, path)
    if not shapes:
        return
    try:
        placement_only = not checkpoint_names.differences(task, path)
    except (tf.errors.OpError, ValueError):  # no object graph to read names from: by keys only
        placement_only = False
    if placement_only:
        if trains:  # the slots follow their variables by name: refused only for an older checkpoint
            try:
                checkpoint_names.saved_slots(tf.train.load_checkpoint(path))
            except ValueError as e:
                raise ConfigError(
                    f"--logdir={logdir}: checkpoint {path} holds the model placed otherwise (a GPipe "
                    f"level more or less: {shapes[0]}), and {e}"
                ) from None
        return
    more = f" and {len(shapes) - SHOWN} more" if len(shapes) > SHOWN else ""
    raise ConfigError(
        f"--logdir={logdir}: the model's variables differ from checkpoint {path}: "
        f"{', '.join(shapes[:SHOWN])}{more}; no checkpoint of this logdir can be restored into "
        f"this model, even with {FLAG}: train it in a new --logdir"
    )


def task_variables(path: str) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the task's variables in a checkpoint (its ``task/`` entries)."""
    try:
        listed = tf.train.list_variables(path)
    except (tf.errors.OpError, ValueError):
        return {}  # unreadable: the trainer's restore reports it
    return {
        name: tuple(shape)
        for name, shape in listed
        if name.startswith("task/") and name.endswith("/.ATTRIBUTES/VARIABLE_VALUE")
    }


def _shape_changes(task: tf.Module, checkpoint_path: str) -> list[str]:
    """Task variables added, removed or reshaped between the checkpoint and the new task (by their
    checkpoint keys: the paths a trainer's restore matches)."""
    saved = task_variables(checkpoint_path)
    if not saved:
        return []
    with tempfile.TemporaryDirectory(prefix="logdir_guard-") as tmp:
        written = tf.train.Checkpoint(task=task).write(f"{tmp}/task")
        fresh = task_variables(written)

    def shapes(variables: dict[str, tuple[int, ...]]) -> dict[str, list[int]]:
        return {
            name[len("task/") : -len("/.ATTRIBUTES/VARIABLE_VALUE")]: list(s) for name, s in variables.items()
        }

    return checkpoint_names.shape_changes(shapes(saved), shapes(fresh))


def record_changes(logdir: str, step: int, changes: list[str]) -> None:
    """Appends the changes to ``<logdir>/params_changes.txt`` (written whole, atomically)."""
    path = files.join(logdir, CHANGES_FILE)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    entry = f"# step {step}, {stamp}: < before, > now\n" + "".join(f"{line}\n" for line in changes)
    files.write_text_atomic(path, (files.read_text(path) or "") + entry)


def write_params(logdir: str, params_text: str, step: int) -> bool:
    """The controller's write of ``<logdir>/params.txt`` once its run is accepted and restored;
    a change from the text there is first appended to params_changes.txt. Returns whether it changed.
    A params.txt that names classes by their paths before a move (``params.module_aliases``) is
    rewritten with today's paths, and that is no change."""
    path = files.join(logdir, "params.txt")
    old_text = files.read_text(path)
    if old_text == params_text:
        return False
    changes = []
    if old_text is not None:
        changes = text_tree.diff(text_tree.parse_lines(old_text, path), text_tree.parse_lines(params_text))
        if changes:
            record_changes(logdir, step, changes)
    files.write_text_atomic(path, params_text)
    return old_text is None or bool(changes)
