"""Validation of layer settings and inputs, and the dtypes layers compute in.

Each failure is a ConfigError naming the layer, the param and the expected value, raised when the
layer is built (or traced) rather than deep inside a TensorFlow kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from layers.base_layer import BaseLayer
from params.errors import ConfigError
from params.hyperparams import InstantiableParams


def positive_int(layer: Any, name: str) -> int:
    """``layer.params.<name>`` as an int > 0."""
    value = layer.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{layer.path}: params.{name} must be a positive int, got {value!r}")
    return value


def in_range(layer: Any, name: str, low: float, high: float, low_open: bool, high_open: bool) -> float:
    """``layer.params.<name>`` as a float inside the given interval."""
    value = layer.params.get(name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(f"{layer.path}: params.{name} must be a number in {interval}, got {value!r}")
    return float(value)


def one_of(layer: Any, name: str, choices: Sequence[str]) -> str:
    """``layer.params.<name>`` as one of ``choices``."""
    value = layer.params.get(name)
    if value not in choices:
        raise ConfigError(f"{layer.path}: params.{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def int_list(layer: Any, name: str, length: int) -> list[int]:
    """``layer.params.<name>`` as a list/tuple of ``length`` positive ints."""
    value = layer.params.get(name)
    if (
        not isinstance(value, (list, tuple))
        or len(value) != length
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ConfigError(f"{layer.path}: params.{name} must be {length} positive ints, got {value!r}")
    return [int(v) for v in value]


def last_dim(layer: Any, x: tf.Tensor, expected: int, what: str) -> None:
    """Checks the static last dimension of ``x`` (when known) against the configured ``expected``."""
    if x.shape.rank == 0:
        raise ConfigError(f"{layer.path}: expected an input with a last dimension of {what}={expected}")
    actual = x.shape[-1] if x.shape.rank is not None else None
    if actual is not None and actual != expected:
        raise ConfigError(f"{layer.path}: input last dimension is {actual}, expected {what}={expected}")


def float_input(layer: Any, x: Any) -> tf.Tensor:
    """``x`` as a tensor of the layer's dtype (float inputs are cast; others are a ConfigError)."""
    x = tf.convert_to_tensor(x)
    if not (x.dtype.is_floating or x.dtype.is_integer):
        raise ConfigError(f"{layer.path}: expected a numeric input, got dtype {x.dtype.name}")
    return tf.cast(x, layer.params.dtype)


def accumulation_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype for statistics and losses: float64 for float64 layers, float32 otherwise.

    The one place that says what stays float32 under a bfloat16 or float16 compute dtype (a mixed
    precision policy, layers/precision.py): the softmax cross-entropy, normalization statistics and
    the attention logits' softmax compute in it."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def layer_params_list(layer: Any, name: str, allow_none: bool = False) -> list:
    """``layer.params.<name>`` as a list of layer Params (None entries too, with ``allow_none``)."""
    value = layer.params.get(name)
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{layer.path}: params.{name} must be a list of layer Params, got {value!r}")
    for i, item in enumerate(value):
        if item is None and allow_none:
            continue
        if not isinstance(item, InstantiableParams) or not (
            isinstance(item.cls, type) and issubclass(item.cls, BaseLayer)
        ):
            raise ConfigError(f"{layer.path}: params.{name}[{i}] must be a layer's Params (Layer.Params())")
    return list(value)
