"""``python -m tools.predict --export_dir=DIR --input=FILE``: run an exported model (tools.export).

    .venv/bin/python -m tools.predict --export_dir=runs/digits/export --input=images.npy
    .venv/bin/python -m tools.predict --export_dir=runs/rev/export/1000 --input=sources.txt
    .venv/bin/python -m tools.predict --export_dir=runs/lm/export/1000 --signature=greedy_continuation \\
        --input=prompts.npy

``--input`` is a ``.npy`` batch (for a signature with one tensor input), a ``.npz`` of named batches (one
per input), or a text file whose lines are the batch of a signature's one string input (``-``: stdin).
Prints one JSON line per example: each output's row (strings as text), and for lines of text the line
itself as ``input``. ``--export_dir`` may be the export root (``<logdir>/export``): its newest step
folder is used. Uses only TensorFlow's own
``tf.saved_model.load`` (after ``import tensorflow_text``, whose ops a SentencePiece model's export
holds): what any other program serving the export would do.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params.errors import ConfigError, UserError  # noqa: E402
from trainer import tf_startup  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "export_dir",
    None,
    "A SavedModel written by python -m tools.export, or the folder of its step folders (<logdir>/export: "
    "the newest step is used).",
)
flags.DEFINE_string("input", None, "A .npy or .npz batch, or a text file of one input per line (-: stdin).")
flags.DEFINE_string("signature", "serving_default", "The serving signature to run.")


def read_inputs(path: str, specs: dict) -> dict:
    """The signature's inputs from ``path``; raises UserError when they do not fit ``specs``."""
    import numpy as np

    if path.endswith(".npz"):
        with np.load(path) as data:
            inputs = {name: data[name] for name in data.files}
    elif path.endswith(".npy"):
        if len(specs) != 1:
            raise UserError(f"--input={path}: the signature takes {', '.join(sorted(specs))}; give a .npz")
        inputs = {next(iter(specs)): np.load(path)}
    else:
        strings = [name for name, spec in specs.items() if spec.dtype.name == "string"]
        if len(specs) != 1 or not strings:
            raise UserError(
                f"--input={path}: text lines need a signature with one string input; this one takes "
                f"{', '.join(f'{n} ({s.dtype.name})' for n, s in sorted(specs.items()))}"
            )
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
        with stream:
            lines = [line.rstrip("\r\n") for line in stream]
        inputs = {strings[0]: np.array(lines, dtype=object)}
    missing = sorted(set(specs) - set(inputs))
    if missing:
        raise UserError(f"--input={path}: missing input(s) {', '.join(missing)}")
    return {name: inputs[name] for name in specs}


def newest_export(export_dir: str) -> str:
    """``export_dir`` itself when it holds a SavedModel; else its newest step folder that does (an export
    root, ``<logdir>/export``: tools.export writes one folder per step)."""
    import tensorflow as tf

    if not tf.io.gfile.isdir(export_dir) or tf.io.gfile.exists(os.path.join(export_dir, "saved_model.pb")):
        return export_dir
    steps = [
        int(name.rstrip("/"))
        for name in tf.io.gfile.listdir(export_dir)
        if name.rstrip("/").isdecimal()
        and tf.io.gfile.exists(os.path.join(export_dir, name.rstrip("/"), "saved_model.pb"))
    ]
    if not steps:
        raise UserError(
            f"--export_dir={export_dir} holds no SavedModel, nor step folders that do (tools.export)"
        )
    return os.path.join(export_dir, str(max(steps)))


def predict(export_dir: str, inputs_path: str, signature: str = "serving_default") -> list[dict]:
    """One record per example: {output name: its row, as JSON-able values}, and for lines of text
    ``input``: the line. ``export_dir`` may be an export root (its newest step folder is used)."""
    import tensorflow as tf

    try:
        import tensorflow_text  # noqa: F401 (registers the SentencePiece ops of a subword model's export)
    except ImportError:
        pass
    export_dir = newest_export(export_dir)
    try:
        model = tf.saved_model.load(export_dir)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"cannot load --export_dir={export_dir}: {str(e).strip().splitlines()[0]}") from None
    if signature not in model.signatures:
        raise ConfigError(f"--signature={signature}: the export has {', '.join(sorted(model.signatures))}")
    fn = model.signatures[signature]
    specs = fn.structured_input_signature[1]
    try:
        inputs = read_inputs(inputs_path, specs)
        feeds = {name: tf.constant(value, dtype=specs[name].dtype) for name, value in inputs.items()}
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"--input={inputs_path}: {e}") from None
    try:
        outputs = fn(**feeds)
    except (tf.errors.InvalidArgumentError, TypeError, ValueError) as e:
        raise UserError(f"--signature={signature}: {str(e).strip().splitlines()[0]}") from None
    arrays = {name: value.numpy() for name, value in outputs.items()}
    rows = len(next(iter(arrays.values())))
    records = [{name: _jsonable(array[i]) for name, array in sorted(arrays.items())} for i in range(rows)]
    (name, spec), *others = specs.items()
    if not others and spec.dtype.name == "string" and "input" not in arrays and len(inputs[name]) == rows:
        for record, line in zip(records, inputs[name], strict=True):
            record["input"] = _jsonable(line)  # each line of text beside what it gave
    return records


def _jsonable(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r} (flags need --name=value)")
    if not FLAGS.export_dir or not FLAGS.input:
        raise ConfigError("--export_dir and --input are required")
    for record in predict(FLAGS.export_dir, FLAGS.input, FLAGS.signature):
        print(json.dumps(record, sort_keys=True))
    return 0


def run() -> None:
    from tools import cli

    tf_startup.import_tensorflow()
    cli.run_main("predict", main)


if __name__ == "__main__":
    run()
