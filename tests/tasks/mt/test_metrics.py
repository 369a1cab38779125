"""Decoder metrics: corpus BLEU agrees with sacrebleu itself."""

from __future__ import annotations

import pytest
import sacrebleu

from tasks.mt.metrics import CorpusBleuMetric

HYPS = ["5 6 7 8 9", "4 4 5", "10 11 12 13", "7 8"]
REFS = ["5 6 7 8 9", "4 5 5", "10 11 13 12", "7 8 9"]


def test_corpus_bleu_equals_sacrebleu():
    metric = CorpusBleuMetric()
    for h, r in zip(HYPS, REFS):
        metric.add(h, r)
    want = sacrebleu.corpus_bleu(HYPS, [REFS], tokenize="none").score
    assert metric.value == pytest.approx(want, rel=1e-9)
    assert 0 < metric.value < 100 and metric.num_sentences == 4


def test_corpus_bleu_extremes():
    perfect = CorpusBleuMetric()
    for r in REFS:
        perfect.add(r, r)
    assert perfect.value == pytest.approx(100.0)
    assert CorpusBleuMetric().value == 0.0
    with pytest.raises(TypeError, match="use add"):
        CorpusBleuMetric().update(1.0)


def test_corpus_bleu_of_detokenized_text_tokenizes_it_as_sacrebleu_does():
    hyps, refs = ["The fox slept.", "A miller sang, and it rained."], ["The fox slept.", "A miller sang."]
    metric = CorpusBleuMetric("13a")
    for h, r in zip(hyps, refs):
        metric.add(h, r)
    assert metric.value == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, rel=1e-9)
    # Without its tokenizer "slept." is one token, so the same text scores otherwise.
    assert metric.value != pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none").score)
