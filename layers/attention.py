"""Multi-head dot-product attention with masks and a fixed-size key/value cache for decoding.

Masks are booleans broadcastable to ``[batch, query_length, key_length]``: True where a query may
attend to a key. ``padding_mask``, ``causal_mask`` and ``segment_mask`` build the usual ones and
``&`` combines them. Masked logits are replaced (not just offset), so a masked key's value has
exactly no effect on the output.

Incremental decoding keeps, per layer, a cache ``{'key', 'value'}`` of shape
``[batch, max_length, heads, head_dim]`` allocated once; ``extend_step`` writes one position with
``tf.tensor_scatter_nd_update``, so every shape is static inside ``tf.function`` and a step costs one
query position (plus attention over the cache).
"""

from __future__ import annotations

import tensorflow as tf

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError
from params.hyperparams import InstantiableParams

Cache = dict[str, tf.Tensor]


def padding_mask(paddings: tf.Tensor) -> tf.Tensor:
    """Key paddings ``[batch, length]`` (1 = padding) -> mask ``[batch, 1, length]``."""
    return tf.expand_dims(tf.equal(paddings, tf.zeros_like(paddings)), 1)


def causal_mask(query_length: int | tf.Tensor, key_length: int | tf.Tensor | None = None) -> tf.Tensor:
    """``[1, query_length, key_length]``: query i attends to keys 0..i (keys aligned to the end)."""
    key_length = query_length if key_length is None else key_length
    q = tf.range(query_length)[:, None] + (key_length - query_length)
    k = tf.range(key_length)[None, :]
    return tf.expand_dims(k <= q, 0)


def segment_mask(query_segment_ids: tf.Tensor, key_segment_ids: tf.Tensor) -> tf.Tensor:
    """Packed inputs: a query attends only to keys of its own segment. ``[batch, q_len, k_len]``."""
    return tf.equal(query_segment_ids[:, :, None], key_segment_ids[:, None, :])


def _combine(*masks: tf.Tensor | None) -> tf.Tensor | None:
    result = None
    for mask in masks:
        if mask is None:
            continue
        result = mask if result is None else tf.logical_and(result, mask)
    return result


def _write_position(cache: tf.Tensor, value: tf.Tensor, time_step: tf.Tensor | int) -> tf.Tensor:
    """``cache[:, time_step] = value[:, 0]`` for ``cache [B, L, ...]``: a scatter of B rows, which
    TensorFlow does in place when the cache buffer is not shared (a one-hot blend touches all L)."""
    rows = tf.shape(cache)[0]
    t = tf.fill([rows], tf.cast(time_step, tf.int32))
    indices = tf.stack([tf.range(rows), t], axis=1)
    return tf.tensor_scatter_nd_update(cache, indices, value[:, 0])


