"""lm.synthetic.StageMeshTransformerLM trained through the trainer's one ``TrainStep`` beside the same
experiment unpipelined and unsharded (``num_stages = 0``), from the same initial weights, on the same
batches, with SGD and the global-norm clipping of the experiment's learner: shared by the
pipeline x mesh tests, and run as a program for the combinations that need more logical devices than
a test process has (``python -m tests.trainer.distributed.stage_mesh_training DEVICES SCHEDULES
[--knob K] [--staged K]``: one JSON line per schedule, with the difference of its checkpoint restored
into the unpipelined model)."""

from __future__ import annotations

import json
import sys
import tempfile

import gin
import numpy as np

STEPS, TOL = 20, 1e-5
# SGD: Adam divides each gradient by its own running norm, so float noise in a near-zero gradient
# (sums in another order on a split mesh) becomes a visible step (7e-5 after 20 Adam steps).
OVERRIDE = "task.train.optimizer : 'sgd'; task.train.learning_rate : 0.5"
KNOBS = [
    "model_dim = 16",
    "hidden_dim = 32",
    "num_heads = 2",
    "batch_size = 8",
    "seq_length = 8",
    "max_steps = 40",
    "warmup_steps = 2",
    "num_train_sequences = 64",
    "num_layers = 2",
]  # a layer a stage: each stage's compile is most of a test's time


def root(*knobs: str):
    """The experiment with this module's knobs and ``knobs``, SGD."""
    return resolved(KNOBS + list(knobs), OVERRIDE)


def resolved(knobs: list[str], override: str):
    """lm.synthetic.StageMeshTransformerLM resolved with gin ``knobs`` and a Params ``override``."""
    from params import experiment

    gin.clear_config()
    try:
        return experiment.resolve(
            "lm.synthetic.StageMeshTransformerLM",
            gin_bindings=[f"StageMeshTransformerLM.{k}" for k in knobs],
            params_override=override,
        )
    finally:
        gin.clear_config()


def train_step(*knobs: str):
    from params import experiment
    from trainer.distributed import mesh_placement

    r = root(*knobs)
    return mesh_placement.make_train_step(r.cluster, experiment.task_params_for(r, "train"), r.input.train)


def key(v) -> str:
    """A variable's name without the pipeline's level (DVariables spell '/' as '.')."""
    return v.name.replace(".", "/").replace("pipeline/", "").split(":")[0]


def whole(v) -> np.ndarray:
    from tensorflow.experimental import dtensor

    if not isinstance(v, dtensor.DVariable):
        return v.numpy()
    layout = dtensor.fetch_layout(v)
    return dtensor.unpack(
        dtensor.relayout(v.read_value(), dtensor.Layout.replicated(layout.mesh, v.shape.rank))
    )[0].numpy()


def start_alike(start: dict[str, np.ndarray], staged) -> None:
    """Gives ``staged`` the weights ``start`` (the plain model's, by key), split by its layouts."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    assert sorted(start) == sorted(key(v) for v in staged.task.trainable_variables)
    for v in staged.task.trainable_variables:
        layout = dtensor.fetch_layout(v)
        full = dtensor.copy_to_mesh(
            tf.constant(start[key(v)]), dtensor.Layout.replicated(layout.mesh, v.shape.rank)
        )
        v.assign(dtensor.relayout(full, layout))


def weights(step) -> dict[str, np.ndarray]:
    """A plain step's weights by key."""
    return {key(v): v.numpy() for v in step.task.trainable_variables}


def train(step) -> float:
    """STEPS steps; the last loss (every step finite, the global step STEPS)."""
    finite, outputs = step.run(STEPS)
    assert bool(np.asarray(finite)) and int(np.asarray(whole(step.global_step))) == STEPS
    return float(outputs["task"]["loss"])


def difference(staged, want: dict[str, np.ndarray]) -> float:
    """The largest difference of ``staged``'s weights from ``want`` (the plain model's, by key)."""
    return max(float(np.max(np.abs(whole(v) - want[key(v)]))) for v in staged.task.trainable_variables)


def restored_unpipelined(staged, directory: str, knobs: list[str]) -> dict[str, np.ndarray]:
    """``staged``'s checkpoint (the trainer's, the plain format) restored into the same experiment
    unpipelined (``num_stages = 0``), matched by the variables' names: its weights by key."""
    from params import experiment
    from trainer import checkpointer

    path = staged.placement.checkpointer(directory, 1, staged).save(STEPS)
    unpipelined = experiment.task_params_for(root("num_stages = 0", *knobs), "dev").instantiate()
    checkpointer.restore_task(unpipelined, path)
    return {key(v): v.numpy() for v in unpipelined.trainable_variables}


def main(argv: list[str]) -> int:
    import argparse

    import tensorflow as tf

    parser = argparse.ArgumentParser(prog="python -m tests.trainer.distributed.stage_mesh_training")
    parser.add_argument("devices", type=int, help="logical CPU devices")
    parser.add_argument("schedules", help="comma-separated GPipe schedules, one staged run each")
    parser.add_argument("--knob", action="append", default=[], help="a gin knob of every run")
    parser.add_argument("--staged", action="append", default=[], help="a gin knob of the staged runs")
    args = parser.parse_args(argv)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    plain = train_step("num_stages = 0", *args.knob)
    start = weights(plain)
    staged_steps = []
    for schedule in args.schedules.split(","):
        staged = train_step(f'schedule = "{schedule}"', *args.knob, *args.staged)
        start_alike(start, staged)
        staged_steps.append((schedule, staged))
    plain_loss = train(plain)
    want = weights(plain)
    moved = max(float(np.max(np.abs(want[k] - start[k]))) for k in want)
    for schedule, staged in staged_steps:
        loss = train(staged)
        with tempfile.TemporaryDirectory() as tmp:
            restored = restored_unpipelined(staged, tmp, args.knob)
        line = {
            "schedule": schedule,
            "placement": type(staged.placement).__name__,
            "startup_line": staged.placement.startup_line(staged.task, staged.functions),
            "loss": loss,
            "plain_loss": plain_loss,
            "weight_difference": difference(staged, want),
            "moved": moved,
            "restored_difference": max(float(np.max(np.abs(restored[k] - want[k]))) for k in want),
        }
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
