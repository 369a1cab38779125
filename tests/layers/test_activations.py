"""The activation-name mapping shared by every layer with an ``activation`` param."""

import math

import numpy as np
import pytest
import tensorflow as tf

from layers import activations
from params.errors import ConfigError

X = np.array([-3.0, -0.5, 0.0, 0.7, 2.5], dtype=np.float32)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_REFERENCES = {
    "none": lambda x: x,
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "swish": lambda x: x * _sigmoid(x),
}


def test_names_are_the_documented_set():
    assert activations.names() == sorted(_REFERENCES)


@pytest.mark.parametrize("name", sorted(_REFERENCES))
def test_activation_matches_numpy(name):
    got = activations.get(name)(tf.constant(X)).numpy()
    np.testing.assert_allclose(got, _REFERENCES[name](X.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_unknown_name_lists_valid_names():
    with pytest.raises(
        ConfigError, match="unknown activation 'rleu'.*gelu, none, relu, sigmoid, swish, tanh"
    ):
        activations.get("rleu")
