"""Activation functions by name: the one mapping every layer with an ``activation`` param uses."""

from __future__ import annotations

import types
from collections.abc import Callable

import tensorflow as tf

from params.errors import ConfigError


def _identity(x: tf.Tensor) -> tf.Tensor:
    return x


# Read-only: a layer's `activation` param is one of these names. gelu is the exact (erf) form.
_ACTIVATIONS: types.MappingProxyType[str, Callable[[tf.Tensor], tf.Tensor]] = types.MappingProxyType(
    {
        "none": _identity,
        "relu": tf.nn.relu,
        "gelu": tf.nn.gelu,
        "tanh": tf.math.tanh,
        "sigmoid": tf.math.sigmoid,
        "swish": tf.nn.silu,
    }
)


def names() -> list[str]:
    """The valid activation names, sorted."""
    return sorted(_ACTIVATIONS)


def get(name: str) -> Callable[[tf.Tensor], tf.Tensor]:
    """The function for activation ``name``; an unknown name is a ConfigError listing the valid ones."""
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise ConfigError(f"unknown activation {name!r}; expected one of {', '.join(names())}")
    return _ACTIVATIONS[name]
