"""The bundled MT corpus and its SentencePiece model are what ``python -m tasks.mt.corpus`` writes, and
the made-up language reorders: its translation is no word-for-word copy."""

from __future__ import annotations

import random
from pathlib import Path

from tasks.mt import corpus


def test_the_generator_rebuilds_the_bundled_files_byte_for_byte(tmp_path):
    train, dev = corpus.write_corpus(str(tmp_path))
    model = corpus.write_model(train, str(tmp_path / corpus.MODEL))
    for path in (train, dev, model):
        assert Path(path).read_bytes() == Path(corpus.DATA, Path(path).name).read_bytes(), path


def test_the_target_language_has_its_own_word_order():
    lex = corpus.lexicon()
    assert len(set(lex.values())) == len(lex)  # one invented word per English word
    rng = random.Random(0)
    pairs = [corpus.pair(rng, lex) for _ in range(50)]
    reordered = 0
    for english, target in pairs:
        words = english.rstrip(".").replace(",", "").lower().split()
        translated = target.rstrip(".").replace(",", "").lower().split()
        assert sorted(lex[w] for w in words) == sorted(translated)  # the same words, translated
        reordered += [lex[w] for w in words] != translated
    assert reordered > 40
