"""Translation on your own parallel text: ``source<TAB>target`` lines (a tiny bundled file by default).

    .venv/bin/python -m trainer --model=mt.text.Transformer --logdir=runs/text_mt \\
        --gin_param="Transformer.train_file='my_train.tsv'" \\
        --gin_param="Transformer.dev_file='my_dev.tsv'"

The default files, ``tasks/mt/data/numbers_{train,dev}.tsv``, pair the English names of the numbers
0-999 with their digits (``six hundred twenty seven<TAB>6 2 7``; 900 for training, 100 held out), so
the experiment runs from a clean clone.
"""

from __future__ import annotations

import os

from params import registry
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.vocabulary import LEVELS, vocab_params
from tasks.mt.input import TextMtInput
from tasks.transformer_experiment import TransformerMtExperiment

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")


@registry.register
class Transformer(TransformerMtExperiment):
    """A small encoder-decoder Transformer on tab-separated source/target lines (default: a bundled file).

    ``train_file`` is read for training and for the shared vocabulary (both sides' ``vocab_size - 4``
    most frequent tokens, words or characters per ``level``); ``dev_file`` is evaluated and
    beam-decoded (BLEU, exact match). Setting these knobs with gin changes every Params that names the
    file (``input.train.file``, ``input.*.vocab.file``, ``task.vocab.file``); the same keys can be set
    with ``--params_override`` one by one.
    """

    SAVE_INTERVAL_STEPS = 200
    SUMMARY_INTERVAL_STEPS = 25
    LOG_INTERVAL_STEPS = 50

    def __init__(
        self,
        train_file: str = os.path.join(DATA, "numbers_train.tsv"),
        dev_file: str = os.path.join(DATA, "numbers_dev.tsv"),
        level: str = "word",
        vocab_size: int = 64,
        max_length: int = 8,
        warmup_steps: int = 50,
        max_steps: int = 400,
        **kwargs,
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, max_steps=max_steps, **kwargs)
        if (
            level not in LEVELS
            or min(vocab_size - 4, max_length, self.model_dim, self.num_layers, self.batch_size) < 1
        ):
            raise ConfigError(
                f"mt.text.Transformer: level must be one of {', '.join(LEVELS)}, vocab_size > 4 and "
                "max_length, model_dim, num_layers, batch_size >= 1"
            )
        self.train_file, self.dev_file = train_file, dev_file
        self.vocab = vocab_params(size=vocab_size, file=train_file, level=level)
        self.max_length = max_length

    def _input(self, split: str, path: str) -> Params:
        p = TextMtInput.Params().set(
            name=split,
            file=path,
            vocab=self.vocab.copy(),
            max_length=self.max_length,
            batch_size=self.batch_size,
        )
        return set_split_mode(p, split, shuffle_seed=701)

    def train(self) -> Params:
        return self._input("train", self.train_file)

    def dev(self) -> Params:
        return self._input("dev", self.dev_file)
