"""Normalization layers: LayerNorm and BatchNormLayer."""

from __future__ import annotations

import tensorflow as tf

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.parallel import mesh as mesh_lib
from params.hyperparams import InstantiableParams


def _constant(value: float) -> object:
    return weight_init_params("constant", value)


class LayerNorm(BaseLayer):
    """Normalizes over the last dimension, then ``* scale + bias`` (scale starts at 1, bias at 0)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Size of the normalized last dimension.")
        p.define("epsilon", 1e-6, "Added to the variance before the square root.")
        mesh_lib.define_split_params(p)
        return p

    MAIN_WEIGHT = "scale"

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._dim = checks.positive_int(self, "input_dim")
        checks.in_range(self, "epsilon", 0.0, float("inf"), low_open=False, high_open=True)
        self.create_variable("scale", weight_params([self._dim], init=_constant(1.0), dims=["embed"]))
        self.create_variable("bias", weight_params([self._dim], init=_constant(0.0), dims=["embed"]))

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        checks.last_dim(self, x, self._dim, "input_dim")
        dtype = x.dtype
        xs = tf.cast(x, checks.accumulation_dtype(dtype))
        mean, variance = tf.nn.moments(xs, axes=[-1], keepdims=True)
        normed = tf.cast((xs - mean) * tf.math.rsqrt(variance + self.params.epsilon), dtype)
        return self.shard_activation(normed * self.vars["scale"] + self.vars["bias"], "embed")


class BatchNormLayer(BaseLayer):
    """Batch normalization over every dimension but the last.

    Training normalizes by the batch's own mean and (biased) variance and records the update
    ``("moments", [E[x], E[x^2]], weight=elements per channel)``. Recording the mean of squares rather
    than the variance makes the weighted merge over micro-batches exact: the merged E[x^2] - E[x]^2 is
    the full batch's variance even when the micro-batch means differ. ``apply_update`` then moves the
    moving statistics: ``moving = decay * moving + (1 - decay) * batch``. Eval normalizes by the moving
    statistics, which are non-trainable float32 (float64 for float64 layers) variables and so are
    checkpointed.

    Under data parallelism (a ``tf.distribute`` replica context with several replicas in sync) the
    mean and variance are those of the global batch: each replica's sums are all-reduced (sync batch
    norm, one collective each way per layer), so N replicas on N shards normalize as one process does
    on the whole batch.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("dim", 0, "Number of channels (size of the last dimension).")
        p.define("decay", 0.999, "Decay of the moving mean and variance, in [0, 1).")
        p.define("epsilon", 1e-3, "Added to the variance before the square root.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._dim = checks.positive_int(self, "dim")
        self._decay = checks.in_range(self, "decay", 0.0, 1.0, low_open=False, high_open=True)
        checks.in_range(self, "epsilon", 0.0, float("inf"), low_open=False, high_open=True)
        stats = checks.accumulation_dtype(self.params.dtype)
        self.create_variable("gamma", weight_params([self._dim], init=_constant(1.0)))
        self.create_variable("beta", weight_params([self._dim], init=_constant(0.0)))
        for name, value in (("moving_mean", 0.0), ("moving_variance", 1.0)):
            self.create_variable(name, weight_params([self._dim], _constant(value), stats, trainable=False))

    def fprop(self, ctx: FPropContext, x: tf.Tensor) -> tf.Tensor:
        x = checks.float_input(self, x)
        checks.last_dim(self, x, self._dim, "dim")
        dtype = x.dtype
        xs = tf.cast(x, self.vars["moving_mean"].dtype)
        if ctx.training:
            axes = list(range(x.shape.rank - 1))
            mean, variance = _moments(xs, axes, self.vars["moving_mean"])
            count = tf.reduce_prod(tf.shape(x)[:-1])
            ctx.add_update(self, "moments", tf.stack([mean, variance + tf.square(mean)]), weight=count)
        else:
            mean, variance = self.vars["moving_mean"], self.vars["moving_variance"]
        normed = tf.cast((xs - mean) * tf.math.rsqrt(variance + self.params.epsilon), dtype)
        return normed * self.vars["gamma"] + self.vars["beta"]

    def apply_update(self, name: str, value: tf.Tensor) -> None:
        """Moves the moving statistics toward merged ``[E[x], E[x^2]]`` (the "moments" update)."""
        if name != "moments":
            super().apply_update(name, value)
            return
        moving_mean, moving_variance = self.vars["moving_mean"], self.vars["moving_variance"]
        value = tf.cast(value, moving_mean.dtype)
        mean = value[0]
        variance = tf.maximum(value[1] - tf.square(mean), 0.0)
        moving_mean.assign(self._decay * moving_mean + (1.0 - self._decay) * mean)
        moving_variance.assign(self._decay * moving_variance + (1.0 - self._decay) * variance)


def _moments(x: tf.Tensor, axes: list[int], shift: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``tf.nn.moments``, over every replica's batch when several replicas train in sync.

    Across replicas it takes one collective (one each way: the backward pass all-reduces the sums'
    gradient): the sums of ``x - shift`` and of its square, and the count, packed together. Every
    collective between processes is a round trip on which each replica waits for the slowest, and a
    second one for the squared deviations from the global mean (``tf.nn.moments``' two passes) would
    add two such waits per layer and step. ``shift`` (the moving mean, equal on every replica) is near
    the batch mean once training runs, which keeps ``E[d^2] - E[d]^2`` clear of cancellation.
    """
    replica = tf.distribute.get_replica_context()
    if replica is None or replica.num_replicas_in_sync <= 1:
        return tf.nn.moments(x, axes=axes)
    shift = tf.stop_gradient(shift)
    deviations = x - shift
    count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), x.dtype)
    local = [tf.reduce_sum(deviations, axis=axes), tf.reduce_sum(tf.square(deviations), axis=axes)]
    sums = replica.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat([*local, count[None]], 0))
    dim = x.shape[-1]
    mean_deviation = sums[:dim] / sums[-1]
    variance = tf.maximum(sums[dim:-1] / sums[-1] - tf.square(mean_deviation), 0.0)
    return shift + mean_deviation, variance
