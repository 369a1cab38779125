"""Precision policies: the dtype a task's layers compute in and the dtype their weights are kept in.

``task.precision`` names one policy:

- ``float32``: weights, computation and activations in each layer's own ``dtype`` (float32 unless a
  layer sets another); nothing here is involved.
- ``mixed_bfloat16``: every layer that inherits its dtype computes in bfloat16 (its inputs, outputs
  and the activations between layers and pipeline stages), while its weights are float32 variables
  cast to bfloat16 where the layer reads them (``self.vars[name]``). Optimizer slots are made from
  the variables, so they are float32 too, and so is the loss.
- ``mixed_float16``: the same in float16; the trainer scales the loss (tasks/loss_scale.py).

What stays float32 under every policy is said in one place, ``checks.accumulation_dtype``: the
softmax cross-entropy and its logits, normalization statistics (mean, variance, moving averages) and
the attention logits' softmax compute in it and cast back to the layer's dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from params.errors import ConfigError

# policy name -> compute dtype (None: each layer's own dtype, weights in it too).
POLICIES: dict[str, tf.DType | None] = {
    "float32": None,
    "mixed_bfloat16": tf.bfloat16,
    "mixed_float16": tf.float16,
}
MASTER_DTYPE = tf.float32


def compute_dtype(policy: str) -> tf.DType | None:
    """The compute dtype of ``policy`` (None for float32); an unknown name is a ConfigError."""
    if policy not in POLICIES:
        raise ConfigError(f"task.precision: expected {' or '.join(POLICIES)}, got {policy!r}")
    return POLICIES[policy]


def casts_weights(compute: tf.DType, master: tf.DType | None) -> bool:
    """Whether a layer computing in ``compute`` keeps its weights in ``master`` and casts them."""
    return master is not None and compute.is_floating and compute != master and compute.size < master.size


class CastWeights(tf.Module):
    """A layer's weights (``layer.vars``) kept in float32 and read in the layer's compute dtype.

    A mapping from weight name to variable for everything but reading: ``vars[name]`` and
    ``vars.get(name)`` give the variable cast to the compute dtype (the gradient flows back to the
    float32 variable), ``values()`` / ``items()`` give the variables themselves. Each weight is an
    attribute of this module named as its key, so a checkpoint holds it at the same path as a plain
    dict of weights would (``.../vars/<name>``): float32 and mixed runs restore each other's
    checkpoints."""

    def __init__(self, compute: tf.DType, reads: CastReads) -> None:
        super().__init__(name="vars")
        self._compute = compute
        self._reads = reads
        self._keys: tuple[str, ...] = ()
        self._cast: tuple[str, ...] = ()

    def add(self, key: str, var: tf.Variable, cast: bool) -> None:
        """Adds weight ``key``; ``cast``: read it in the compute dtype."""
        if hasattr(type(self), key) or key.startswith("_"):
            raise ConfigError(f"weight name {key!r} is reserved under a mixed precision policy")
        setattr(self, key, var)
        self._keys = (*self._keys, key)
        if cast:
            self._cast = (*self._cast, key)

    def __setitem__(self, key: str, var: tf.Variable) -> None:
        if key not in self._keys:
            self.add(key, var, cast=False)
        else:
            setattr(self, key, var)

    def raw(self, key: str) -> tf.Variable:
        """The variable itself."""
        return getattr(self, key)

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        var = getattr(self, key)
        if key not in self._cast:
            return var
        if self._reads.shared is not None:
            return self._reads.shared.read(var, self._compute)
        return tf.cast(var, self._compute)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self._keys else default

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> list[tf.Variable]:
        return [getattr(self, k) for k in self._keys]

    def items(self) -> list[tuple[str, tf.Variable]]:
        return [(k, getattr(self, k)) for k in self._keys]


class CastReads:
    """How the weights of one task's layers are read under a mixed policy: cast at each read, or,
    while a pipelined step builds its units (``sharing``), through that step's ``SharedCasts``.
    One per task (its layers' ``CastWeights`` hold it), so a step's casts cover every layer it runs,
    whoever calls it."""

    def __init__(self) -> None:
        self.shared: SharedCasts | None = None

    @contextlib.contextmanager
    def sharing(self, casts: SharedCasts) -> Iterator[None]:
        """Within: every cast weight is read through ``casts``."""
        before, self.shared = self.shared, casts
        try:
            yield
        finally:
            self.shared = before


class SharedCasts:
    """One pipelined step's casts of float32 weights to the compute dtype, each made once.

    A pipeline keeps every micro-batch's forward for its backward; a weight cast inside each
    micro-batch's forward would be kept M times (the input gradient of a product reads the cast
    weight). Here a weight is cast the first time the step reads it, outside any gradient (a
    ``stop_gradient``), and every read hands out that one cast through an op whose gradient is the
    cast's (the upstream gradient cast to float32) and flows to the variable read there: each
    micro-batch's tape still finds the variable, its weight gradient is the one a cast at use gives,
    and the step holds one bfloat16 copy of each weight."""

    def __init__(self) -> None:
        self._casts: dict[Any, tf.Tensor] = {}

    def read(self, var: tf.Variable, dtype: tf.DType) -> tf.Tensor:
        """``var`` in ``dtype``: the step's one cast, its gradient flowing to ``var``."""
        cast = self._casts.get(var.ref())
        if cast is None:
            cast = self._casts[var.ref()] = tf.cast(tf.stop_gradient(var.value()), dtype)
        master = var.dtype.base_dtype

        @tf.custom_gradient
        def tied(value: tf.Tensor) -> Any:
            del value  # the gradient needs none of it: the cast's gradient is a cast back

            def grad(dy: tf.Tensor) -> tf.Tensor:
                return tf.cast(dy, master)

            return tf.identity(cast), grad

        return tied(var.value())
