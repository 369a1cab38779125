"""Language models on your own text: sentences, one per line, in many files (a bundled corpus by default).

    .venv/bin/python -m trainer --model=lm.text.TextTransformerLM --logdir=runs/text_lm \\
        --gin_param="TextTransformerLM.train_files='corpus/train-*.tfrecord'" \\
        --gin_param="TextTransformerLM.vocab_file='vocab/corpus.model'"

The defaults read ``tasks/lm/data/stories_{train,dev}.txt`` (3000 and 300 sentences from the seeded
grammar of ``tasks.lm.grammar``) with the bundled SentencePiece model ``tasks/lm/data/stories.model``
(160 pieces, trained by ``python -m tools.vocab`` on the training file), so the experiment runs from a
clean clone without downloads. ``level='word'`` or ``'char'`` keeps the small built vocabularies (one
example per line of ``train_files``, a single file).
"""

from __future__ import annotations

import os

from params import registry
from params.errors import ConfigError
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.input import BATCHINGS, CorpusLmInput, TextLmInput
from tasks.lm.vocabulary import LEVELS, experiment_vocab
from tasks.transformer_experiment import TransformerLmExperiment

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
SUBWORD = "sentencepiece"


@registry.register
class TextTransformerLM(TransformerLmExperiment):
    """A small causal Transformer LM on a text corpus (default: the bundled one, SentencePiece pieces).

    ``train_files`` (globs separated by commas; text lines or shards of ``python -m tools.make_shards``,
    told apart by ``file_format``: 'auto' (names with '.tfrecord' are shards), 'text' or 'tfrecord')
    are read in parallel, tokenized in the graph by ``vocab_file``
    and packed ``batching='pack'`` (or ``bucket``, ``pad``) into rows of ``seq_length``; ``dev_files``
    are evaluated and decoded one sentence per row (each sentence's first ``prompt_length`` pieces
    continued greedily, ``num_dev_samples`` of them). ``vocab_size`` 0 takes the model's piece count.
    ``level`` 'word' or 'char' builds the old small vocabulary of ``vocab_size`` from ``train_files``
    instead. (Named TextTransformerLM so that gin's short name ``TransformerLM`` keeps meaning
    lm.synthetic.TransformerLM.)
    """

    SAVE_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 25
    LOG_INTERVAL_STEPS = 50

    def __init__(
        self,
        train_files: str = os.path.join(DATA, "stories_train.txt"),
        dev_files: str = os.path.join(DATA, "stories_dev.txt"),
        file_format: str = "auto",
        level: str = SUBWORD,
        vocab_file: str = os.path.join(DATA, "stories.model"),
        vocab_size: int = 0,
        seq_length: int = 128,
        batching: str = "pack",
        prompt_length: int = 4,
        num_dev_samples: int = 64,
        batch_size: int = 16,
        warmup_steps: int = 50,
        max_steps: int = 300,
        **kwargs,
    ) -> None:
        super().__init__(
            seq_length=seq_length,
            batch_size=batch_size,
            warmup_steps=warmup_steps,
            max_steps=max_steps,
            **kwargs,
        )
        levels = (SUBWORD, *LEVELS)
        if (
            level not in levels
            or batching not in BATCHINGS
            or min(seq_length, self.model_dim, self.num_layers, self.batch_size) < 1
            or (level != SUBWORD and vocab_size <= 4)
        ):
            raise ConfigError(
                f"lm.text.TextTransformerLM: level must be one of {', '.join(levels)}, batching one of "
                f"{', '.join(BATCHINGS)}, vocab_size > 4 for word or char, and seq_length, model_dim, "
                "num_layers, batch_size >= 1"
            )
        self.train_files, self.dev_files, self.file_format = train_files, dev_files, file_format
        self.level, self.batching = level, batching
        self.vocab = experiment_vocab(level, vocab_size, vocab_file, train_files)
        self.prompt_length = prompt_length
        self.num_dev_samples = num_dev_samples

    def task(self) -> Params:
        p = super().task()
        p.decode.prompt_length = self.prompt_length
        return p

    def _input(self, split: str, files: str) -> Params:
        if self.level == SUBWORD:
            p = CorpusLmInput.Params().set(
                file_pattern=files,
                file_format=self.file_format,
                batching=self.batching if split == "train" else "pad",
            )
        else:
            p = TextLmInput.Params().set(file=files)
        p.set(name=split, vocab=self.vocab.copy(), seq_length=self.seq_length, batch_size=self.batch_size)
        if split != "train":
            p.num_samples = self.num_dev_samples
        return set_split_mode(p, split, shuffle_seed=601)

    def train(self) -> Params:
        return self._input("train", self.train_files)

    def dev(self) -> Params:
        return self._input("dev", self.dev_files)
