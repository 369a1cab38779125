"""Translation on your own parallel text: ``source<TAB>target`` lines (a bundled corpus by default).

    .venv/bin/python -m trainer --model=mt.text.Transformer --logdir=runs/text_mt \\
        --gin_param="Transformer.train_file='my_train.tsv'" \\
        --gin_param="Transformer.dev_file='my_dev.tsv'" \\
        --gin_param="Transformer.vocab_file='vocab/my.model'"

The defaults read ``tasks/mt/data/stories_{train,dev}.tsv`` (2000 and 100 pairs: sentences of the
seeded grammar of ``tasks.lm.grammar`` and their translation into a made-up language with its own
word order, written by ``python -m tasks.mt.corpus``) with the bundled SentencePiece model
``tasks/mt/data/stories.model`` (500 BPE pieces shared by both sides, trained by the same command), so
the experiment runs from a clean clone without downloads. ``level='word'`` or ``'char'`` keeps the small
vocabularies built from ``train_file``.
"""

from __future__ import annotations

import os

from params import registry
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.vocabulary import LEVELS, experiment_vocab
from tasks.mt.input import TextMtInput
from tasks.transformer_experiment import TransformerMtExperiment

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SUBWORD = "sentencepiece"


@registry.register
class Transformer(TransformerMtExperiment):
    """A small encoder-decoder Transformer on tab-separated source/target lines (default: the bundled
    corpus, SentencePiece pieces).

    ``train_file`` is read for training, ``dev_file`` evaluated and beam-decoded (BLEU, exact match).
    Both sides share the vocabulary ``vocab_file`` (a SentencePiece model, ``python -m tools.vocab``;
    ``vocab_size`` 0 takes its piece count). ``level`` 'word' or 'char' builds a vocabulary of the
    ``vocab_size - 4`` most frequent words or characters of ``train_file`` (both sides) instead.
    Training rows are packed (``packing``: several pairs per row, segment ids keep them apart) to
    ``max_length + 1`` positions a side; longer sources and targets are cut to ``max_length``. Setting
    these knobs with gin changes every Params that names the file (``input.train.file``,
    ``input.*.vocab.file``, ``task.vocab.file``); the same keys can be set with ``--params_override``
    one by one.
    """

    SAVE_INTERVAL_STEPS = 200
    SUMMARY_INTERVAL_STEPS = 25
    LOG_INTERVAL_STEPS = 50

    def __init__(
        self,
        train_file: str = os.path.join(DATA, "stories_train.tsv"),
        dev_file: str = os.path.join(DATA, "stories_dev.tsv"),
        level: str = SUBWORD,
        vocab_file: str = os.path.join(DATA, "stories.model"),
        vocab_size: int = 0,
        max_length: int = 48,
        packing: bool = True,
        warmup_steps: int = 50,
        max_steps: int = 400,
        **kwargs,
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, max_steps=max_steps, **kwargs)
        levels = (SUBWORD, *LEVELS)
        if (
            level not in levels
            or (level != SUBWORD and vocab_size <= 4)
            or min(max_length, self.model_dim, self.num_layers, self.batch_size) < 1
        ):
            raise ConfigError(
                f"mt.text.Transformer: level must be one of {', '.join(levels)}, vocab_size > 4 for word "
                "or char, and max_length, model_dim, num_layers, batch_size >= 1"
            )
        self.train_file, self.dev_file = train_file, dev_file
        self.vocab = experiment_vocab(level, vocab_size, vocab_file, train_file)
        self.max_length = max_length
        self.packing = packing

    def _input(self, split: str, path: str) -> Params:
        p = TextMtInput.Params().set(
            name=split,
            file=path,
            vocab=self.vocab.copy(),
            max_length=self.max_length,
            batch_size=self.batch_size,
            packing=self.packing and split == "train",  # decoding needs one pair a row
        )
        return set_split_mode(p, split, shuffle_seed=701)

    def train(self) -> Params:
        return self._input("train", self.train_file)

    def dev(self) -> Params:
        return self._input("dev", self.dev_file)
