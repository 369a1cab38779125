"""A SentencePiece subword model as a ``Vocabulary``: the same ids in Python (``sentencepiece``) and in
the graph (``tensorflow_text.SentencepieceTokenizer``, see ``tasks.lm.serving``); and the training of
one (``train_model``: ``python -m tools.vocab``, and the bundled MT model, tasks/mt/corpus.py).

A model is usable when it was trained with this project's special ids (``<pad>`` 0, ``<s>`` 1, ``</s>``
2, ``<unk>`` 3; ``train_model`` does so) and its piece count equals ``vocab.size``.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable

import sentencepiece as spm
import tensorflow as tf

from params.errors import ConfigError, UserError
from params.hyperparams import Params
from tasks.lm.special_ids import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, UNK_ID
from tasks.readers import file_lines

SPECIAL_IDS = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}


def train_model(
    files: list[str],
    vocab_size: int,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_lines: int = 1_000_000,
    normalization: str = "nmt_nfkc",
) -> bytes:
    """A serialized SentencePiece model trained on ``files`` with this project's special ids."""
    if vocab_size <= NUM_SPECIAL:
        raise ConfigError(f"--vocab_size must be > {NUM_SPECIAL} (the special ids), got {vocab_size}")
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
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            minloglevel=2,
        )
    except RuntimeError as e:  # e.g. "Vocabulary size too high (N). Please set it to a value <= M."
        raise UserError(str(e).split("] ", 1)[-1]) from None
    return model.getvalue()


def read_model(path: str) -> bytes:
    """The serialized model at ``path`` (any tf.io.gfile path); missing -> UserError."""
    if not path:
        raise ConfigError(
            "vocab.file: a sentencepiece vocabulary needs its .model file (python -m tools.vocab)"
        )
    if not tf.io.gfile.exists(path):
        raise UserError(f"vocab.file {path!r} does not exist (train one with python -m tools.vocab)")
    if tf.io.gfile.isdir(path):
        raise UserError(f"vocab.file {path!r} is a directory, not a SentencePiece .model file")
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def load_processor(model: bytes, what: str) -> spm.SentencePieceProcessor:
    """The processor of a serialized model whose special ids are this project's."""
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model)
    except (RuntimeError, OSError) as e:
        raise UserError(f"{what}: not a SentencePiece model ({e})") from None
    found = {"pad": sp.pad_id(), "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}
    if found != SPECIAL_IDS:
        raise UserError(
            f"{what}: special ids {found} differ from this project's {SPECIAL_IDS} "
            "(train the model with python -m tools.vocab)"
        )
    return sp


def model_size(path: str) -> int:
    """Pieces of the model at ``path`` (what ``vocab.size`` must be)."""
    return load_processor(read_model(path), f"vocab.file {path!r}").GetPieceSize()


class SentencePieceVocabulary:
    """``Vocabulary``'s interface over a SentencePiece model (``level`` is 'sentencepiece')."""

    level = "sentencepiece"

    def __init__(self, model: bytes, what: str = "vocabulary") -> None:
        self.model = model
        self._sp = load_processor(model, what)

    @classmethod
    def from_params(cls, p: Params) -> SentencePieceVocabulary:
        vocab = cls(read_model(p.file), f"vocab.file {p.file!r}")
        if vocab.size != p.size:
            raise ConfigError(
                f"vocab.size is {p.size} but the SentencePiece model {p.file!r} has {vocab.size} pieces: "
                f"set vocab.size = {vocab.size} (every Params naming this vocabulary)"
            )
        return vocab

    @property
    def size(self) -> int:
        return self._sp.GetPieceSize()

    def token(self, token_id: int) -> str:
        return self._sp.IdToPiece(int(token_id)) if 0 <= token_id < self.size else "<unk>"

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no BOS/EOS)."""
        return list(self._sp.EncodeAsIds(text))

    def encode_all(self, texts: list[bytes]) -> list[list[int]]:
        """Piece ids of each of ``texts`` (raw UTF-8 bytes, as tensorflow_text's op reads them; no
        BOS/EOS), in one call of the library."""
        return self._sp.encode(texts)

    def tokens(self, ids: Iterable[int]) -> list[str]:
        """Pieces of ``ids`` up to the first EOS, skipping pad and BOS."""
        return [self.token(i) for i in _content(ids)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (stops at EOS)."""
        return self._sp.DecodeIds([i for i in _content(ids) if i < self.size])


def _content(ids: Iterable[int]) -> list[int]:
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


def use_kept_copies(root: Params, logdir: str) -> list[str]:
    """Points every sentencepiece ``vocab.file`` of ``root`` that no longer exists at the run's copy
    beside params.txt (``BaseInput.files_to_keep``); returns the Params paths it changed."""
    changed: list[str] = []

    def visit(node: Params, path: str) -> None:
        if "type" in node and "file" in node and node.get("type") == "sentencepiece":
            kept = logdir.rstrip("/") + "/" + os.path.basename(node.file)
            if node.file and not tf.io.gfile.exists(node.file) and tf.io.gfile.exists(kept):
                node.file = kept
                changed.append(path)
        for name in node.names():
            value = node.get(name)
            for child in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(child, Params):
                    visit(child, f"{path}.{name}" if path else name)

    visit(root, "")
    return changed
