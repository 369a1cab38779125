"""The Transformer language-model task: a causal decoder-only stack over one vocabulary.

Metrics: ``loss``, ``log_pplx`` (nats per token), ``token_accuracy`` and, when the input provides
``label_entropy`` (the synthetic Markov input does), ``achievable_log_pplx`` and ``log_pplx_gap``
(``log_pplx - achievable_log_pplx``, 0 for a perfect model). Decoding continues each example's first
``decode.prompt_length`` tokens greedily, one cached position per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from layers import beam_search
from layers.base_layer import BaseLayer, FPropContext
from layers.core import SoftmaxLayer
from layers.losses import tied_logits
from layers.parallel import mesh as mesh_lib
from layers.transformer_decoding import (
    cached_step_fn,
    full_prefix_step_fn,
    init_cached_state,
    init_full_prefix_state,
)
from layers.transformer_input import TransformerInput
from layers.transformer_stack import TransformerStack, stack_params
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params
from tasks.base_task import AverageMetric, BaseTask, DecoderMetric, Metrics, decode_params
from tasks.lm import vocabulary
from tasks.lm.metrics import metrics_from_sums, token_metrics, token_sums
from tasks.lm.vocabulary import BOS_ID, EOS_ID, PAD_ID, Vocabulary


def lm_decode_params() -> Params:
    p = decode_params()
    p.define("prompt_length", 8, "Tokens of each example given to the model before it continues.")
    p.define("max_length", 0, "Tokens per decoded sequence, prompt included (0: the batch's length).")
    p.define("use_cache", True, "Decode a step at the cost of one position (False: re-run the prefix).")
    return p


class TransformerLmTask(BaseTask):
    """Causal Transformer LM (pre-norm stack, optional tied softmax)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("vocab", vocabulary.vocab_params(size=36), "Vocabulary (the inputs use the same).")
        p.define("emb", TransformerInput.Params(), "Token and position embedding.")
        p.define("stack", TransformerStack.Params(), "Causal layers without cross-attention.")
        p.define("tie_softmax", True, "Output logits use the embedding matrix.")
        p.define("softmax", SoftmaxLayer.Params(), "Output layer when tie_softmax is False.")
        p.define("label_smoothing", 0.0, "Label smoothing of the training loss.")
        p.decode = lm_decode_params()
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        for i, layer in enumerate(p.stack.layers):
            if not layer.causal or layer.has_cross_attention:
                raise ConfigError(
                    f"{self.path}: stack.layers[{i}] must be causal and without cross-attention for a LM"
                )
        self.create_child("emb", p.emb.copy().set(vocab_size=p.vocab.size))
        self.create_child("stack", p.stack)
        if p.tie_softmax and self.stack.output_mesh is not None:
            raise ConfigError(
                f"{self.path}: tie_softmax uses the embedding (on the first stage's mesh) in the last "
                "stage, on another mesh (stack.pipeline.stage_mesh_shape); set tie_softmax : False"
            )
        if not p.tie_softmax:  # the logits run in the pipeline's last stage: on its mesh, if any
            with mesh_lib.mesh_scope(self.stack.output_mesh or self.mesh):
                self.create_child("softmax", p.softmax.copy().set(num_classes=p.vocab.size))
        self._vocab: Vocabulary | None = None

    @property
    def vocabulary(self) -> Vocabulary:
        if self._vocab is None:
            self._vocab = Vocabulary.from_params(self.params.vocab)
        return self._vocab

    def logits(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        if self.params.tie_softmax:
            return tied_logits(x, self.emb.emb_matrix())
        return self.softmax.logits(ctx, x)

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        x = self.emb(ctx, batch["ids"], batch.get("segment_pos"))
        y = self.stack(ctx, x, paddings=batch["paddings"], segment_ids=batch.get("segment_ids"))
        return {"logits": self.logits(ctx, y)}

    def fprop(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> Metrics:
        """The batch's metrics. With a pipelined stack the logits and per-token loss are computed in
        its last stage, one micro-batch at a time (labels, paddings and label entropies travel with
        the micro-batches), and summed over micro-batches: the same metrics, without the full
        batch's ``[batch, length, vocab]`` logits and their gradient alive at once."""
        if not self.stack.is_pipelined:
            return super().fprop(ctx, batch)
        x = self.emb(ctx, batch["ids"], batch.get("segment_pos"))
        targets = {"labels": batch["labels"], "paddings": batch["paddings"]}
        if "label_entropy" in batch:
            targets["label_entropy"] = batch["label_entropy"]
        smoothing = self.params.label_smoothing

        def head(ctx: FPropContext, y: tf.Tensor, t: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            logits = self.logits(ctx, y)
            return token_sums(logits, t["labels"], t["paddings"], smoothing, t.get("label_entropy"))

        sums = self.stack.fprop_with_head(
            ctx, x, head, targets, paddings=batch["paddings"], segment_ids=batch.get("segment_ids")
        )
        return metrics_from_sums(sums, self.stack.to_output_mesh(batch["paddings"]))

    def compute_loss(self, ctx: FPropContext, predictions: Any, batch: dict[str, tf.Tensor]) -> Metrics:
        metrics, weights = token_metrics(
            predictions["logits"], batch["labels"], batch["paddings"], self.params.label_smoothing
        )
        if "label_entropy" in batch:
            num_tokens = metrics["log_pplx"][1]
            best = tf.math.divide_no_nan(tf.reduce_sum(batch["label_entropy"] * weights), num_tokens)
            metrics["achievable_log_pplx"] = (best, num_tokens)
            metrics["log_pplx_gap"] = (metrics["log_pplx"][0] - best, num_tokens)
        return metrics

    # ------------------------------------------------------------------------------------ decoding
    def decode(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Greedy continuation of each example's prompt (its first prompt_length labels)."""
        p = self.params.decode
        labels = batch["labels"]
        max_length = p.max_length or labels.shape[1] or tf.shape(labels)[1]
        prompt_length = (
            min(p.prompt_length, int(max_length) - 1) if isinstance(max_length, int) else p.prompt_length
        )
        batch_size = tf.shape(labels)[0]
        hyp_ids = self._greedy(ctx, labels[:, :prompt_length], None, batch_size, max_length)
        return {
            "labels": labels,
            "paddings": batch["paddings"],
            "hyp_ids": hyp_ids,
            "prompt_length": tf.fill([batch_size], tf.constant(prompt_length, tf.int32)),
        }

    def _greedy(
        self,
        ctx: FPropContext,
        prompt: tf.Tensor,
        prompt_lengths: tf.Tensor | None,
        batch_size: tf.Tensor,
        max_length: int | tf.Tensor,
    ) -> tf.Tensor:
        """``[batch, max_length]`` ids: each row's prompt (its first ``prompt_lengths`` ids, default
        all of ``prompt``), then the model's greedy continuation up to EOS."""
        make_step = cached_step_fn if self.params.decode.use_cache else full_prefix_step_fn
        step = make_step(ctx, self.emb, self.stack, lambda y: self.logits(ctx, y))
        if prompt.shape[1] != 0:
            step = _force_prefix(step, prompt, self.params.vocab.size, prompt_lengths)
        if self.params.decode.use_cache:
            state = init_cached_state(self.stack, batch_size, max_length)
        else:
            state = init_full_prefix_state(batch_size, max_length)
        out = beam_search.greedy_search(step, state, batch_size, max_length, BOS_ID, EOS_ID, PAD_ID)
        return out["ids"]

    def create_decoder_metrics(self) -> dict[str, DecoderMetric]:
        return {"continuation_accuracy": AverageMetric()}

    def post_process_decode_out(
        self, decode_out: dict[str, np.ndarray], metrics: dict[str, DecoderMetric]
    ) -> list[dict[str, Any]]:
        """One record {prompt, reference, hypothesis} per example (reference and hypothesis are the
        continuations); ``continuation_accuracy`` counts positions where they agree."""
        vocab = self.vocabulary
        records = []
        for labels, paddings, hyp, n in zip(
            decode_out["labels"], decode_out["paddings"], decode_out["hyp_ids"], decode_out["prompt_length"]
        ):
            length = int(np.sum(paddings == 0))
            ref_cont, hyp_cont = labels[n:length], hyp[n:length]
            if "continuation_accuracy" in metrics and len(ref_cont):
                metrics["continuation_accuracy"].update(float(np.mean(ref_cont == hyp_cont)), len(ref_cont))
            records.append(
                {
                    "prompt": vocab.decode(labels[:n]),
                    "reference": vocab.decode(ref_cont),
                    "hypothesis": vocab.decode(hyp_cont),
                }
            )
        return records

    def inference(self, input_generator: Any) -> dict[str, Any]:
        """``serving_default``: ``ids [batch, n]`` (BOS then tokens) and ``paddings`` -> ``log_probs``
        ``[batch, n, vocab]`` of the next token at each position. ``greedy_continuation``: ``prompt
        [batch, decode.prompt_length]`` token ids -> ``ids [batch, length]``, the prompt then the greedy
        continuation (as the decoder job continues it) and ``text``, that continuation as text. With a
        SentencePiece vocabulary also ``generate``: ``text [batch]`` prompts (raw strings, tokenized in
        the graph) -> ``text``, each greedy continuation as a string, and ``ids``."""
        from tasks.lm import serving

        p = self.params.decode
        length = p.max_length or input_generator.dataset().element_spec["labels"].shape[1]
        prompt_length = min(p.prompt_length, length - 1)
        self._codec = serving.text_codec(self.vocabulary, self.params.vocab.size)
        ctx = FPropContext(training=False, seed=self.params.random_seed)
        ids_spec = tf.TensorSpec([None, None], tf.int32, name="ids")

        @tf.function(
            input_signature=[ids_spec, tf.TensorSpec([None, None], tf.float32, name="paddings")],
            autograph=False,
        )
        def log_probs(ids: tf.Tensor, paddings: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = self.compute_predictions(ctx, {"ids": ids, "paddings": paddings})["logits"]
            return {"log_probs": tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)}

        @tf.function(
            input_signature=[tf.TensorSpec([None, prompt_length], tf.int32, name="prompt")], autograph=False
        )
        def greedy_continuation(prompt: tf.Tensor) -> dict[str, tf.Tensor]:
            rows = tf.shape(prompt)[0]
            labels = tf.concat([prompt, tf.zeros([rows, length - prompt_length], tf.int32)], axis=1)
            out = self.decode(ctx, {"labels": labels, "paddings": tf.zeros([rows, length], tf.float32)})
            return {"ids": out["hyp_ids"], "text": self._codec.decode(out["hyp_ids"][:, prompt_length:])}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
        def generate(text: tf.Tensor) -> dict[str, tf.Tensor]:
            pieces = self._codec.pieces(text)[:, : length - 1]
            lengths = tf.cast(pieces.row_lengths(), tf.int32)
            prompt = pieces.to_tensor(default_value=PAD_ID, shape=[None, length - 1])
            ids = self._greedy(ctx, prompt, lengths, tf.shape(text)[0], length)
            continuation = tf.where(tf.range(length)[None, :] < lengths[:, None], PAD_ID, ids)
            return {"ids": ids, "text": self._codec.decode(continuation)}

        functions = {"serving_default": log_probs, "greedy_continuation": greedy_continuation}
        if hasattr(self._codec, "pieces"):  # a subword vocabulary: raw text in, text out
            functions["generate"] = generate
        return functions


def _force_prefix(
    step: beam_search.StepFn, forced: tf.Tensor, vocab_size: int, lengths: tf.Tensor | None = None
) -> beam_search.StepFn:
    """Wraps a step function so that for ``t < lengths`` (default: ``forced.shape[1]``, every row) it
    emits ``forced[:, t]`` (the model still runs, filling its cache) and afterwards lets the model
    choose."""
    prompt_length = forced.shape[1]

    def forcing_step(ids: tf.Tensor, time_step: tf.Tensor, state: Any) -> tuple[tf.Tensor, Any]:
        log_probs, state = step(ids, time_step, state)
        token = tf.gather(forced, tf.minimum(time_step, prompt_length - 1), axis=1)
        one_hot = tf.one_hot(token, vocab_size, on_value=0.0, off_value=beam_search.NEG_INF)
        if lengths is None:
            return tf.where(time_step < prompt_length, one_hot, log_probs), state
        return tf.where((time_step < lengths)[:, None], one_hot, log_probs), state

    return forcing_step


def transformer_lm_params(
    vocab: Params,
    model_dim: int = 64,
    num_heads: int = 4,
    hidden_dim: int = 256,
    num_layers: int = 2,
    dropout_prob: float = 0.0,
    max_length: int = 512,
    position: str = "sinusoidal",
) -> InstantiableParams:
    """A TransformerLmTask of the given size (tied softmax)."""
    p = TransformerLmTask.Params()
    p.vocab = vocab.copy()
    p.emb.set(
        vocab_size=vocab.size,
        model_dim=model_dim,
        position=position,
        max_length=max_length,
        dropout_prob=dropout_prob,
    )
    p.stack = stack_params(
        num_layers,
        model_dim,
        num_heads,
        hidden_dim,
        decoder=True,
        cross_attention=False,
        dropout_prob=dropout_prob,
    )
    p.softmax.set(input_dim=model_dim, num_classes=vocab.size)
    return p
