"""``python -m tools.make_shards``: text files as TFRecord shards of ``tf.train.Example``s.

    .venv/bin/python -m tools.make_shards --input='corpus/*.txt' --output=shards/train --num_shards=8

Each non-empty line becomes one Example with a bytes feature ``text`` (``--feature``), written
round-robin to ``<output>-00000-of-00008.tfrecord`` ... (any tf.io.gfile path), so shards hold equal
shares and read in parallel. lm.text.TextTransformerLM reads them with
``--gin_param="TextTransformerLM.file_format='tfrecord'"`` and ``train_files='<output>-*.tfrecord'``.
Prints one line: the shards written and the lines in them. A shard is written to a temporary name
and renamed when complete.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params.errors import ConfigError  # noqa: E402
from tools import cli  # noqa: E402
from trainer import tf_startup  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The binary's flags, defined when it runs (not on import: a test may import this module beside
    another binary whose flags share names)."""
    flags.DEFINE_string("input", None, "Text files, one sentence per line: globs separated by commas.")
    flags.DEFINE_string("output", None, "Shard path prefix: <output>-NNNNN-of-NNNNN.tfrecord.")
    flags.DEFINE_integer("num_shards", 8, "Shards to write (lines go round-robin).")
    flags.DEFINE_string("feature", "text", "Name of the bytes feature holding each line.")


def shard_paths(output: str, num_shards: int) -> list[str]:
    return [f"{output}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]


def write_shards(
    files: list[str], output: str, num_shards: int, feature: str = "text"
) -> tuple[list[str], int]:
    """Writes the shards; returns their paths and the number of lines written."""
    tf = tf_startup.import_tensorflow()  # without TensorFlow's start-up lines on stderr

    from tasks.readers import file_lines

    if num_shards < 1:
        raise ConfigError(f"--num_shards must be >= 1, got {num_shards}")
    paths = shard_paths(output, num_shards)
    parent = os.path.dirname(output)
    if parent:
        tf.io.gfile.makedirs(parent)
    temps = [f"{path}.tmp-{os.getpid()}" for path in paths]
    writers = [tf.io.TFRecordWriter(temp) for temp in temps]
    count = 0
    try:
        for line in file_lines(files):
            if not line.strip():
                continue
            value = tf.train.Feature(bytes_list=tf.train.BytesList(value=[line.encode("utf-8")]))
            example = tf.train.Example(features=tf.train.Features(feature={feature: value}))
            writers[count % num_shards].write(example.SerializeToString())
            count += 1
    finally:
        for writer in writers:
            writer.close()
    for temp, path in zip(temps, paths):
        tf.io.gfile.rename(temp, path, overwrite=True)
    return paths, count


def main(argv: list[str]) -> int:
    from tasks.readers import list_files

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}")
    if not FLAGS.input or not FLAGS.output:
        raise ConfigError("--input (text files) and --output (the shards' path prefix) are required")
    paths, count = write_shards(
        list_files(FLAGS.input, "--input"), FLAGS.output, FLAGS.num_shards, FLAGS.feature
    )
    pattern = f"{FLAGS.output}-*-of-{len(paths):05d}.tfrecord"
    print(f"make_shards: wrote {len(paths)} shards ({count} lines): {pattern}")
    return 0


if __name__ == "__main__":
    define_flags()
    cli.run_main("make_shards", main)
