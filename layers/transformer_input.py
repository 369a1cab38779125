"""A Transformer's input: token embeddings (scaled by sqrt(model_dim)) plus sinusoidal or learned
position embeddings, then dropout."""

from __future__ import annotations

import math

import tensorflow as tf

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.core import DropoutLayer, EmbeddingLayer
from params.hyperparams import InstantiableParams


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
        self.create_child("dropout", DropoutLayer.Params().set(keep_prob=1.0 - float(p.dropout_prob)))

    def emb_matrix(self) -> tf.Variable:
        """The ``[vocab_size, model_dim]`` token embedding (for a tied softmax)."""
        return self.token_emb.emb_matrix()

    def fprop(self, ctx: FPropContext, ids: tf.Tensor, positions: tf.Tensor | None = None) -> tf.Tensor:
        """``ids [B, T]`` (positions default to 0..T-1) -> ``[B, T, model_dim]``."""
        if positions is None:
            positions = tf.range(tf.shape(ids)[-1])[None, :]
        x = self.token_emb(ctx, ids) + self.position_emb(ctx, positions)
        return self.dropout(ctx, x)
