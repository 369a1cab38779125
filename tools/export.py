"""``python -m tools.export --logdir=DIR``: a trained model as a TensorFlow SavedModel.

    .venv/bin/python -m tools.export --logdir=runs/digits            # newest checkpoint
    .venv/bin/python -m tools.export --logdir=runs/digits --checkpoint=1000

Rebuilds the task from ``<logdir>/params.txt`` alone (``Params.from_text``), restores a checkpoint of
``<logdir>/train`` into it, and writes ``<logdir>/export/<step>/`` with the serving signatures of the
task's ``inference()`` (image classification: images -> classes and probabilities; LM: ids -> log-probs
and a greedy continuation; MT: text or ids -> beam-decoded translation). The task is built as the
decoder job builds it for ``--dataset`` (its task_overrides, its input's shapes and vocabulary), so
the export's outputs equal that job's. Pipelines become single-device graphs: each ``GPipeLayer`` is
built with one stage and one micro-batch (the same variables), so the SavedModel runs on any one
device. It loads with plain ``tf.saved_model.load``; ``python -m tools.predict`` runs it.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params.errors import ConfigError, UserError  # noqa: E402
from params.hyperparams import Params  # noqa: E402
from trainer import tf_startup  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("logdir", None, "The run's log directory (it holds params.txt and train/).")
flags.DEFINE_string(
    "checkpoint", None, "A step (1000) or a checkpoint path (runs/x/train/ckpt-1000). Default: the newest."
)
flags.DEFINE_string("export_dir", None, "Where to write the SavedModel. Default: <logdir>/export/<step>.")
flags.DEFINE_string(
    "dataset",
    None,
    "The data set whose decoder job the export reproduces (its task overrides, input shapes and "
    "vocabulary). Default: dev if the experiment has it, else its first non-train data set.",
)


def single_device(p: Params) -> Params:
    """``p`` with every GPipeLayer built as one stage, one micro-batch, on the caller's device (stage
    meshes, too, become plain devices: the same variables)."""
    from layers.parallel.pipeline.gpipe import clear_stage_meshes, gpipe_params_in

    p = p.copy()
    for node in gpipe_params_in(p):
        if node.stages:
            node.set(devices=[""] * len(node.stages), num_micro_batches=1, micro_batch_size=0)
        else:
            node.set(num_stages=1, split_points=[], devices=[], num_micro_batches=1)
            node.set(micro_batch_size=0)
        clear_stage_meshes(node)
    return p


def read_run_params(logdir: str) -> Params:
    """The run's resolved Params, rebuilt from ``<logdir>/params.txt`` alone."""
    from trainer import files

    path = files.join(logdir, "params.txt")
    text = files.read_text(path)
    if text is None:
        raise UserError(f"{path} does not exist: is --logdir={logdir} a training run's log directory?")
    try:
        return Params.from_text(text, source=path)
    except ConfigError as e:
        raise UserError(str(e) if str(e).startswith(path) else f"cannot read {path}: {e}") from None


def pick_checkpoint(train_dir: str, wanted: str | None) -> tuple[int, str]:
    """(step, path) of the checkpoint ``--checkpoint`` names (a step or a path), else the newest."""
    from trainer import checkpointer

    listed = checkpointer.list_checkpoints(train_dir)
    if wanted is None:
        if not listed:
            raise UserError(f"no checkpoint in {train_dir} yet; train first")
        return listed[-1]
    path = wanted
    if wanted.isdigit():
        path = os.path.join(train_dir, f"{checkpointer.CHECKPOINT_NAME}-{int(wanted)}")
    if not checkpointer.exists(path):
        steps = ", ".join(str(s) for s, _ in listed) or "none"
        raise UserError(f"--checkpoint={wanted}: no checkpoint {path} (saved steps: {steps})")
    return checkpointer.step_of(path), path


def pick_dataset(root: Params, wanted: str | None) -> str:
    names = [n for n in root.input.names() if n != "train"]
    if wanted is not None:
        if wanted not in names:
            raise ConfigError(
                f"--dataset={wanted}: the run has {', '.join(names) or 'no evaluation data set'}"
            )
        return wanted
    if not names:
        raise ConfigError("the run has no data set besides train to take input shapes from; pass --dataset")
    return "dev" if "dev" in names else names[0]


def export(
    logdir: str, checkpoint: str | None = None, export_dir: str | None = None, dataset: str | None = None
) -> tuple[str, list[str]]:
    """Writes the SavedModel; returns its directory and its signature names."""
    import tensorflow as tf

    from params import experiment
    from tasks.lm import sentencepiece_vocab
    from trainer import checkpointer, files

    root = read_run_params(logdir)
    sentencepiece_vocab.use_kept_copies(root, logdir)  # a vocabulary moved since: the run's own copy
    step, path = pick_checkpoint(files.join(logdir, "train"), checkpoint)
    dataset = pick_dataset(root, dataset)
    task_params = single_device(experiment.task_params_for(root, dataset))
    task = task_params.instantiate()
    try:
        checkpointer.restore_task(task, path)
    except checkpointer.CheckpointGoneError:
        raise UserError(f"checkpoint {path} was deleted before it could be read") from None
    input_generator = root.input.get(dataset).instantiate()
    try:
        functions = task.inference(input_generator)
    except NotImplementedError as e:
        raise ConfigError(str(e)) from None
    target = export_dir or files.join(logdir, "export", str(step))
    if tf.io.gfile.exists(target) and tf.io.gfile.listdir(target):
        raise UserError(f"{target} already exists; remove it or pass another --export_dir")
    module = tf.Module(name="exported")
    module.task = task  # the variables (and in-graph vocabularies) the signatures capture
    tmp = f"{target}.tmp-{os.getpid()}"
    try:
        # Signatures only: functions set as attributes were traced a second time by the save.
        tf.saved_model.save(
            module, tmp, signatures={n: fn.get_concrete_function() for n, fn in functions.items()}
        )
        files.write_text_atomic(files.join(tmp, "params.txt"), root.to_text())
        tf.io.gfile.rename(tmp, target, overwrite=True)
    except (tf.errors.OpError, OSError) as e:
        raise UserError(f"cannot write {target}: {files.reason(e)}") from None
    return target, sorted(functions)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r} (flags need --name=value)")
    if not FLAGS.logdir:
        raise ConfigError("--logdir is required (the log directory of a training run)")
    target, names = export(FLAGS.logdir, FLAGS.checkpoint, FLAGS.export_dir, FLAGS.dataset)
    print(f"export: wrote {target} (signatures: {', '.join(names)})")
    print(f"export: run it with: .venv/bin/python -m tools.predict --export_dir={target} --input=FILE")
    return 0


def run() -> None:
    from tools import cli

    tf_startup.import_tensorflow()
    cli.run_main("export", main)


if __name__ == "__main__":
    run()
