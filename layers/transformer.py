"""Transformer building blocks: positions, pre-norm encoder/decoder layers, the layer stack, token
inputs and the (label-smoothed) output loss.

The stack is a plain list of ``TransformerLayer`` Params (``TransformerStack.params.layers``), so a
pipeline layer can cut it into stages: set ``TransformerStack.params.pipeline`` to a ``GPipeLayer``
template and training and evaluation run the layers as a K-stage, M-micro-batch pipeline, while
decoding steps still run the same layers one after another. Each layer is pre-norm (Xiong et al. 2020):
``x + dropout(sublayer(layer_norm(x)))``, and the stack ends with a layer norm.

Decoding a step costs one position: ``TransformerStack.init_cache`` allocates every layer's
key/value cache at the maximum length, ``extend_step`` runs one position through all layers, and the
encoder output is projected to keys/values once by ``project_source``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tensorflow as tf

from layers import activations, checks
from layers.attention import (
    MultiHeadAttention,
    padding_mask,
    segment_mask,
)
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.beam_search import StepFn
from layers.core import DropoutLayer, EmbeddingLayer, LayerNorm, ProjectionLayer
from layers.parallel.pipeline.gpipe import GPipeLayer
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

LayerCache = dict[str, tf.Tensor]


def _keep(prob: float) -> float:
    return 1.0 - float(prob)


def _and(a: tf.Tensor | None, b: tf.Tensor | None) -> tf.Tensor | None:
    if a is None:
        return b
    return a if b is None else tf.logical_and(a, b)


def sinusoidal_positions(
    positions: tf.Tensor, dim: int, min_timescale: float = 1.0, max_timescale: float = 1.0e4
) -> tf.Tensor:
    """Vaswani et al.'s timing signal: ``positions [...]`` -> ``[..., dim]`` (sines, then cosines)."""
    positions = tf.cast(positions, tf.float32)
    num_timescales = dim // 2
    log_increment = math.log(max_timescale / min_timescale) / max(num_timescales - 1, 1)
    inv_timescales = min_timescale * tf.exp(tf.range(num_timescales, dtype=tf.float32) * -log_increment)
    scaled = positions[..., None] * inv_timescales
    signal = tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)
    if dim % 2:
        signal = tf.pad(signal, [[0, 0]] * (signal.shape.rank - 1) + [[0, 1]])
    return signal


class PositionalEmbedding(BaseLayer):
    """Position embeddings, sinusoidal (no weights) or learned (one row per position)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("embedding_dim", 0, "Width of each position embedding.")
        p.define("kind", "sinusoidal", "sinusoidal or learned.")
        p.define("max_length", 512, "learned: number of positions (positions must be < max_length).")
        p.define("max_timescale", 1.0e4, "sinusoidal: the longest wavelength / (2 pi).")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._dim = checks.positive_int(self, "embedding_dim")
        self._kind = checks.one_of(self, "kind", ("sinusoidal", "learned"))
        if self._kind == "learned":
            self._max_length = checks.positive_int(self, "max_length")
            init = weight_init_params("gaussian", self._dim**-0.5)
            self.create_variable("emb", weight_params([self._max_length, self._dim], init=init))

    def fprop(self, ctx: FPropContext, positions: tf.Tensor) -> tf.Tensor:
        """Int ``positions [...]`` -> ``[..., embedding_dim]``."""
        if self._kind == "learned":
            return tf.gather(self.vars["emb"], positions)
        return tf.cast(
            sinusoidal_positions(positions, self._dim, max_timescale=self.params.max_timescale),
            self.params.dtype,
        )


class TransformerInput(BaseLayer):
    """Token ids (and positions) -> ``emb(ids) * sqrt(dim) + pos(positions)``, then dropout."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("vocab_size", 0, "Number of token ids.")
        p.define("model_dim", 0, "Width of the embeddings.")
        p.define("position", "sinusoidal", "Position embedding: sinusoidal or learned.")
        p.define("max_length", 512, "Learned positions: how many.")
        p.define("scale_sqrt_depth", True, "Multiply token embeddings by sqrt(model_dim).")
        p.define("dropout_prob", 0.0, "Dropout probability on the summed embeddings (training).")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        dim = checks.positive_int(self, "model_dim")
        checks.in_range(self, "dropout_prob", 0.0, 1.0, False, True)
        emb = EmbeddingLayer.Params().set(
            vocab_size=p.vocab_size,
            embedding_dim=dim,
            scale_sqrt_depth=p.scale_sqrt_depth,
            weight_init=weight_init_params("gaussian", dim**-0.5),
        )
        self.create_child("token_emb", emb)
        self.create_child(
            "position_emb",
            PositionalEmbedding.Params().set(embedding_dim=dim, kind=p.position, max_length=p.max_length),
        )
        self.create_child("dropout", DropoutLayer.Params().set(keep_prob=_keep(p.dropout_prob)))

    def emb_matrix(self) -> tf.Variable:
        """The ``[vocab_size, model_dim]`` token embedding (for a tied softmax)."""
        return self.token_emb.emb_matrix()

    def fprop(self, ctx: FPropContext, ids: tf.Tensor, positions: tf.Tensor | None = None) -> tf.Tensor:
        """``ids [B, T]`` (positions default to 0..T-1) -> ``[B, T, model_dim]``."""
        if positions is None:
            positions = tf.range(tf.shape(ids)[-1])[None, :]
        x = self.token_emb(ctx, ids) + self.position_emb(ctx, positions)
        return self.dropout(ctx, x)


