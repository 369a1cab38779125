"""Core layers: projection, convolution, pooling, flatten, activation, dropout, embedding, softmax.

Normalization layers live in ``layers.normalization`` and containers in ``layers.containers``; both are
re-exported here so every core layer is importable from ``layers.core``. Float inputs are cast to the
layer's ``dtype`` param, so a stack built with ``dtype=tf.bfloat16`` computes in bfloat16.
"""

from __future__ import annotations

import math

import tensorflow as tf

from layers import activations, checks
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.containers import OnKeyLayer, RepeatLayer, SequentialLayer
from layers.normalization import BatchNormLayer, LayerNorm
from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError
from params.hyperparams import InstantiableParams

__all__ = [
    "ActivationLayer",
    "BatchNormLayer",
    "Conv2DLayer",
    "DropoutLayer",
    "EmbeddingLayer",
    "FlattenLayer",
    "LayerNorm",
    "OnKeyLayer",
    "PoolingLayer",
    "ProjectionLayer",
    "RepeatLayer",
    "SequentialLayer",
    "SoftmaxLayer",
]


def _zeros() -> object:
    return weight_init_params("constant", 0.0)


class ProjectionLayer(BaseLayer):
    """``y = act(x @ w + b)`` over the last dimension; any leading dimensions."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Size of the input's last dimension.")
        p.define("output_dim", 0, "Size of the output's last dimension.")
        p.define("activation", "none", f"Activation after the affine map: {', '.join(activations.names())}.")
        p.define("has_bias", True, "Whether to add a bias (initialized to zero).")
        p.define(
            "input_dim_name",
            None,
            "On a mesh: logical name of the input dim (layout rules), e.g. embed.",
            value_type=str,
        )
        p.define(
            "output_dim_name", None, "On a mesh: logical name of the output dim, e.g. hidden.", value_type=str
        )
        mesh_lib.define_split_params(p)
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        self._input_dim = checks.positive_int(self, "input_dim")
        output_dim = checks.positive_int(self, "output_dim")
        self._act = activations.get(p.activation)
        names = [p.input_dim_name, p.output_dim_name]
        self.create_variable("w", weight_params([self._input_dim, output_dim], dims=names))
        if p.has_bias:
            self.create_variable("b", weight_params([output_dim], init=_zeros(), dims=names[1:]))

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        checks.last_dim(self, x, self._input_dim, "input_dim")
        y = tf.tensordot(x, self.vars["w"], 1)  # einsum's CPU backward is ~40x slower here
        if self.params.has_bias:
            y += self.vars["b"]
        return self.shard_activation(self._act(y), self.params.output_dim_name)


class Conv2DLayer(BaseLayer):
    """2-D convolution over NHWC inputs, then bias and activation."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("filter_shape", [0, 0, 0, 0], "Filter shape [height, width, in_channels, out_channels].")
        p.define("filter_stride", (1, 1), "Stride (height, width).")
        p.define("padding", "SAME", "SAME or VALID, as in tf.nn.conv2d.")
        p.define("activation", "none", f"Activation after the bias: {', '.join(activations.names())}.")
        p.define("has_bias", True, "Whether to add a per-output-channel bias (initialized to zero).")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        self._filter_shape = checks.int_list(self, "filter_shape", 4)
        self._stride = checks.int_list(self, "filter_stride", 2)
        self._padding = checks.one_of(self, "padding", ("SAME", "VALID"))
        self._act = activations.get(p.activation)
        self.create_variable("w", weight_params(self._filter_shape))
        if p.has_bias:
            self.create_variable("b", weight_params([self._filter_shape[3]], init=_zeros()))

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        checks.last_dim(self, x, self._filter_shape[2], "filter_shape[2]")
        y = tf.nn.conv2d(x, self.vars["w"], strides=[1, *self._stride, 1], padding=self._padding)
        if self.params.has_bias:
            y += self.vars["b"]
        return self._act(y)


class PoolingLayer(BaseLayer):
    """Max or average pooling over the spatial dimensions of NHWC inputs."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("window", (2, 2), "Pooling window (height, width).")
        p.define("stride", (2, 2), "Stride (height, width).")
        p.define("pooling_type", "max", "max or avg.")
        p.define("padding", "VALID", "VALID or SAME, as in tf.nn.pool.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._window = checks.int_list(self, "window", 2)
        self._stride = checks.int_list(self, "stride", 2)
        self._type = {"max": "MAX", "avg": "AVG"}[checks.one_of(self, "pooling_type", ("max", "avg"))]
        self._padding = checks.one_of(self, "padding", ("VALID", "SAME"))

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        return tf.nn.pool(x, self._window, self._type, strides=self._stride, padding=self._padding)


class FlattenLayer(BaseLayer):
    """Reshapes ``[batch, ...]`` to ``[batch, prod(...)]``."""

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        inner = x.shape[1:]
        width = inner.num_elements() if inner.is_fully_defined() else -1
        return tf.reshape(x, [tf.shape(x)[0], width])


class ActivationLayer(BaseLayer):
    """Applies an activation function by name."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("activation", "relu", f"One of {', '.join(activations.names())}.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._act = activations.get(self.params.activation)

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        return self._act(checks.float_input(self, x))


