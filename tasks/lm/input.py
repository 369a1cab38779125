"""Language-model inputs: a synthetic Markov-chain corpus with a known entropy rate, and one
sentence per line of a user's text file.

Every example has ``seq_length`` positions: ``ids`` (BOS then the tokens), ``labels`` (the tokens,
then EOS for text), ``paddings`` (1.0 past the end). The synthetic input adds ``label_entropy``: the
entropy of the distribution each label was drawn from, so the task can report how far its
log-perplexity is from the best achievable one.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from params.errors import ConfigError
from params.hyperparams import InstantiableParams
from tasks.base_input import BaseInput
from tasks.lm import markov, vocabulary
from tasks.lm.vocabulary import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, Vocabulary


def _check_positive(p: InstantiableParams, name: str) -> None:
    value = p.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"input {p.name!r}: {name} must be a positive int, got {value!r}")


class SyntheticLmInput(BaseInput):
    """Sequences from a random sparse Markov chain (``tasks.lm.markov``); chain state s is token id
    s + 4 (after the special ids)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("num_states", 32, "Symbols of the chain (vocabulary size is num_states + 4).")
        p.define("num_successors", 4, "Successors of each state (with random probabilities).")
        p.define("concentration", 1.0, "Dirichlet concentration of each state's successor probabilities.")
        p.define("chain_seed", 1234, "Seed of the chain (the same for every split).")
        p.define("seq_length", 32, "Tokens per sequence.")
        p.define("num_sequences", 10000, "Sequences in this split.")
        p.define("data_seed", 1, "Seed of the sequences (use a different one for each split).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        for name in ("num_states", "num_successors", "seq_length", "num_sequences"):
            _check_positive(self.params, name)

    @property
    def vocab_size(self) -> int:
        return self.params.num_states + NUM_SPECIAL

    def chain(self) -> markov.MarkovChain:
        p = self.params
        return markov.make_markov_chain(p.num_states, p.num_successors, p.chain_seed, p.concentration)

    def achievable_log_pplx(self) -> float:
        """The best expected per-token log-perplexity (nats) on this input's sequences."""
        return markov.achievable_log_pplx(self.chain(), self.params.seq_length)

    def arrays(self) -> dict[str, np.ndarray]:
        """The whole split as NumPy arrays ``[num_sequences, seq_length]``."""
        p = self.params
        chain = self.chain()
        states = markov.sample(chain, p.num_sequences, p.seq_length, p.data_seed)
        labels = (states + NUM_SPECIAL).astype(np.int32)
        ids = np.concatenate([np.full((p.num_sequences, 1), BOS_ID, np.int32), labels[:, :-1]], axis=1)
        return {
            "ids": ids,
            "labels": labels,
            "paddings": np.zeros(labels.shape, np.float32),
            "label_entropy": markov.token_entropies(chain, states).astype(np.float32),
        }

    def examples(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.arrays())


def encode_lm_lines(lines: list[str], vocab: Vocabulary, seq_length: int) -> dict[str, np.ndarray]:
    """One example per line: ids = BOS + tokens, labels = tokens + EOS, cut and padded to seq_length."""
    n = len(lines)
    ids = np.full((n, seq_length), PAD_ID, np.int32)
    labels = np.full((n, seq_length), PAD_ID, np.int32)
    paddings = np.ones((n, seq_length), np.float32)
    for row, line in enumerate(lines):
        tokens = vocab.encode(line)
        target = (tokens + [EOS_ID])[:seq_length]
        source = ([BOS_ID] + tokens)[: len(target)]
        ids[row, : len(source)] = source
        labels[row, : len(target)] = target
        paddings[row, : len(target)] = 0.0
    return {"ids": ids, "labels": labels, "paddings": paddings}


class TextLmInput(BaseInput):
    """One example per non-empty line of ``file``; the vocabulary is built from ``vocab.file`` (the
    training split), so dev and test use the training vocabulary."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file", "", "Text file, one sentence per line (any tf.io.gfile path).")
        p.define("vocab", vocabulary.vocab_params(size=1000), "Vocabulary (built from vocab.file).")
        p.define("seq_length", 64, "Positions per example (longer lines are cut).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        _check_positive(self.params, "seq_length")
        if not self.params.vocab.file:
            raise ConfigError(f"input {self.params.name!r}: vocab.file (the training text) must be set")

    def arrays(self) -> dict[str, np.ndarray]:
        p = self.params
        vocab = Vocabulary.from_params(p.vocab)
        return encode_lm_lines(vocabulary.read_lines(p.file, f"input {p.name!r}"), vocab, p.seq_length)

    def examples(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.arrays())
