"""What the Transformer experiments share: the model-size and learner knobs, and ``task()``.

``TransformerLmExperiment`` serves lm.synthetic.TransformerLM (and its GPipe, local and mesh variants)
and lm.text.TextTransformerLM; ``TransformerMtExperiment`` serves mt.algorithmic.ReverseTransformer
and mt.text.Transformer. A registered experiment adds its data knobs, sets ``self.vocab`` and returns
its inputs' Params; it passes the shared knobs on with ``**kwargs`` (gin binds them on the registered
class, ``TransformerLM.model_dim = 128``, since knobs follow ``**kwargs`` into the bases), and names a
shared knob itself where its default differs. These bases are not registered: they are no experiment.
"""

from __future__ import annotations

from params.experiment import Experiment
from params.hyperparams import Params
from tasks.lm.model import transformer_lm_params
from tasks.mt.model import transformer_mt_params


class TransformerExperiment(Experiment):
    """Model size, batch size and the learner: Adam (beta2 0.98) with linear warm-up then cosine
    decay over ``max_steps``, the gradient's global norm clipped to 1. A subclass sets how often it
    saves, writes summaries and logs (steps)."""

    SAVE_INTERVAL_STEPS = 250
    SUMMARY_INTERVAL_STEPS = 50
    LOG_INTERVAL_STEPS = 100
    vocab: Params  # set by the subclass: the task's vocabulary Params

    def __init__(
        self,
        model_dim: int = 64,
        num_heads: int = 4,
        hidden_dim: int = 256,
        num_layers: int = 2,
        dropout_prob: float = 0.0,
        batch_size: int = 32,
        learning_rate: float = 2e-3,
        warmup_steps: int = 100,
        max_steps: int = 1000,
    ) -> None:
        self.model_dim = model_dim
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.dropout_prob = dropout_prob
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.warmup_steps = warmup_steps
        self.max_steps = max_steps

    def _set_learner(self, train: Params) -> None:
        train.set(
            optimizer="adam",
            learning_rate=self.learning_rate,
            beta2=0.98,
            lr_schedule="linear_cosine",
            warmup_steps=self.warmup_steps,
            max_steps=self.max_steps,
            clip_gradient_norm_to_value=1.0,
            save_interval_steps=self.SAVE_INTERVAL_STEPS,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            log_interval_steps=self.LOG_INTERVAL_STEPS,
        )


class TransformerLmExperiment(TransformerExperiment):
    """A causal Transformer LM (tied softmax) on sequences of ``seq_length`` tokens."""

    def __init__(self, seq_length: int = 32, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seq_length = seq_length

    def task(self) -> Params:
        p = transformer_lm_params(
            self.vocab,
            model_dim=self.model_dim,
            num_heads=self.num_heads,
            hidden_dim=self.hidden_dim,
            num_layers=self.num_layers,
            dropout_prob=self.dropout_prob,
            max_length=self.seq_length,
        )
        self._set_learner(p.train)
        return p


class TransformerMtExperiment(TransformerExperiment):
    """An encoder-decoder Transformer (``num_layers`` each side, shared embeddings, tied softmax),
    trained with label smoothing and beam-decoded."""

    def __init__(self, label_smoothing: float = 0.1, beam_size: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.label_smoothing = label_smoothing
        self.beam_size = beam_size

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
        self._set_learner(p.train)
        return p
