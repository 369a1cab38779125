"""Experiments on algorithmic sequence-to-sequence data generated in-process (no download)."""

from __future__ import annotations

from params import registry
from params.errors import ConfigError
from params.experiment import Experiment
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.lm.vocabulary import vocab_params
from tasks.mt.input import AlgorithmicMtInput
from tasks.mt.model import transformer_mt_params


@registry.register
class ReverseTransformer(Experiment):
    """A small encoder-decoder Transformer reversing symbol strings of length 4-12 over 16 symbols.

    Knobs (gin: ``ReverseTransformer.model_dim = 128``): width, heads, feed-forward width, layers,
    dropout, batch size, Adam with linear warm-up then cosine decay over ``max_steps``, beam width.
    ``algorithm`` switches the data to sort, copy or noisy_copy.

    Measured through the trainer (``python -m trainer --model=mt.algorithmic.ReverseTransformer``,
    2 CPU cores): test BLEU 98.2 to 98.8 / exact match 0.94 to 0.96 at step 500, BLEU 100.0 / exact
    match 1.00 at the default 1000 steps; 39 s wall for the whole run on a quiet machine (3 min 9 s on
    a busy one), evaluation and decoding included.
    """

    def __init__(
        self,
        algorithm: str = "reverse",
        vocab_size: int = 20,
        min_length: int = 4,
        max_length: int = 12,
        model_dim: int = 64,
        num_heads: int = 4,
        hidden_dim: int = 256,
        num_layers: int = 2,
        dropout_prob: float = 0.0,
        label_smoothing: float = 0.1,
        batch_size: int = 64,
        learning_rate: float = 2e-3,
        warmup_steps: int = 200,
        max_steps: int = 1000,
        beam_size: int = 4,
        num_train_examples: int = 50000,
        num_eval_examples: int = 512,
    ) -> None:
        if min(vocab_size - 4, model_dim, num_heads, hidden_dim, num_layers, batch_size, max_steps) < 1:
            raise ConfigError(
                "ReverseTransformer: vocab_size must be > 4 and model_dim, num_heads, hidden_dim, "
                "num_layers, batch_size, max_steps >= 1"
            )
        self.algorithm = algorithm
        self.vocab = vocab_params(size=vocab_size)
        self.min_length = min_length
        self.max_length = max_length
        self.model_dim = model_dim
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.dropout_prob = dropout_prob
        self.label_smoothing = label_smoothing
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps
        self.beam_size = beam_size
        self.num_train_examples = num_train_examples
        self.num_eval_examples = num_eval_examples

    def task(self) -> Params:
        p = transformer_mt_params(
            self.vocab,
            model_dim=self.model_dim,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            num_encoder_layers=self.num_layers,
            num_decoder_layers=self.num_layers,
            dropout_prob=self.dropout_prob,
        )
        p.label_smoothing = self.label_smoothing
        p.decode.beam_size = self.beam_size
        p.train.set(
            optimizer="adam",
            learning_rate=self.learning_rate,
            beta2=0.98,
            lr_schedule="linear_cosine",
            warmup_steps=self.warmup_steps,
            max_steps=self.max_steps,
            clip_gradient_norm_to_value=1.0,
            save_interval_steps=500,
            summary_interval_steps=50,
            log_interval_steps=100,
        )
        return p

    def _input(self, split: str, seed: int, num_examples: int) -> Params:
        p = AlgorithmicMtInput.Params().set(
            name=split,
            algorithm=self.algorithm,
            vocab=self.vocab.copy(),
            min_length=self.min_length,
            max_length=self.max_length,
            num_examples=num_examples,
            data_seed=seed,
            batch_size=self.batch_size,
        )
        return set_split_mode(p, split, shuffle_seed=401)

    def train(self) -> Params:
        return self._input("train", 1, self.num_train_examples)

    def dev(self) -> Params:
        return self._input("dev", 2, self.num_eval_examples)

    def test(self) -> Params:
        return self._input("test", 3, self.num_eval_examples)
