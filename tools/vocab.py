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

import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params.errors import ConfigError, UserError  # noqa: E402
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


def train(
    files: list[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_lines: int = 1_000_000,
    normalization: str = "nmt_nfkc",
) -> bytes:
    """A serialized SentencePiece model trained on ``files`` with this project's special ids."""
    import sentencepiece as spm

    from tasks.readers import file_lines

    if vocab_size <= 4:
        raise ConfigError(f"--vocab_size must be > 4 (the special ids), got {vocab_size}")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=file_lines(files),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            input_sentence_size=max_lines,
            shuffle_input_sentence=True,
            normalization_rule_name=normalization,
            pad_id=0,
            bos_id=1,
            eos_id=2,
            unk_id=3,
            minloglevel=2,
        )
    except RuntimeError as e:  # e.g. "Vocabulary size too high (N). Please set it to a value <= M."
        raise UserError(str(e).split("] ", 1)[-1]) from None
    return model.getvalue()


def main(argv: list[str]) -> int:
    tf = tf_startup.import_tensorflow()  # without TensorFlow's start-up lines on stderr

    from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary
    from tasks.readers import file_lines, list_files

    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}")
    if not FLAGS.input or not FLAGS.output:
        raise ConfigError("--input (text files) and --output (the .model file) are required")
    files = list_files(FLAGS.input, "--input")
    model = train(
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
