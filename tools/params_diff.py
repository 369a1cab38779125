"""``python -m tools.params_diff A B``: how two runs' (or experiments') Params differ.

    .venv/bin/python -m tools.params_diff runs/digits runs/digits3
    .venv/bin/python -m tools.params_diff runs/digits/params.txt image.digits.GPipeConvNet
    .venv/bin/python -m tools.params_diff image.digits.ConvNet image.digits.ConvNet \\
        --b_override="task.train.learning_rate : 0.01"

A and B are each a log directory (its params.txt), a params file (this project's or Lingvo's), or an
experiment key (resolved with its defaults; ``--experiment_packages`` opts in packages whose classes
may be named by import path, as the trainer's flag does). ``--a_override`` / ``--b_override`` apply
Params text to one side first. Prints the marks of Lingvo's ``A.TextDiff(B)``, one line per key, sorted:
``> key : value`` is A's (a key only in A, or A's side of a change), ``< key : value`` is B's; a changed
key shows its ``>`` line, then its ``<`` line. Exits 0 whether or not they differ (2 on bad input).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params import registry, text_tree  # noqa: E402
from params.errors import ConfigError  # noqa: E402
from params.hyperparams import Params  # noqa: E402
from trainer import tf_startup  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list(
    "experiment_packages",
    [],
    "Packages, besides tasks, whose modules an experiment key may import by full path, e.g. my_pkg for "
    "my_pkg.my_exps.MyExp (also TENSORPIPE_EXPERIMENT_PACKAGES=my_pkg,other), as the trainer's flag.",
)
flags.DEFINE_string("a_override", None, "Params text ('key : value; ...') applied to A.")
flags.DEFINE_string("b_override", None, "Params text ('key : value; ...') applied to B.")


def params_text(spec: str, override: str | None = None) -> str:
    """The Params text of a logdir, a params file or an experiment key, with ``override`` applied."""
    import tensorflow as tf

    from params import experiment, overrides
    from trainer import files

    if tf.io.gfile.isdir(spec):
        path = files.join(spec, "params.txt")
        text = files.read_text(path)
        if text is None:
            raise ConfigError(f"{spec} is a directory without a params.txt (not a run's log directory)")
    elif tf.io.gfile.exists(spec):
        path, text = spec, files.read_text(spec)
    elif "/" in spec or spec.endswith(".txt"):
        raise ConfigError(f"{spec}: no such params file or log directory")
    else:
        return experiment.resolve(spec, params_override=override).to_text()
    if not override:
        return text
    tree = Params.from_text(text, source=path)
    overrides.apply_params_text(tree, override, source=f"override of {spec}")
    return tree.to_text()


def diff(a: str, b: str, a_override: str | None = None, b_override: str | None = None) -> list[str]:
    return text_tree.lingvo_diff(
        text_tree.parse_lines(params_text(a, a_override), a),
        text_tree.parse_lines(params_text(b, b_override), b),
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise ConfigError(
            "give two runs: python -m tools.params_diff A B (logdirs, params files or experiment keys)"
        )
    registry.add_experiment_packages(FLAGS.experiment_packages)
    lines = diff(argv[1], argv[2], FLAGS.a_override, FLAGS.b_override)
    for line in lines:
        print(line)
    if not lines:
        print(f"params_diff: {argv[1]} and {argv[2]} have the same Params")
    return 0


def run() -> None:
    from tools import cli

    tf_startup.import_tensorflow()
    cli.run_main("params_diff", main)


if __name__ == "__main__":
    run()
