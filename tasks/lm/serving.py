"""Text <-> ids in TensorFlow ops, for exported sequence models: what ``Vocabulary.encode`` and
``Vocabulary.decode`` do in Python, as graph ops a SavedModel carries (no Python needed to serve it).
``text_codec`` picks ``TextCodec`` (built word/char vocabularies: a lookup table) or
``SentencePieceCodec`` (tensorflow_text's in-graph SentencePiece ops).
"""

from __future__ import annotations

import tensorflow as tf

from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary
from tasks.lm.vocabulary import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, UNK_ID, Vocabulary


class TextCodec(tf.Module):
    """A vocabulary as a lookup table (text -> ids) and a token list (ids -> text)."""

    def __init__(self, vocab: Vocabulary, num_ids: int) -> None:
        super().__init__(name="text_codec")
        tokens = [vocab.token(i) for i in range(vocab.size)]
        self._level = vocab.level
        self._table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(tokens[NUM_SPECIAL:], tf.string),
                tf.range(NUM_SPECIAL, len(tokens), dtype=tf.int32),
            ),
            default_value=UNK_ID,
        )
        self._id_tokens = tf.constant([vocab.token(i) for i in range(num_ids)], tf.string)

    def encode(self, texts: tf.Tensor, width: int) -> tf.Tensor:
        """``[batch]`` strings -> ``[batch, width]`` ids: tokens cut to ``width - 1``, EOS, then pad."""
        if self._level == "char":
            normalized = tf.strings.regex_replace(tf.strings.strip(texts), r"\s+", " ")
            tokens = tf.strings.unicode_split(normalized, "UTF-8")
        else:
            tokens = tf.strings.split(texts)
        ids = tf.ragged.map_flat_values(self._table.lookup, tokens)[:, : width - 1]
        eos = tf.fill([tf.shape(texts)[0], 1], EOS_ID)
        ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
        return ids.to_tensor(default_value=PAD_ID, shape=[None, width])

    def decode(self, ids: tf.Tensor) -> tf.Tensor:
        """``[batch, length]`` ids -> ``[batch]`` strings: tokens up to the first EOS, pad and BOS
        skipped, joined by spaces (word level) or nothing (char level)."""
        ids = tf.cast(ids, tf.int32)
        keep = content_mask(ids)
        safe = tf.where((ids >= 0) & (ids < tf.shape(self._id_tokens)[0]), ids, UNK_ID)
        tokens = tf.ragged.boolean_mask(tf.gather(self._id_tokens, safe), keep)
        return tf.strings.reduce_join(tokens, axis=1, separator=" " if self._level == "word" else "")


def fixed_width(ids: tf.Tensor, width: int) -> tf.Tensor:
    """``[batch, n]`` ids cut or zero-padded to ``[batch, width]``."""
    ids = tf.cast(ids, tf.int32)[:, :width]
    ids = tf.pad(ids, [[0, 0], [0, width - tf.shape(ids)[1]]])
    return tf.ensure_shape(ids, [None, width])


class SentencePieceCodec(tf.Module):
    """A SentencePiece model in the graph (``tensorflow_text.SentencepieceTokenizer``): a SavedModel
    holding it loads in any TensorFlow program that has run ``import tensorflow_text``."""

    def __init__(self, model: bytes) -> None:
        super().__init__(name="sentencepiece_codec")
        import tensorflow_text as tf_text

        self.tokenizer = tf_text.SentencepieceTokenizer(model=model, out_type=tf.int32)

    def pieces(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """``[batch]`` strings -> ragged piece ids (no BOS/EOS)."""
        return self.tokenizer.tokenize(texts)

    def encode(self, texts: tf.Tensor, width: int) -> tf.Tensor:
        """``[batch]`` strings -> ``[batch, width]`` ids: pieces cut to ``width - 1``, EOS, then pad."""
        ids = self.pieces(texts)[:, : width - 1]
        eos = tf.RaggedTensor.from_tensor(tf.fill([tf.shape(texts)[0], 1], EOS_ID))
        return tf.concat([ids, eos], axis=1).to_tensor(default_value=PAD_ID, shape=[None, width])

    def decode(self, ids: tf.Tensor) -> tf.Tensor:
        """``[batch, length]`` ids -> ``[batch]`` strings (up to the first EOS; pad and BOS skipped)."""
        return self.tokenizer.detokenize(tf.ragged.boolean_mask(ids, content_mask(ids)))


def content_mask(ids: tf.Tensor) -> tf.Tensor:
    """Where ``ids`` hold text: before the first EOS, and neither pad nor BOS."""
    before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
    return before_eos & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)


def text_codec(vocab: Vocabulary | SentencePieceVocabulary, num_ids: int) -> TextCodec | SentencePieceCodec:
    """The graph codec of a task's vocabulary (built or SentencePiece)."""
    if isinstance(vocab, SentencePieceVocabulary):
        return SentencePieceCodec(vocab.model)
    return TextCodec(vocab, num_ids)