class TransformerFeedForward(BaseLayer):
    """Pre-norm position-wise feed-forward block: ``x + drop(W2 drop(act(W1 ln(x))))``."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Width of the input and output.")
        p.define("hidden_dim", 0, "Width of the hidden layer.")
        p.define("activation", "relu", f"Hidden activation: {', '.join(activations.names())}.")
        p.define("relu_dropout_prob", 0.0, "Dropout probability on the hidden activations.")
        p.define("residual_dropout_prob", 0.0, "Dropout probability on the block's output.")
        p.define("ln_epsilon", 1e-6, "Layer-norm epsilon.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        dim = checks.positive_int(self, "input_dim")
        hidden = checks.positive_int(self, "hidden_dim")
        checks.in_range(self, "relu_dropout_prob", 0.0, 1.0, False, True)
        checks.in_range(self, "residual_dropout_prob", 0.0, 1.0, False, True)
        self.create_child("ln", LayerNorm.Params().set(input_dim=dim, epsilon=p.ln_epsilon))
        self.create_child(
            "fc1",
            ProjectionLayer.Params().set(
                input_dim=dim,
                output_dim=hidden,
                activation=p.activation,
                input_dim_name="embed",
                output_dim_name="hidden",
            ),
        )
        self.create_child(
            "fc2",
            ProjectionLayer.Params().set(
                input_dim=hidden, output_dim=dim, input_dim_name="hidden", output_dim_name="embed"
            ),
        )
        self.create_child("relu_dropout", DropoutLayer.Params().set(keep_prob=_keep(p.relu_dropout_prob)))
        self.create_child(
            "residual_dropout", DropoutLayer.Params().set(keep_prob=_keep(p.residual_dropout_prob))
        )

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        h = self.relu_dropout(ctx, self.fc1(ctx, self.ln(ctx, x)))
        return x + self.residual_dropout(ctx, self.fc2(ctx, h))


class TransformerLayer(BaseLayer):
    """One pre-norm Transformer layer: self-attention, optional cross-attention, feed-forward.

    Encoder layers: ``causal=False, has_cross_attention=False``. Decoder layers: ``causal=True`` and
    ``has_cross_attention=True`` (or False for a decoder-only language model).
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("model_dim", 0, "Width of the layer's input and output.")
        p.define("num_heads", 1, "Attention heads (must divide model_dim).")
        p.define("hidden_dim", 0, "Width of the feed-forward hidden layer (0: 4 * model_dim).")
        p.define("source_dim", 0, "Width of the cross-attention source (0: model_dim).")
        p.define("causal", False, "Self-attention sees only earlier positions (decoders).")
        p.define("has_cross_attention", False, "Add a cross-attention block over a source (decoders).")
        p.define("fused_qkv", True, "Self-attention uses one fused q/k/v projection.")
        p.define("activation", "relu", "Feed-forward activation.")
        p.define("atten_dropout_prob", 0.0, "Dropout probability on attention weights.")
        p.define("residual_dropout_prob", 0.0, "Dropout probability on each block's output.")
        p.define("relu_dropout_prob", 0.0, "Dropout probability on the feed-forward hidden layer.")
        p.define("ln_epsilon", 1e-6, "Layer-norm epsilon.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        dim = checks.positive_int(self, "model_dim")
        checks.in_range(self, "residual_dropout_prob", 0.0, 1.0, False, True)
        atten = MultiHeadAttention.Params().set(
            input_dim=dim, num_heads=p.num_heads, atten_dropout_prob=p.atten_dropout_prob
        )
        ln = LayerNorm.Params().set(input_dim=dim, epsilon=p.ln_epsilon)
        dropout = DropoutLayer.Params().set(keep_prob=_keep(p.residual_dropout_prob))
        self.create_child("self_atten_ln", ln)
        self.create_child("self_atten", atten.copy().set(causal=p.causal, fused_qkv=p.fused_qkv))
        self.create_child("self_atten_dropout", dropout)
        if p.has_cross_attention:
            self.create_child("cross_atten_ln", ln)
            self.create_child("cross_atten", atten.copy().set(source_dim=p.source_dim or dim))
            self.create_child("cross_atten_dropout", dropout)
        self.create_child(
            "ffn",
            TransformerFeedForward.Params().set(
                input_dim=dim,
                hidden_dim=p.hidden_dim or 4 * dim,
                activation=p.activation,
                relu_dropout_prob=p.relu_dropout_prob,
                residual_dropout_prob=p.residual_dropout_prob,
                ln_epsilon=p.ln_epsilon,
            ),
        )

    def fprop(
        self,
        ctx: FPropContext,
        x: tf.Tensor | dict[str, tf.Tensor],
        self_mask: tf.Tensor | None = None,
        source: tf.Tensor | None = None,
        source_mask: tf.Tensor | None = None,
    ) -> tf.Tensor | dict[str, tf.Tensor]:
        """``x [B, T, D]`` -> ``[B, T, D]``. Masks (True = attend) broadcast to ``[B, T, T]`` and
        ``[B, T, S]``; the causal mask is added by the layer itself.

        Pipeline form: ``x`` may be a dict of batch-major tensors, ``{'x', 'paddings',
        'segment_ids', 'source', 'source_paddings', 'source_segment_ids'}`` (all but 'x' optional);
        the layer builds the masks from it and returns the dict with 'x' replaced. This is the
        ``fprop(ctx, x) -> x`` form a GPipeLayer expects of each layer it cuts into stages.
        """
        if isinstance(x, dict):
            state = dict(x)
            self_mask, source_mask = attention_masks(
                state.get("paddings"),
                state.get("segment_ids"),
                state.get("source_paddings"),
                state.get("source_segment_ids"),
            )
            state["x"] = self.fprop(ctx, state["x"], self_mask, state.get("source"), source_mask)
            return state
        h = self.self_atten(ctx, self.self_atten_ln(ctx, x), mask=self_mask)
        x = x + self.self_atten_dropout(ctx, h)
        if self.params.has_cross_attention:
            if source is None:
                raise ConfigError(f"{self.path}: has_cross_attention needs a source")
            h = self.cross_atten(ctx, self.cross_atten_ln(ctx, x), source=source, mask=source_mask)
            x = x + self.cross_atten_dropout(ctx, h)
        return self.ffn(ctx, x)

    def init_cache(self, batch_size: int, max_length: int) -> LayerCache:
        return self.self_atten.init_cache(batch_size, max_length)

    def extend_step(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        cache: LayerCache,
        time_step: tf.Tensor | int,
        source_kv: tuple[tf.Tensor, tf.Tensor] | None = None,
        source_mask: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, LayerCache]:
        """One position ``x [B, 1, D]`` at ``time_step`` -> (``[B, 1, D]``, updated cache)."""
        h, cache = self.self_atten.extend_step(ctx, self.self_atten_ln(ctx, x), cache, time_step)
        x = x + self.self_atten_dropout(ctx, h)
        if self.params.has_cross_attention:
            q = self.cross_atten.project_query(self.cross_atten_ln(ctx, x))
            h = self.cross_atten.attend(ctx, q, source_kv[0], source_kv[1], source_mask)
            x = x + self.cross_atten_dropout(ctx, h)
        return self.ffn(ctx, x), cache


def attention_masks(
    paddings: tf.Tensor | None = None,
    segment_ids: tf.Tensor | None = None,
    source_paddings: tf.Tensor | None = None,
    source_segment_ids: tf.Tensor | None = None,
) -> tuple[tf.Tensor | None, tf.Tensor | None]:
    """(self mask, source mask) from paddings (1 = pad) and packed segment ids (None: no mask)."""
    self_mask = padding_mask(paddings) if paddings is not None else None
    if segment_ids is not None:
        self_mask = _and(self_mask, segment_mask(segment_ids, segment_ids))
    source_mask = padding_mask(source_paddings) if source_paddings is not None else None
    if segment_ids is not None and source_segment_ids is not None:
        source_mask = _and(source_mask, segment_mask(segment_ids, source_segment_ids))
    return self_mask, source_mask


def transformer_layer_params(
    model_dim: int,
    num_heads: int,
    hidden_dim: int = 0,
    *,
    decoder: bool = False,
    cross_attention: bool | None = None,
    dropout_prob: float = 0.0,
) -> InstantiableParams:
    """Params of an encoder (or, with ``decoder=True``, a causal decoder) layer."""
    return TransformerLayer.Params().set(
        model_dim=model_dim,
        num_heads=num_heads,
        hidden_dim=hidden_dim,
        causal=decoder,
        has_cross_attention=decoder if cross_attention is None else cross_attention,
        atten_dropout_prob=dropout_prob,
        residual_dropout_prob=dropout_prob,
        relu_dropout_prob=dropout_prob,
    )


class TransformerStack(BaseLayer):
    """``layers`` (a list of TransformerLayer Params) applied in order, then a final layer norm."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("model_dim", 0, "Width of the stack (every layer's model_dim).")
        p.define("layers", [], "List of TransformerLayer Params, applied in order (children layers_<i>).")
        p.define("final_ln", True, "Layer-normalize the output (needed by pre-norm stacks).")
        p.define("ln_epsilon", 1e-6, "Epsilon of the final layer norm.")
        p.define(
            "pipeline",
            None,
            "None: the layers run in order. Or GPipeLayer Params with its layers left empty (num_stages, "
            "num_micro_batches, remat, partition_method ...): fprop runs `layers` as that pipeline "
            "(child pipeline/layers_<i>); incremental decoding still runs them one by one.",
            value_type=Params,
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        dim = checks.positive_int(self, "model_dim")
        if not isinstance(p.layers, (list, tuple)) or not p.layers:
            raise ConfigError(
                f"{self.path}: params.layers must be a non-empty list of TransformerLayer Params"
            )
        for i, lp in enumerate(p.layers):
            if not isinstance(lp, Params) or "model_dim" not in lp or lp.model_dim != dim:
                raise ConfigError(
                    f"{self.path}: params.layers[{i}] must be a layer Params with model_dim={dim}"
                )
        if p.pipeline is None:
            self.create_children("layers", list(p.layers))
        else:
            self._create_pipeline(p.pipeline, list(p.layers))
        if p.final_ln:
            self.create_child("final_ln", LayerNorm.Params().set(input_dim=dim, epsilon=p.ln_epsilon))

    def _create_pipeline(self, template: Params, layers: list[Params]) -> None:
        if not isinstance(template, InstantiableParams) or not issubclass(template.cls, GPipeLayer):
            raise ConfigError(f"{self.path}: params.pipeline must be None or GPipeLayer.Params()")
        if template.layers or template.stages:
            raise ConfigError(
                f"{self.path}: leave params.pipeline.layers and .stages empty; the pipeline runs "
                "params.layers"
            )
        named = [lp.copy().set(name=f"layers_{i}") for i, lp in enumerate(layers)]
        self.create_child("pipeline", template.copy().set(layers=named))

    @property
    def sequence(self) -> list[TransformerLayer]:
        """The layers in order (wherever a pipeline placed them)."""
        return self.pipeline.sequence if self.params.pipeline is not None else self.layers

    def _finish(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        return self.final_ln(ctx, x) if self.params.final_ln else x

    @property
    def is_pipelined(self) -> bool:
        return self.params.pipeline is not None

    def fprop_with_head(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        head: Callable,
        head_inputs: dict[str, tf.Tensor],
        paddings: tf.Tensor | None = None,
        source: tf.Tensor | None = None,
        source_paddings: tf.Tensor | None = None,
        segment_ids: tf.Tensor | None = None,
        source_segment_ids: tf.Tensor | None = None,
    ) -> dict[str, tf.Tensor]:
        """A pipelined stack's forward with ``head(ctx, y, head_inputs_m)`` run in its last stage on
        each micro-batch's (final-normalized) output ``y`` and that micro-batch's ``head_inputs``
        (targets, paddings): a task's per-example loss, concatenated over micro-batches."""
        if not self.is_pipelined:
            raise ConfigError(f"{self.path}: fprop_with_head needs params.pipeline")
        state = _pipeline_state(x, paddings, segment_ids, source, source_paddings, source_segment_ids)

        def stack_head(ctx: FPropContext, state: dict, inputs: dict) -> dict[str, tf.Tensor]:
            return head(ctx, self._finish(ctx, state["x"]), inputs)

        return self.pipeline(ctx, state, head=stack_head, head_inputs=head_inputs)

    def fprop(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        paddings: tf.Tensor | None = None,
        source: tf.Tensor | None = None,
        source_paddings: tf.Tensor | None = None,
        segment_ids: tf.Tensor | None = None,
        source_segment_ids: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """``x [B, T, D]`` with ``paddings [B, T]`` (and a ``source [B, S, D_s]`` for decoders)."""
        if self.params.pipeline is not None:
            state = _pipeline_state(x, paddings, segment_ids, source, source_paddings, source_segment_ids)
            return self._finish(ctx, self.pipeline(ctx, state)["x"])
        self_mask, source_mask = attention_masks(paddings, segment_ids, source_paddings, source_segment_ids)
        for layer in self.layers:
            x = layer(ctx, x, self_mask, source, source_mask)
        return self._finish(ctx, x)

    # ----------------------------------------------------------------------- incremental decoding
    def init_cache(self, batch_size: int, max_length: int) -> list[LayerCache]:
        return [layer.init_cache(batch_size, max_length) for layer in self.sequence]

    def project_source(self, source: tf.Tensor) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Each cross-attention layer's keys and values of ``source``; computed once per decode."""
        return [
            layer.cross_atten.project_source(source) if layer.params.has_cross_attention else (None, None)
            for layer in self.sequence
        ]

    def extend_step(
        self,
        ctx: FPropContext,
        x: tf.Tensor,
        cache: list[LayerCache],
        time_step: tf.Tensor | int,
        source_kv: list[tuple[tf.Tensor, tf.Tensor]] | None = None,
        source_paddings: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, list[LayerCache]]:
        """One position ``x [B, 1, D]`` through every layer; returns its output and the new caches."""
        source_mask = padding_mask(source_paddings) if source_paddings is not None else None
        new_cache = []
        for i, layer in enumerate(self.sequence):
            kv = source_kv[i] if source_kv is not None else None
            x, layer_cache = layer.extend_step(ctx, x, cache[i], time_step, kv, source_mask)
            new_cache.append(layer_cache)
        return self._finish(ctx, x), new_cache


def _pipeline_state(
    x: tf.Tensor,
    paddings: tf.Tensor | None,
    segment_ids: tf.Tensor | None,
    source: tf.Tensor | None,
    source_paddings: tf.Tensor | None,
    source_segment_ids: tf.Tensor | None,
) -> dict[str, tf.Tensor]:
    """The dict of batch-major tensors a pipelined stack's micro-batches carry (the pipeline form
    of TransformerLayer.fprop)."""
    state = {
        "x": x,
        "paddings": paddings,
        "segment_ids": segment_ids,
        "source": source,
        "source_paddings": source_paddings,
        "source_segment_ids": source_segment_ids,
    }
    return {name: value for name, value in state.items() if value is not None}


def stack_params(
    num_layers: int,
    model_dim: int,
    num_heads: int,
    hidden_dim: int = 0,
    *,
    decoder: bool = False,
    cross_attention: bool | None = None,
    dropout_prob: float = 0.0,
) -> InstantiableParams:
    """A TransformerStack of ``num_layers`` identical (separately weighted) layers."""
    layer = transformer_layer_params(
        model_dim,
        num_heads,
        hidden_dim,
        decoder=decoder,
        cross_attention=cross_attention,
        dropout_prob=dropout_prob,
    )
    return TransformerStack.Params().set(
        model_dim=model_dim, layers=[layer.copy() for _ in range(num_layers)]
    )


def label_smoothed_xent(logits: tf.Tensor, labels: tf.Tensor, label_smoothing: float = 0.0) -> tf.Tensor:
    """Per-token cross-entropy (float32) against ``(1 - eps) * onehot + eps / vocab``."""
    logits = tf.cast(logits, tf.float32)
    num_classes = tf.shape(logits)[-1]
    target = tf.one_hot(labels, num_classes, dtype=tf.float32)
    if label_smoothing:
        target = (1.0 - label_smoothing) * target + label_smoothing / tf.cast(num_classes, tf.float32)
    return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=logits)


def tied_logits(x: tf.Tensor, emb_matrix: tf.Tensor) -> tf.Tensor:
    """Logits of a softmax tied to a ``[vocab, dim]`` embedding: ``x @ emb^T``."""
    return tf.tensordot(x, tf.transpose(tf.cast(emb_matrix, x.dtype)), 1)


# --------------------------------------------------------------------------- decoding step functions
LogitsFn = Callable[[tf.Tensor], tf.Tensor]


def cached_step_fn(
    ctx: FPropContext,
    embed: TransformerInput,
    stack: TransformerStack,
    logits_fn: LogitsFn,
    source: tf.Tensor | None = None,
    source_paddings: tf.Tensor | None = None,
) -> StepFn:
    """A ``layers.beam_search`` step function that runs one position per step with the cache.

    Its state is ``{'cache': stack.init_cache(rows, max_length)}`` (see ``init_cached_state``).
    ``source`` (the encoder output, one row per decoded row) is projected to keys/values once, here.
    """
    source_kv = stack.project_source(source) if source is not None else None

    def step(ids: tf.Tensor, time_step: tf.Tensor, state: dict) -> tuple[tf.Tensor, dict]:
        x = embed(ctx, ids[:, None], positions=tf.reshape(time_step, [1, 1]))
        y, cache = stack.extend_step(ctx, x, state["cache"], time_step, source_kv, source_paddings)
        return tf.nn.log_softmax(tf.cast(logits_fn(y[:, 0]), tf.float32)), {"cache": cache}

    return step


def init_cached_state(stack: TransformerStack, rows: int, max_length: int) -> dict:
    return {"cache": stack.init_cache(rows, max_length)}


def full_prefix_step_fn(
    ctx: FPropContext,
    embed: TransformerInput,
    stack: TransformerStack,
    logits_fn: LogitsFn,
    source: tf.Tensor | None = None,
    source_paddings: tf.Tensor | None = None,
) -> StepFn:
    """The reference (slow) step function: re-runs the decoder over the whole prefix every step.

    Its state is ``{'ids': [rows, max_length]}``, the inputs so far (see ``init_full_prefix_state``).
    Decoding a step costs ``time_step + 1`` positions; the cached one costs one.
    """

    def step(ids: tf.Tensor, time_step: tf.Tensor, state: dict) -> tuple[tf.Tensor, dict]:
        buffer = tf.where(
            tf.equal(tf.range(tf.shape(state["ids"])[1]), time_step), ids[:, None], state["ids"]
        )
        prefix = buffer[:, : time_step + 1]
        y = stack(ctx, embed(ctx, prefix), source=source, source_paddings=source_paddings)
        return tf.nn.log_softmax(tf.cast(logits_fn(y[:, -1]), tf.float32)), {"ids": buffer}

    return step


def init_full_prefix_state(rows: int, max_length: int) -> dict:
    return {"ids": tf.zeros([rows, max_length], tf.int32)}
