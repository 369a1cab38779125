"""``python -m tools.vocab``: train a SentencePiece subword vocabulary on text files.

    .venv/bin/python -m tools.vocab --input='corpus/*.txt' --vocab_size=8000 --model_type=unigram \\
        --output=vocab/corpus.model

``--input`` is one glob or several separated by commas (any ``tf.io.gfile`` file system), one sentence
per line; ``--output`` the .model file to write (any gfile path). The model reserves this project's
special ids (``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3), so a task names it directly:
``vocab.type = 'sentencepiece'``, ``vocab.file = <output>``, ``vocab.size = <vocab_size>``. Prints one
line: the model's path, its pieces and the average pieces per line of the input.
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
    flags.DEFINE_integer("vocab_size", 8000, "Pieces in the model, the 4 special ids included.")
    flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"], "SentencePiece's algorithm.")
    flags.DEFINE_string("output", None, "The .model file to write (any tf.io.gfile path).")
    flags.DEFINE_float("character_coverage", 1.0, "Share of characters covered (0.9995 for large alphabets).")
    flags.DEFINE_integer(
        "max_lines", 1_000_000, "Lines sampled for training (SentencePiece's input_sentence_size)."
    )
    flags.DEFINE_string(
        "normalization", "nmt_nfkc", "SentencePiece normalization rule: nmt_nfkc (NFKC), identity (none), ..."
    )


def main(argv: list[str]) -> int:
    tf = tf_startup.import_tensorflow()  # without TensorFlow's start-up lines on stderr

    from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary, train_model
    from tasks.readers import file_lines, list_files

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}")
    if not FLAGS.input or not FLAGS.output:
        raise ConfigError("--input (text files) and --output (the .model file) are required")
    files = list_files(FLAGS.input, "--input")
    model = train_model(
        files,
        FLAGS.vocab_size,
        FLAGS.model_type,
        FLAGS.character_coverage,
        FLAGS.max_lines,
        FLAGS.normalization,
    )
    parent = os.path.dirname(FLAGS.output)
    if parent:
        tf.io.gfile.makedirs(parent)
    with tf.io.gfile.GFile(FLAGS.output, "wb") as f:
        f.write(model)
    vocab = SentencePieceVocabulary(model, FLAGS.output)
    sample = [line for _, line in zip(range(10000), file_lines(files))]
    per_line = sum(len(vocab.encode(line)) for line in sample) / max(1, len(sample))
    print(f"vocab: wrote {FLAGS.output}: {vocab.size} pieces ({FLAGS.model_type}), {per_line:.1f} per line")
    return 0


if __name__ == "__main__":
    define_flags()
    cli.run_main("vocab", main)
