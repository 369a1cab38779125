"""One pre-norm Transformer layer (Xiong et al. 2020): ``x + dropout(sublayer(layer_norm(x)))`` for
self-attention, an optional cross-attention and the feed-forward block, with its incremental-decoding
step (``init_cache``, ``extend_step``: one position per step against a key/value cache).

The rest of a Transformer: token and position inputs (transformer_input.py), the stack of layers and
its GPipe form (transformer_stack.py), decoding step functions (transformer_decoding.py) and the
output loss (losses.py).
"""

from __future__ import annotations

import tensorflow as tf

from layers import activations, checks
from layers.attention import (
    MultiHeadAttention,
    padding_mask,
    segment_mask,
)
from layers.base_layer import BaseLayer, FPropContext
from layers.core import DropoutLayer, LayerNorm, ProjectionLayer
from params.errors import ConfigError
from params.hyperparams import InstantiableParams

LayerCache = dict[str, tf.Tensor]


def _keep(prob: float) -> float:
    return 1.0 - float(prob)


def _and(a: tf.Tensor | None, b: tf.Tensor | None) -> tf.Tensor | None:
    if a is None:
        return b
    return a if b is None else tf.logical_and(a, b)


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
