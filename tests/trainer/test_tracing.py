"""How the trainer traces: without AutoGraph, and a user's error comes back as one ConfigError."""

import pytest
import tensorflow as tf

from params.errors import ConfigError
from trainer import tracing


def test_tensor_control_flow_is_written_with_tf_cond():
    def relu_or_negated(x: tf.Tensor) -> tf.Tensor:
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.nn.relu(x), lambda: -x)

    traced = tracing.graph_function(relu_or_negated)
    assert traced(tf.constant([1.0, -2.0, 3.0])).numpy().tolist() == [1.0, 0.0, 3.0]
    assert traced(tf.constant([-1.0, -2.0])).numpy().tolist() == [1.0, 2.0]


def test_a_python_if_on_a_tensor_is_one_config_error_naming_the_fix():
    def branches_in_python(x: tf.Tensor) -> tf.Tensor:
        if tf.reduce_sum(x) > 0:  # AutoGraph would have turned this into tf.cond; the trainer does not
            return x
        return -x

    with pytest.raises(ConfigError) as raised, tracing.user_errors():
        tracing.graph_function(branches_in_python)(tf.constant([1.0]))
    assert "tf.cond / tf.while_loop" in str(raised.value) and "AutoGraph" in str(raised.value)


def test_a_config_error_raised_while_tracing_comes_back_as_itself():
    def refuses(x: tf.Tensor) -> tf.Tensor:
        raise ConfigError("task.body.input_dim : 3 does not match the input's 5")

    with pytest.raises(ConfigError, match=r"^task\.body\.input_dim : 3"), tracing.user_errors():
        tracing.graph_function(refuses)(tf.constant([1.0]))
