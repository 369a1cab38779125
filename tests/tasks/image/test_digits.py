"""The registered image.digits.ConvNet experiment: its resolved Params and its knobs. That its defaults
train to the advertised dev accuracy (and the loss falls tenfold) is tests/trainer/test_default_experiment.py,
through the binary, on the run that tests/conftest.py's ``default_run`` makes once."""

from __future__ import annotations

import gin
import pytest
import tensorflow as tf

from layers.base_layer import FPropContext
from params import experiment, registry
from tasks.image.params.digits import ConvNet

KEY = "image.digits.ConvNet"


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def test_registered_with_a_describing_docstring() -> None:
    assert registry.get(KEY) is ConvNet
    assert "8x8 digits" in registry.doc_line(ConvNet)
    assert ConvNet.dataset_names() == ["dev", "test", "train"]


def test_resolved_params_text_holds_the_learner_and_inputs() -> None:
    text = experiment.resolve(KEY).to_text()
    assert "task.train.learning_rate : 0.003\n" in text
    assert "task.train.optimizer : 'adam'\n" in text
    assert "input.train.repeat : True\n" in text
    assert "input.dev.drop_remainder : False\n" in text
    assert "input.test.split : 'test'\n" in text


def test_gin_knobs_and_params_overrides_reach_the_resolved_params() -> None:
    root = experiment.resolve(
        KEY,
        gin_bindings=["ConvNet.learning_rate = 0.01", "ConvNet.batch_size = 16"],
        params_override="task.train.max_steps : 42",
    )
    assert root.task.train.learning_rate == 0.01
    assert root.input.train.batch_size == 16 and root.input.dev.batch_size == 16
    assert root.task.train.max_steps == 42


@pytest.mark.parametrize("num_layers, keep_prob", [(1, 1.0), (4, 0.8)])
def test_other_depths_build_and_run(num_layers: int, keep_prob: float) -> None:
    """Pooling stops at 1x1, so any depth gives a valid network; dropout is added when asked."""
    task = ConvNet(num_layers=num_layers, filters=4, hidden_dim=8, keep_prob=keep_prob).task().instantiate()
    batch = {"image": tf.zeros([3, 8, 8, 1]), "label": tf.constant([0, 1, 2])}
    metrics = task.fprop(FPropContext(training=True, step=0), batch)
    assert float(metrics["loss"][1]) == 3.0
    assert hasattr(task.body, "dropout") == (keep_prob < 1.0)


def test_wide_convnet_is_the_convnet_at_twice_the_width() -> None:
    """Only the width differs from ConvNet (the multiworker benchmark's model); gin sets it too."""
    wide, narrow = experiment.resolve("image.digits.WideConvNet"), experiment.resolve(KEY)
    assert [lp.filter_shape for lp in wide.task.body.sub if lp.name.startswith("conv")] == [
        [3, 3, 1, 64],
        [3, 3, 64, 128],
    ]
    assert wide.task.body.sub[-1].input_dim == 2 * 2 * 128
    differing = set(wide.to_text().splitlines()) ^ set(narrow.to_text().splitlines())
    assert {line.split(" : ")[0] for line in differing} == {
        "model",
        "task.body.sub[0].filter_shape",
        "task.body.sub[1].dim",
        "task.body.sub[4].filter_shape",
        "task.body.sub[5].dim",
        "task.body.sub[9].input_dim",
    }
    bound = experiment.resolve("image.digits.WideConvNet", gin_bindings=["WideConvNet.filters = 8"])
    assert bound.task.body.sub[0].filter_shape == [3, 3, 1, 8]