class MultiHeadAttention(BaseLayer):
    """Multi-head attention (Vaswani et al. 2017): self-attention when ``source`` is None, else
    cross-attention from the query sequence to ``source``."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Depth of the query input.")
        p.define("source_dim", 0, "Depth of the key/value source (0: input_dim).")
        p.define("hidden_dim", 0, "Total depth of queries/keys/values over all heads (0: input_dim).")
        p.define("output_dim", 0, "Depth of the output (0: input_dim).")
        p.define("num_heads", 1, "Number of attention heads; must divide hidden_dim.")
        p.define(
            "fused_qkv",
            False,
            "One [input_dim, 3 * hidden_dim] projection for q, k and v (needs source_dim == input_dim); "
            "self-attention then runs one matmul instead of three.",
        )
        p.define("use_bias", True, "Add biases to the q/k/v and output projections.")
        p.define("causal", False, "Each query attends only to itself and earlier positions.")
        p.define("atten_dropout_prob", 0.0, "Dropout probability on the attention weights (training).")
        mesh_lib.define_split_params(p)
        return p

    MAIN_WEIGHT = "w_o"

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        self._input_dim = checks.positive_int(self, "input_dim")
        self._source_dim = p.source_dim or self._input_dim
        self._hidden_dim = p.hidden_dim or self._input_dim
        self._output_dim = p.output_dim or self._input_dim
        heads = checks.positive_int(self, "num_heads")
        if self._hidden_dim % heads:
            raise ConfigError(f"{self.path}: num_heads={heads} must divide hidden_dim={self._hidden_dim}")
        if checks.in_range(self, "atten_dropout_prob", 0.0, 1.0, False, True) > 0:
            mesh_lib.refuse_random(self, "atten_dropout_prob > 0")
        if p.fused_qkv and self._source_dim != self._input_dim:
            raise ConfigError(
                f"{self.path}: fused_qkv needs source_dim == input_dim, got {self._source_dim} and "
                f"{self._input_dim}"
            )
        self._heads = heads
        self._head_dim = self._hidden_dim // heads
        zeros = weight_init_params("constant", 0.0)
        # On a mesh the hidden (heads x head_dim) dimension splits by whole heads under the "heads"
        # rule; a fused q/k/v weight is never split by the rules (its thirds would straddle devices).
        heads_dims = ["embed", "heads"]
        if p.fused_qkv:
            self.create_variable(
                "w_qkv", weight_params([self._input_dim, 3 * self._hidden_dim], dims=["embed", None])
            )
            if p.use_bias:
                self.create_variable("b_qkv", weight_params([3 * self._hidden_dim], init=zeros))
        else:
            self.create_variable("w_q", weight_params([self._input_dim, self._hidden_dim], dims=heads_dims))
            self.create_variable("w_k", weight_params([self._source_dim, self._hidden_dim], dims=heads_dims))
            self.create_variable("w_v", weight_params([self._source_dim, self._hidden_dim], dims=heads_dims))
            if p.use_bias:
                for name in ("b_q", "b_k", "b_v"):
                    self.create_variable(name, weight_params([self._hidden_dim], init=zeros, dims=["heads"]))
        self.create_variable(
            "w_o", weight_params([self._hidden_dim, self._output_dim], dims=["heads", "embed"])
        )
        if p.use_bias:
            self.create_variable("b_o", weight_params([self._output_dim], init=zeros, dims=["embed"]))
        self._heads_axis = self._check_heads_split()

    def _check_heads_split(self) -> str | None:
        """The mesh axis splitting the heads (None: not split); the heads must divide evenly."""
        if self.mesh is None:
            return None
        axis = self.mesh.rules.get("heads")
        if axis is not None and self._heads % self.mesh.axis_sizes[axis]:
            raise ConfigError(
                f"{self.path}: num_heads={self._heads} is not divisible by mesh axis {axis!r} "
                f"(size {self.mesh.axis_sizes[axis]}) that splits the heads"
            )
        return axis

    def _shard_heads(self, x: tf.Tensor) -> tf.Tensor:
        """On a mesh, ``[batch, time, heads, head_dim]`` laid out by the batch and heads rules."""
        if self.mesh is None:
            return x
        mapping = self.mesh.mapping_from_names(["batch", None, "heads", None])
        return self.mesh.shard(x, self.mesh.check(self.path, "heads activation", x.shape.as_list(), mapping))

    @property
    def num_heads(self) -> int:
        return self._heads

    @property
    def head_dim(self) -> int:
        return self._head_dim

    # ------------------------------------------------------------------------------ projections
    def _split_heads(self, x: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(x)
        y = tf.reshape(x, tf.concat([shape[:-1], [self._heads, self._head_dim]], 0))
        if self.mesh is not None and x.shape.rank == 3:
            y = self._shard_heads(y)
        return y

    def _weights(self, which: str) -> tuple[tf.Variable | tf.Tensor, tf.Tensor | None]:
        """The [in, hidden] weight and bias of 'q', 'k' or 'v' (slices of the fused ones)."""
        if not self.params.fused_qkv:
            return self.vars[f"w_{which}"], self.vars.get(f"b_{which}")
        i = "qkv".index(which)
        h = self._hidden_dim
        w = self.vars["w_qkv"][:, i * h : (i + 1) * h]
        b = self.vars["b_qkv"][i * h : (i + 1) * h] if "b_qkv" in self.vars else None
        return w, b

    def _project(self, x: tf.Tensor, which: str) -> tf.Tensor:
        w, b = self._weights(which)
        y = tf.tensordot(x, w, 1)
        return self._split_heads(y if b is None else y + b)

    def project_query(self, query: tf.Tensor) -> tf.Tensor:
        """``[..., input_dim]`` -> ``[..., heads, head_dim]``."""
        return self._project(checks.float_input(self, query), "q")

    def project_source(self, source: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Keys and values ``[..., heads, head_dim]`` of a source; computed once per decode."""
        source = checks.float_input(self, source)
        checks.last_dim(self, source, self._source_dim, "source_dim")
        return self._project(source, "k"), self._project(source, "v")

    def _project_self(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        if not self.params.fused_qkv:
            return self._project(x, "q"), self._project(x, "k"), self._project(x, "v")
        y = tf.tensordot(x, self.vars["w_qkv"], 1)
        if "b_qkv" in self.vars:
            y = y + self.vars["b_qkv"]
        q, k, v = tf.split(y, 3, axis=-1)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    # -------------------------------------------------------------------------------- attention
    def attend(
        self,
        ctx: FPropContext,
        query: tf.Tensor,
        key: tf.Tensor,
        value: tf.Tensor,
        mask: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """Projected ``query [B, T, N, H]``, ``key/value [B, S, N, H]``, mask ``[B|1, T|1, S]`` ->
        ``[B, T, output_dim]``."""
        logits = tf.einsum("btnh,bsnh->bnts", query, key) * (self._head_dim**-0.5)
        if mask is not None:
            mask = tf.convert_to_tensor(mask)
            mask = tf.expand_dims(mask, 1)  # over heads
            logits = tf.where(mask, logits, tf.constant(-1e9, logits.dtype))
        # The softmax in the accumulation dtype (float32 under a mixed precision policy).
        probs = tf.nn.softmax(tf.cast(logits, checks.accumulation_dtype(logits.dtype)), axis=-1)
        probs = tf.cast(probs, logits.dtype)
        rate = self.params.atten_dropout_prob
        if ctx.training and rate > 0:
            probs = tf.nn.experimental.stateless_dropout(probs, rate, self.dropout_seed(ctx, "/probs"))
        context = tf.einsum("bnts,bsnh->btnh", probs, value)
        shape = tf.shape(context)
        context = tf.reshape(context, tf.concat([shape[:2], [self._hidden_dim]], 0))
        out = tf.tensordot(context, self.vars["w_o"], 1)
        out = out + self.vars["b_o"] if "b_o" in self.vars else out
        return self.shard_activation(out, "embed")

    def fprop(
        self,
        ctx: FPropContext,
        query: tf.Tensor,
        source: tf.Tensor | None = None,
        mask: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """``query [B, T, input_dim]`` (and ``source [B, S, source_dim]`` for cross-attention) ->
        ``[B, T, output_dim]``. ``mask`` (True = attend) broadcasts to ``[B, T, S]``."""
        query = checks.float_input(self, query)
        checks.last_dim(self, query, self._input_dim, "input_dim")
        if query.shape.rank != 3:
            raise ConfigError(f"{self.path}: expected a query of shape [batch, time, dim], got {query.shape}")
        if source is None:
            q, k, v = self._project_self(query)
        else:
            q = self._project(query, "q")
            k, v = self.project_source(source)
        if self.params.causal:
            mask = _combine(mask, causal_mask(tf.shape(q)[1], tf.shape(k)[1]))
        return self.attend(ctx, q, k, v, mask)

    # ----------------------------------------------------------------------- incremental decoding
    def init_cache(self, batch_size: int, max_length: int) -> Cache:
        """An empty self-attention cache for ``max_length`` positions."""
        shape = [batch_size, max_length, self._heads, self._head_dim]
        return {"key": tf.zeros(shape, self.params.dtype), "value": tf.zeros(shape, self.params.dtype)}

    def extend_step(
        self,
        ctx: FPropContext,
        query: tf.Tensor,
        cache: Cache,
        time_step: tf.Tensor | int,
        mask: tf.Tensor | None = None,
    ) -> tuple[tf.Tensor, Cache]:
        """Self-attention for the one position ``time_step``: ``query [B, 1, input_dim]`` ->
        (``[B, 1, output_dim]``, cache with this position's key and value written in).

        The query attends to cached positions ``0..time_step`` (and where ``mask [B, 1|…, max_len]``
        is True), which is what ``fprop`` with ``causal=True`` computes for that position.
        """
        query = checks.float_input(self, query)
        q, k, v = self._project_self(query)
        max_length = cache["key"].shape[1] or tf.shape(cache["key"])[1]
        new_cache = {
            "key": _write_position(cache["key"], k, time_step),
            "value": _write_position(cache["value"], v, time_step),
        }
        visible = (tf.range(max_length) <= time_step)[None, None, :]
        return self.attend(ctx, q, new_cache["key"], new_cache["value"], _combine(visible, mask)), new_cache
