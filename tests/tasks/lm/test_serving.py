"""The graph codecs of exported sequence models give the ids and text the vocabularies give in Python:
a built word or char vocabulary as a lookup table, a SentencePiece model as tensorflow_text's ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tasks.lm import serving
from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary
from tasks.lm.vocabulary import EOS_ID, PAD_ID, Vocabulary
from tasks.mt.params.text import DATA

TEXTS = ["the fox slept", "a  fox sang quietly", "zebra"]


def _check(vocab, texts: list[str], width: int) -> None:
    codec = serving.text_codec(vocab, vocab.size)
    ids = codec.encode(tf.constant(texts), width).numpy()
    assert ids.shape == (len(texts), width)
    for text, row in zip(texts, ids):
        want = vocab.encode(text)[: width - 1] + [EOS_ID]
        np.testing.assert_array_equal(row, want + [PAD_ID] * (width - len(want)))
    decoded = [t.decode() for t in codec.decode(tf.constant(ids)).numpy()]
    assert decoded == [vocab.decode(row) for row in ids]


@pytest.mark.parametrize("level", ["word", "char"])
def test_built_vocabulary_codec_encodes_and_decodes_as_python(level):
    vocab = Vocabulary.build(["the fox slept", "a fox sang"], size=12, level=level)
    _check(vocab, TEXTS, width=8)  # "quietly", "zebra" (word) and unseen characters are <unk>


def test_sentencepiece_codec_encodes_and_decodes_as_python():
    vocab = SentencePieceVocabulary(Path(DATA, "stories.model").read_bytes())
    _check(vocab, [t.capitalize() + "." for t in TEXTS], width=6)  # the second one is cut
