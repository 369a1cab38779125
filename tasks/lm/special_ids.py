"""The ids every vocabulary of the project reserves: ``<pad>`` 0, ``<s>`` (BOS) 1, ``</s>`` (EOS) 2 and
``<unk>`` 3; real tokens follow. Built vocabularies (tasks/lm/vocabulary.py) and SentencePiece models
(tasks/lm/sentencepiece_vocab.py, trained with these ids) both take them from here."""

from __future__ import annotations

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
NUM_SPECIAL = len(SPECIAL_TOKENS)
