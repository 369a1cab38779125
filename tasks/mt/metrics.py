"""Decoder metrics of sequence tasks: corpus BLEU (sacrebleu) and exact match."""

from __future__ import annotations

import sacrebleu

from tasks.base_task import DecoderMetric


class CorpusBleuMetric(DecoderMetric):
    """sacrebleu's corpus BLEU (0-100) over every (hypothesis, reference) pair added.

    Both sides are strings of tokens separated by spaces and are scored as they are
    (``tokenize='none'``), so BLEU counts n-grams of the model's own tokens.
    """

    def __init__(self) -> None:
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
        return float(sacrebleu.corpus_bleu(self._hypotheses, [self._references], tokenize="none").score)
