"""The encoder-decoder Transformer task: trained by label-smoothed cross-entropy, evaluated by
log-perplexity and token accuracy, decoded by greedy or beam search and scored by BLEU and exact match.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from layers import beam_search
from layers.base_layer import BaseLayer, FPropContext
from layers.core import SoftmaxLayer
from layers.losses import tied_logits
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
from tasks.mt.metrics import CorpusBleuMetric


def mt_decode_params() -> Params:
    """``task.decode`` of sequence tasks: the decoder-job settings plus the search."""
    p = decode_params()
    p.define("beam_size", 4, "Beam width; 1 is greedy search.")
    p.define("length_alpha", 0.6, "GNMT length-normalization exponent of beam scores (0: none).")
    p.define("max_length", 0, "Longest output, EOS included (0: the batch's target positions).")
    p.define("use_cache", True, "Decode a step at the cost of one position (False: re-run the whole prefix).")
    return p


class TransformerMtTask(BaseTask):
    """Encoder-decoder Transformer over one shared vocabulary (Vaswani et al. 2017, pre-norm)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("vocab", vocabulary.vocab_params(size=20), "Vocabulary (the inputs use the same).")
        p.define("src_emb", TransformerInput.Params(), "Source embedding (unused when shared).")
        p.define("tgt_emb", TransformerInput.Params(), "Target embedding (and source, when shared).")
        p.define("share_embeddings", True, "Source and target share tgt_emb (one child named emb).")
        p.define("encoder", TransformerStack.Params(), "Encoder stack (layers not causal).")
        p.define("decoder", TransformerStack.Params(), "Decoder stack (causal, cross-attention).")
        p.define("tie_softmax", True, "Output logits use the target embedding matrix.")
        p.define("softmax", SoftmaxLayer.Params(), "Output layer when tie_softmax is False.")
        p.define("label_smoothing", 0.1, "Label smoothing of the training loss.")
        p.decode = mt_decode_params()
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        vocab_size = p.vocab.size
        if p.share_embeddings:
            self.create_child("emb", p.tgt_emb.copy().set(vocab_size=vocab_size))
        else:
            self.create_child("src_emb", p.src_emb.copy().set(vocab_size=vocab_size))
            self.create_child("tgt_emb", p.tgt_emb.copy().set(vocab_size=vocab_size))
        self.create_child("encoder", p.encoder)
        self.create_child("decoder", p.decoder)
        if not p.tie_softmax:
            self.create_child("softmax", p.softmax.copy().set(num_classes=vocab_size))
        if p.decode.beam_size < 1:
            raise ConfigError(f"{self.path}: decode.beam_size must be >= 1, got {p.decode.beam_size}")
        self._vocab: Vocabulary | None = None

    @property
    def vocabulary(self) -> Vocabulary:
        """Built on first use (it may read the training file)."""
        if self._vocab is None:
            self._vocab = Vocabulary.from_params(self.params.vocab)
        return self._vocab

    def _source_embedding(self) -> TransformerInput:
        return self.emb if self.params.share_embeddings else self.src_emb

    def _target_embedding(self) -> TransformerInput:
        return self.emb if self.params.share_embeddings else self.tgt_emb

    def logits(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        if self.params.tie_softmax:
            return tied_logits(x, self._target_embedding().emb_matrix())
        return self.softmax.logits(ctx, x)

    def encode(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        """Encoder output ``[B, S, D]``."""
        x = self._source_embedding()(ctx, batch["src_ids"], batch.get("src_segment_pos"))
        return self.encoder(ctx, x, paddings=batch["src_paddings"], segment_ids=batch.get("src_segment_ids"))

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        source = self.encode(ctx, batch)
        y = self._target_embedding()(ctx, batch["tgt_ids"], batch.get("tgt_segment_pos"))
        y = self.decoder(
            ctx,
            y,
            paddings=batch["tgt_paddings"],
            source=source,
            source_paddings=batch["src_paddings"],
            segment_ids=batch.get("tgt_segment_ids"),
            source_segment_ids=batch.get("src_segment_ids"),
        )
        return {"logits": self.logits(ctx, y)}

    def fprop(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> Metrics:
        """The batch's metrics. With a pipelined decoder the logits and per-token loss are computed in
        its last stage, one micro-batch at a time (target labels and paddings travel with the
        micro-batches, like the encoder output), and summed over micro-batches."""
        if not self.decoder.is_pipelined:
            return super().fprop(ctx, batch)
        source = self.encode(ctx, batch)
        y = self._target_embedding()(ctx, batch["tgt_ids"], batch.get("tgt_segment_pos"))
        smoothing = self.params.label_smoothing

        def head(ctx: FPropContext, y: tf.Tensor, t: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            return token_sums(self.logits(ctx, y), t["labels"], t["paddings"], smoothing)

        sums = self.decoder.fprop_with_head(
            ctx,
            y,
            head,
            {"labels": batch["tgt_labels"], "paddings": batch["tgt_paddings"]},
            paddings=batch["tgt_paddings"],
            source=source,
            source_paddings=batch["src_paddings"],
            segment_ids=batch.get("tgt_segment_ids"),
            source_segment_ids=batch.get("src_segment_ids"),
        )
        return metrics_from_sums(sums, batch["tgt_paddings"])

    def compute_loss(self, ctx: FPropContext, predictions: Any, batch: dict[str, tf.Tensor]) -> Metrics:
        metrics, _ = token_metrics(
            predictions["logits"], batch["tgt_labels"], batch["tgt_paddings"], self.params.label_smoothing
        )
        return metrics

    # ------------------------------------------------------------------------------------ decoding
    def decode(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Greedy (beam_size 1) or beam search from the encoded source; best hypothesis per example."""
        if "src_segment_ids" in batch:
            raise ConfigError(f"{self.path}: decoding needs unpacked inputs (set the input's packing=False)")
        p = self.params.decode
        source = self.encode(ctx, batch)
        src_paddings = batch["src_paddings"]
        batch_size = tf.shape(source)[0]
        max_length = p.max_length or batch["tgt_labels"].shape[1] or tf.shape(batch["tgt_labels"])[1]
        k = p.beam_size
        if k > 1:
            source, src_paddings = beam_search.tile_beams((source, src_paddings), k)
        make_step = cached_step_fn if p.use_cache else full_prefix_step_fn
        step = make_step(
            ctx, self._target_embedding(), self.decoder, lambda y: self.logits(ctx, y), source, src_paddings
        )
        if p.use_cache:
            state = init_cached_state(self.decoder, batch_size, max_length)
        else:
            state = init_full_prefix_state(batch_size, max_length)
        if k > 1:
            out = beam_search.beam_search(
                step, state, batch_size, k, max_length, BOS_ID, EOS_ID, p.length_alpha, PAD_ID
            )
            hyp_ids, hyp_scores = out["ids"][:, 0], out["scores"][:, 0]
        else:
            out = beam_search.greedy_search(step, state, batch_size, max_length, BOS_ID, EOS_ID, PAD_ID)
            hyp_ids, hyp_scores = out["ids"], out["scores"]
        return {
            "src_ids": batch["src_ids"],
            "tgt_labels": batch["tgt_labels"],
            "hyp_ids": hyp_ids,
            "hyp_scores": hyp_scores,
        }

    def _subword(self) -> bool:
        vocab = self.params.vocab
        return "type" in vocab and vocab.type == "sentencepiece"

    def create_decoder_metrics(self) -> dict[str, DecoderMetric]:
        """BLEU of the detokenized text for a SentencePiece vocabulary (sacrebleu's 13a tokenizer),
        else of the vocabulary's tokens; exact match of the tokens."""
        bleu = CorpusBleuMetric("13a" if self._subword() else "none")
        return {"bleu": bleu, "exact_match": AverageMetric()}

    def post_process_decode_out(
        self, decode_out: dict[str, np.ndarray], metrics: dict[str, DecoderMetric]
    ) -> list[dict[str, Any]]:
        """One record {source, reference, hypothesis} per example; updates BLEU and exact match."""
        vocab = self.vocabulary
        records = []
        for src, ref, hyp in zip(decode_out["src_ids"], decode_out["tgt_labels"], decode_out["hyp_ids"]):
            ref_tokens, hyp_tokens = vocab.tokens(ref), vocab.tokens(hyp)
            record = {
                "source": vocab.decode(src),
                "reference": vocab.decode(ref),
                "hypothesis": vocab.decode(hyp),
            }
            if "bleu" in metrics:
                if self._subword():
                    metrics["bleu"].add(record["hypothesis"], record["reference"])
                else:
                    metrics["bleu"].add(" ".join(hyp_tokens), " ".join(ref_tokens))
            if "exact_match" in metrics:
                metrics["exact_match"].update(float(hyp_tokens == ref_tokens))
            records.append(record)
        return records

    def inference(self, input_generator: Any) -> dict[str, Any]:
        """``serving_default``: source ``text [batch]`` -> ``translation`` (text), ``ids`` and
        ``scores`` of the best hypothesis; ``translate_ids``: ``src_ids [batch, n]`` (tokens, EOS, 0
        padding, as in a batch) -> the same. Sources are padded to the input's source positions and
        decoded to its target positions (or decode.max_length), as the decoder job decodes them."""
        from tasks.lm import serving

        src_width = input_generator.source_positions
        tgt_width = self.params.decode.max_length or input_generator.target_positions
        self._codec = serving.text_codec(self.vocabulary, self.params.vocab.size)
        ctx = FPropContext(training=False, seed=self.params.random_seed)

        def translate(src_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            batch = {
                "src_ids": src_ids,
                "src_paddings": tf.cast(tf.equal(src_ids, PAD_ID), tf.float32),
                "tgt_labels": tf.zeros([tf.shape(src_ids)[0], tgt_width], tf.int32),
            }
            out = self.decode(ctx, batch)
            return {
                "translation": self._codec.decode(out["hyp_ids"]),
                "ids": out["hyp_ids"],
                "scores": out["hyp_scores"],
            }

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")], autograph=False)
        def translate_text(text: tf.Tensor) -> dict[str, tf.Tensor]:
            return translate(self._codec.encode(text, src_width))

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="src_ids")], autograph=False)
        def translate_ids(src_ids: tf.Tensor) -> dict[str, tf.Tensor]:
            return translate(serving.fixed_width(src_ids, src_width))

        return {"serving_default": translate_text, "translate_ids": translate_ids}


def transformer_mt_params(
    vocab: Params,
    model_dim: int = 64,
    num_heads: int = 4,
    hidden_dim: int = 256,
    num_encoder_layers: int = 2,
    num_decoder_layers: int = 2,
    dropout_prob: float = 0.0,
    max_length: int = 512,
    position: str = "sinusoidal",
) -> InstantiableParams:
    """A TransformerMtTask of the given size (shared embeddings, tied softmax)."""
    p = TransformerMtTask.Params()
    p.vocab = vocab.copy()
    emb = TransformerInput.Params().set(
        vocab_size=vocab.size,
        model_dim=model_dim,
        position=position,
        max_length=max_length,
        dropout_prob=dropout_prob,
    )
    p.src_emb = emb.copy()
    p.tgt_emb = emb.copy()
    p.encoder = stack_params(num_encoder_layers, model_dim, num_heads, hidden_dim, dropout_prob=dropout_prob)
    p.decoder = stack_params(
        num_decoder_layers, model_dim, num_heads, hidden_dim, decoder=True, dropout_prob=dropout_prob
    )
    p.softmax.set(input_dim=model_dim, num_classes=vocab.size)
    return p
