"""Decoder metrics of sequence tasks: corpus BLEU (sacrebleu) and exact match."""

from __future__ import annotations

import sacrebleu

from tasks.base_task import DecoderMetric


class CorpusBleuMetric(DecoderMetric):
    """sacrebleu's corpus BLEU (0-100) over every (hypothesis, reference) pair added.

    With ``tokenize='none'`` both sides are strings of tokens separated by spaces, scored as they are,
    so BLEU counts n-grams of the model's own tokens (built word or symbol vocabularies); with
    ``'13a'`` they are detokenized text that sacrebleu tokenizes itself, the usual way to report
    BLEU of a subword model.
    """

    def __init__(self, tokenize: str = "none") -> None:
        self._tokenize = tokenize
        self._hypotheses: list[str] = []
        self._references: list[str] = []

    def add(self, hypothesis: str, reference: str) -> None:
        self._hypotheses.append(hypothesis)
        self._references.append(reference)

    def update(self, value: float, weight: float = 1.0) -> None:
        raise TypeError("CorpusBleuMetric takes (hypothesis, reference) strings: use add()")

    @property
    def num_sentences(self) -> int:
        return len(self._hypotheses)

    @property
    def value(self) -> float:
        if not self._hypotheses:
            return 0.0
        return float(
            sacrebleu.corpus_bleu(self._hypotheses, [self._references], tokenize=self._tokenize).score
        )