class DropoutLayer(BaseLayer):
    """Inverted dropout in training (kept values scaled by 1/keep_prob); the identity in eval.

    The mask is stateless, keyed by (ctx.seed, layer path, ctx.step, ctx.micro_batch), so a
    re-materialized forward pass or a rerun draws the same mask.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("keep_prob", 1.0, "Probability of keeping each value, in (0, 1]; 1 disables dropout.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._keep_prob = checks.in_range(self, "keep_prob", 0.0, 1.0, low_open=True, high_open=False)
        if self._keep_prob < 1.0:
            mesh_lib.refuse_random(self, "keep_prob < 1")

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        if not ctx.training or self._keep_prob == 1.0:
            return x
        uniform = tf.random.stateless_uniform(tf.shape(x), self.dropout_seed(ctx), dtype=tf.float32)
        keep = tf.cast(uniform < self._keep_prob, x.dtype)
        return x * keep * tf.cast(1.0 / self._keep_prob, x.dtype)


class EmbeddingLayer(BaseLayer):
    """Looks up rows of an embedding matrix for int ids; ``emb_matrix()`` gives the matrix for tying."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("vocab_size", 0, "Number of rows (ids are in [0, vocab_size)).")
        p.define("embedding_dim", 0, "Width of each embedding.")
        p.define("scale_sqrt_depth", False, "Whether to multiply the looked-up rows by sqrt(embedding_dim).")
        mesh_lib.define_split_params(p)
        return p

    MAIN_WEIGHT = "emb"

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        vocab_size = checks.positive_int(self, "vocab_size")
        self._dim = checks.positive_int(self, "embedding_dim")
        self.create_variable("emb", weight_params([vocab_size, self._dim], dims=["vocab", "embed"]))

    def emb_matrix(self) -> tf.Variable:
        """The [vocab_size, embedding_dim] matrix (unscaled)."""
        return self.vars["emb"]

    def fprop(self, ctx: FPropContext, ids: tf.Tensor) -> tf.Tensor:
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ConfigError(f"{self.path}: ids must be ints, got dtype {ids.dtype.name}")
        emb = self.vars["emb"]
        if self.mesh is None or not isinstance(emb, tf.Variable):
            y = tf.gather(emb, ids)
        else:  # DTensor gathers from a vocab-split resource only through its value
            y = tf.gather(emb.read_value(), ids)
        if self.params.scale_sqrt_depth:
            y *= tf.cast(math.sqrt(self._dim), y.dtype)
        return self.shard_activation(y, "embed")


class SoftmaxLayer(BaseLayer):
    """A linear map to class logits and the (label-smoothed) softmax cross-entropy.

    With ``label_smoothing`` eps the target is ``(1 - eps) * onehot + eps / num_classes`` (the TF and
    Lingvo convention). The cross-entropy is computed in float32 (float64 for float64 layers), so
    bfloat16 logits still give a float32 loss.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Size of the input's last dimension.")
        p.define("num_classes", 0, "Number of classes (labels are in [0, num_classes)).")
        p.define("label_smoothing", 0.0, "Probability mass spread evenly over all classes, in [0, 1).")
        mesh_lib.define_split_params(p)
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._input_dim = checks.positive_int(self, "input_dim")
        self._num_classes = checks.positive_int(self, "num_classes")
        self._smoothing = checks.in_range(self, "label_smoothing", 0.0, 1.0, low_open=False, high_open=True)
        self.create_variable(
            "w", weight_params([self._input_dim, self._num_classes], dims=["embed", "vocab"])
        )
        self.create_variable("b", weight_params([self._num_classes], init=_zeros(), dims=["vocab"]))

    def logits(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        """Logits ``x @ w + b`` of shape ``x.shape[:-1] + [num_classes]``."""
        x = checks.float_input(self, x)
        checks.last_dim(self, x, self._input_dim, "input_dim")
        return self.shard_activation(tf.tensordot(x, self.vars["w"], 1) + self.vars["b"], "vocab")

    def fprop(
        self, ctx: FPropContext, x: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor | None = None
    ) -> dict[str, tf.Tensor]:
        """Returns logits, per_example_xent (shape of labels), avg_xent (weighted) and total_weight."""
        logits = self.logits(ctx, x)
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_integer:
            raise ConfigError(f"{self.path}: labels must be int class ids, got {labels.dtype.name}")
        dtype = checks.accumulation_dtype(logits.dtype)
        target = tf.one_hot(labels, self._num_classes, dtype=dtype)
        if self._smoothing:
            target = (1.0 - self._smoothing) * target + self._smoothing / self._num_classes
        xent = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=tf.cast(logits, dtype))
        if weights is None:
            weights = tf.ones_like(xent)
        else:
            weights = tf.cast(weights, dtype)
            if not weights.shape.is_compatible_with(xent.shape):
                raise ConfigError(f"{self.path}: weights shape {weights.shape} != labels {labels.shape}")
        total_weight = tf.reduce_sum(weights)
        return {
            "logits": logits,
            "per_example_xent": xent,
            "avg_xent": tf.math.divide_no_nan(tf.reduce_sum(xent * weights), total_weight),
            "total_weight": total_weight,
        }
