"""The compiled multi-step loop does exactly what the same steps do one call at a time."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from layers.base_layer import FPropContext
from params import experiment
from params.errors import ConfigError
from tasks.learner import Learner
from tests.trainer import runner
from tests.trainer.linear_experiment import LinearTask
from trainer.placement import OnDevice, StepFunctions
from trainer.train_step import TrainStep


def _params(data_dir, override=""):
    root = experiment.resolve(runner.MODEL, params_override=runner.data_override(data_dir) + override)
    return experiment.task_params_for(root, "train"), root.input.train


def _reference_weights(task_params, input_params, num_steps):
    """One eager-dispatched tf.function step per Python iteration: the obvious training loop."""
    task = task_params.instantiate()
    iterator = iter(input_params.instantiate().dataset())
    variables = task.trainable_variables
    learner = Learner(task_params.train, variables)

    @tf.function
    def step_fn(step):
        batch = next(iterator)
        ctx = FPropContext(training=True, step=step, seed=task.params.random_seed)
        with tf.GradientTape() as tape:
            loss = task.fprop(ctx, batch)["loss"][0]
        learner.apply_gradients(zip(tape.gradient(loss, variables), variables), step)
        ctx.apply_updates()

    for step in range(num_steps):
        step_fn(tf.constant(step, tf.int64))
    return {v.name: v.numpy() for v in task.variables}


def test_chunks_of_steps_equal_single_steps(data_dir):
    task_params, input_params = _params(data_dir)
    train = TrainStep(task_params, input_params)
    for chunk in (3, 1, 5):
        finite, outputs = train.run(chunk)
        assert bool(finite.numpy())
    assert int(train.global_step.numpy()) == 9
    assert set(outputs["task"]) == {"loss", "mae"}
    assert set(outputs["learner"]) >= {"learning_rate", "grad_norm"}
    expected = _reference_weights(task_params, input_params, 9)
    actual = {v.name: v.numpy() for v in train.task.variables}
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=1e-6, err_msg=name)
    assert float(actual["task.moving_mean_y:0"]) != 0.0  # the batch statistic was applied

    # A placement is any object with the Placement hooks: one that runs a compiled step per batch of
    # the step's iterator, as a Python loop, trains the same.
    one_by_one = TrainStep(task_params, input_params, _OneStepPerCall())
    for chunk in (4, 5):
        assert bool(one_by_one.run(chunk)[0].numpy())
    for var in one_by_one.task.variables:
        np.testing.assert_allclose(var.numpy(), expected[var.name], rtol=0, atol=1e-6, err_msg=var.name)


class _OneStepPerCall:
    """A Placement that is no OnDevice: its hooks are OnDevice's but ``compile``, which calls the
    step's compiled ``guarded_step`` on each next batch (the mesh placements' loop)."""

    def __init__(self) -> None:
        self._defaults = OnDevice()

    def __getattr__(self, name):
        return getattr(self._defaults, name)

    def compile(self, steps: StepFunctions):
        compiled = tf.function(steps.guarded_step, autograph=False)

        def run(num_steps):
            finite, outputs = tf.constant(True), steps.zero_outputs
            for _ in range(num_steps):
                finite, outputs = compiled(steps.next_batch())
            return finite, outputs

        return run


def test_a_nan_loss_stops_the_loop_before_its_update(data_dir):
    task_params, input_params = _params(data_dir, "; task.nan_at_step : 4")
    train = TrainStep(task_params, input_params)
    finite, outputs = train.run(10)
    assert not bool(finite.numpy())
    assert np.isnan(outputs["task"]["loss"].numpy())
    assert int(train.global_step.numpy()) == 4
    expected = _reference_weights(*_params(data_dir), 4)
    for var in train.task.variables:
        np.testing.assert_allclose(var.numpy(), expected[var.name], rtol=0, atol=1e-6, err_msg=var.name)
    assert bool(train.weights_finite().numpy())


def test_a_task_without_a_loss_is_a_config_error(data_dir):
    task_params, input_params = _params(data_dir)
    task_params = task_params.copy()
    task_params.cls = _NoLossTask
    with pytest.raises(ConfigError, match="must return a 'loss' entry"):
        TrainStep(task_params.freeze(), input_params)


class _NoLossTask(LinearTask):
    def compute_loss(self, ctx, predictions, batch):
        metrics = super().compute_loss(ctx, predictions, batch)
        return {"mse": metrics["loss"]}
