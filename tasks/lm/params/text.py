"""Language models on your own text: one sentence per line of a file (a tiny bundled one by default).

    .venv/bin/python -m trainer --model=lm.text.TextTransformerLM --logdir=runs/text_lm \\
        --gin_param="TextTransformerLM.train_file='my_train.txt'" \\
        --gin_param="TextTransformerLM.dev_file='my_dev.txt'"

The default files, ``tasks/lm/data/numbers_{train,dev}.txt``, hold the English names of the numbers
0-999 (900 for training, 100 held out), so the experiment runs from a clean clone.
"""

from __future__ import annotations

import os

from params import registry
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.input import TextLmInput
from tasks.lm.vocabulary import LEVELS, vocab_params
from tasks.transformer_experiment import TransformerLmExperiment

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


@registry.register
class TextTransformerLM(TransformerLmExperiment):
    """A small causal Transformer LM on the lines of a text file (default: a bundled tiny one).

    ``train_file`` is read for training and for the vocabulary (its ``vocab_size - 4`` most frequent
    tokens, words or characters per ``level``); ``dev_file`` is evaluated and decoded (each line's first
    ``prompt_length`` tokens continued greedily). Setting these knobs with gin changes every Params that
    names the file (``input.train.file``, ``input.*.vocab.file``, ``task.vocab.file``); the same keys can
    be set with ``--params_override`` one by one. (Named TextTransformerLM so that gin's short name
    ``TransformerLM`` keeps meaning lm.synthetic.TransformerLM.)
    """

    SAVE_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 25
    LOG_INTERVAL_STEPS = 50

    def __init__(
        self,
        train_file: str = os.path.join(DATA, "numbers_train.txt"),
        dev_file: str = os.path.join(DATA, "numbers_dev.txt"),
        level: str = "word",
        vocab_size: int = 64,
        seq_length: int = 8,
        prompt_length: int = 2,
        warmup_steps: int = 50,
        max_steps: int = 300,
        **kwargs,
    ) -> None:
        super().__init__(seq_length=seq_length, warmup_steps=warmup_steps, max_steps=max_steps, **kwargs)
        if (
            level not in LEVELS
            or min(vocab_size - 4, seq_length, self.model_dim, self.num_layers, self.batch_size) < 1
        ):
            raise ConfigError(
                f"lm.text.TextTransformerLM: level must be one of {', '.join(LEVELS)}, vocab_size > 4 and "
                "seq_length, model_dim, num_layers, batch_size >= 1"
            )
        self.train_file, self.dev_file = train_file, dev_file
        self.vocab = vocab_params(size=vocab_size, file=train_file, level=level)
        self.prompt_length = prompt_length

    def task(self) -> Params:
        p = super().task()
        p.decode.prompt_length = self.prompt_length
        return p

    def _input(self, split: str, path: str) -> Params:
        p = TextLmInput.Params().set(
            name=split,
            file=path,
            vocab=self.vocab.copy(),
            seq_length=self.seq_length,
            batch_size=self.batch_size,
        )
        return set_split_mode(p, split, shuffle_seed=601)

    def train(self) -> Params:
        return self._input("train", self.train_file)

    def dev(self) -> Params:
        return self._input("dev", self.dev_file)
