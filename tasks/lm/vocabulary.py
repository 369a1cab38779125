"""Token vocabularies shared by the LM and MT tasks: special ids, symbol vocabularies for synthetic
data, word- or character-level vocabularies built from a user's training file, and SentencePiece
subword models (``vocab.type = 'sentencepiece'``, trained by ``python -m tools.vocab``).

Ids 0..3 are always ``<pad>``, ``<s>`` (BOS), ``</s>`` (EOS) and ``<unk>``; real tokens follow (built
vocabularies: most frequent first, ties broken alphabetically, so a file always gives the same
vocabulary; SentencePiece models are trained with these four ids: tasks/lm/special_ids.py).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence

import tensorflow as tf

from params.errors import ConfigError, UserError
from params.hyperparams import Params
from tasks.lm.special_ids import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, SPECIAL_TOKENS, UNK_ID

LEVELS = ("word", "char")
TYPES = ("built", "sentencepiece")


def vocab_params(size: int = 0, file: str = "", level: str = "word", type: str = "built") -> Params:  # noqa: A002
    """How a task and its inputs map tokens to ids (the same Params on both sides)."""
    p = Params()
    p.define("size", size, "Number of ids, the 4 specials included (the model's vocabulary size).")
    p.define(
        "type",
        type,
        "built: the size-4 most frequent words or characters of file (per level); sentencepiece: "
        "file is a SentencePiece .model (python -m tools.vocab), size its number of pieces.",
    )
    p.define(
        "file",
        file,
        "built: training text the vocabulary is built from (its size-4 most frequent tokens; the rest "
        "are <unk>); several files separated by commas. Empty: synthetic symbols named 0, 1, 2, ... "
        "sentencepiece: the .model file (any tf.io.gfile path).",
    )
    p.define(
        "level", level, "built: word (split on whitespace) or char (every character; a space is a token)."
    )
    return p


def unused_level_marked(params_text: str) -> str:
    """Params text whose sentencepiece ``vocab`` says its ``level`` line is unused (the tokens are the
    model's pieces; ``level`` is read only by a built vocabulary)."""
    if "vocab.type : 'sentencepiece'" not in params_text:
        return params_text
    note = r"\1  # unused: a sentencepiece vocabulary's tokens are its pieces"
    return re.sub(r"^((?:.*\.)?vocab\.level : .*)$", note, params_text, flags=re.M)


def experiment_vocab(level: str, size: int, model_file: str, text_files: str) -> Params:
    """A text experiment's vocabulary: at level ``sentencepiece`` the SentencePiece ``model_file``
    (``size`` 0: its number of pieces), else one built from ``text_files`` at that level."""
    if level == "sentencepiece":
        if not size:
            from tasks.lm.sentencepiece_vocab import model_size

            size = model_size(model_file)
        return vocab_params(size=size, file=model_file, type="sentencepiece")
    return vocab_params(size=size, file=text_files, level=level)


def read_lines(path: str, what: str, skip_empty: bool = True) -> list[str]:
    """Lines of a text file (local or any tf.io.gfile file system); missing -> UserError."""
    if not path:
        raise ConfigError(f"{what}: no file given")
    if not tf.io.gfile.exists(path):
        raise UserError(f"{what}: file {path!r} does not exist")
    if tf.io.gfile.isdir(path):
        raise UserError(f"{what}: {path!r} is a directory, not a text file")
    with tf.io.gfile.GFile(path, "r") as f:
        lines = [line.rstrip("\r\n") for line in f]
    if skip_empty:
        lines = [line for line in lines if line.strip()]
    if not any(line.strip() for line in lines):
        raise UserError(f"{what}: file {path!r} has no non-empty lines")
    return lines


class Vocabulary:
    """Maps tokens to ids and back."""

    def __init__(self, tokens: Sequence[str], level: str = "word") -> None:
        if level not in LEVELS:
            raise ConfigError(f"vocabulary level must be one of {', '.join(LEVELS)}, got {level!r}")
        self._tokens = list(SPECIAL_TOKENS) + [t for t in tokens if t not in SPECIAL_TOKENS]
        self._ids = {t: i for i, t in enumerate(self._tokens)}
        self._level = level

    @classmethod
    def symbols(cls, size: int) -> Vocabulary:
        """Synthetic tokens '0', '1', ... filling ``size`` ids (specials included)."""
        if size <= NUM_SPECIAL:
            raise ConfigError(f"vocabulary size must be > {NUM_SPECIAL}, got {size}")
        return cls([str(i) for i in range(size - NUM_SPECIAL)])

    @classmethod
    def build(cls, lines: Iterable[str], size: int, level: str = "word") -> Vocabulary:
        """The ``size - 4`` most frequent tokens of ``lines``."""
        if size <= NUM_SPECIAL:
            raise ConfigError(f"vocabulary size must be > {NUM_SPECIAL}, got {size}")
        counts = collections.Counter(t for line in lines for t in tokenize(line, level))
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return cls([t for t, _ in ranked[: size - NUM_SPECIAL]], level)

    @classmethod
    def from_params(cls, p: Params, lines: Iterable[str] | None = None) -> Vocabulary:
        """The vocabulary ``vocab_params`` describe; ``lines`` (default: ``p.file``'s) build it."""
        kind = p.get("type") if "type" in p else "built"
        if kind not in TYPES:
            raise ConfigError(f"vocab.type must be one of {', '.join(TYPES)}, got {kind!r}")
        if kind == "sentencepiece":
            from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary

            return SentencePieceVocabulary.from_params(p)
        if not p.file:
            return cls.symbols(p.size)
        if lines is None:
            lines = [line for path in p.file.split(",") for line in read_lines(path.strip(), "vocabulary")]
        return cls.build(lines, p.size, p.level)

    @property
    def size(self) -> int:
        return len(self._tokens)

    @property
    def level(self) -> str:
        return self._level

    def token(self, token_id: int) -> str:
        return self._tokens[token_id] if 0 <= token_id < len(self._tokens) else SPECIAL_TOKENS[UNK_ID]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS); unknown tokens are UNK_ID."""
        return [self._ids.get(t, UNK_ID) for t in tokenize(text, self._level)]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` up to the first EOS, skipping pad and BOS."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            out.append(self.token(i))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (stops at EOS): words joined by spaces, characters by nothing."""
        return (" " if self._level == "word" else "").join(self.tokens(ids))


def tokenize(text: str, level: str) -> list[str]:
    if level == "char":
        return list(" ".join(text.split()))  # runs of whitespace become one space token
    return text.split()
