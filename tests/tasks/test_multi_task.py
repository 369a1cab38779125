"""Multi-task models (tasks/multi_task.py) and their schedulers (tasks/task_scheduler.py), in process on
a tiny conv net: layers shared by name, the step's task drawn from the step, Lingvo's formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from layers.base_layer import FPropContext
from params import experiment
from params.errors import ConfigError
from tasks import task_scheduler

TINY = ("DigitsMultiTask.num_layers = 1", "DigitsMultiTask.filters = 4", "DigitsMultiTask.hidden_dim = 8")


def _root(model: str = "image.digits_multitask.DigitsMultiTask", bindings=TINY):
    return experiment.resolve(model, gin_bindings=list(bindings))


@pytest.fixture(scope="module")
def built():
    root = _root()
    model = root.task.instantiate()
    batch = next(iter(root.input.train.instantiate().dataset()))
    return root, model, batch


def test_tasks_share_the_encoder_by_name(built):
    _, model, _ = built
    assert model.task_names == ["digit", "parity"]
    assert model.get_task("digit").body is model.get_task("parity").body
    names = sorted(v.name for v in model.trainable_variables)
    assert len(names) == len(set(names)) and sum("parity.body" in n for n in names) == 0
    assert any("parity.softmax" in n for n in names) and any("digit.softmax" in n for n in names)


def test_a_shared_layer_with_other_params_is_one_config_error():
    root = _root()
    p = root.task.copy()
    p.task_params.parity.body.sub[0].filter_shape = [3, 3, 1, 6]
    with pytest.raises(ConfigError, match="share_layers shares 'body' with .*Params differ") as error:
        p.instantiate()
    assert "\n" not in str(error.value)


def _step(model, batch, step):
    ctx = FPropContext(training=True, step=tf.constant(step, tf.int64), seed=model.params.random_seed)
    with tf.GradientTape() as tape:
        metrics = model.fprop(ctx, batch)
    grads = tape.gradient(metrics["loss"][0], model.trainable_variables)
    return metrics, dict(zip([v.name for v in model.trainable_variables], grads))


def test_a_step_trains_the_task_its_step_draws_and_reports_every_task(built):
    _, model, batch = built
    chosen = []
    for step in range(6):
        metrics, grads = _step(model, batch, step)
        again, _ = _step(model, batch, step)
        task = int(metrics["task_schedule/task"][0])
        assert task == int(again["task_schedule/task"][0])  # a function of the step
        name, other = ("digit", "parity") if task == 0 else ("parity", "digit")
        assert float(metrics["loss"][0]) == pytest.approx(float(metrics[f"{name}/loss"][0]))
        assert all(
            float(tf.reduce_max(tf.abs(g))) == 0.0 for n, g in grads.items() if f"{other}.softmax" in n
        )
        assert any(float(tf.reduce_max(tf.abs(g))) > 0.0 for n, g in grads.items() if f"{name}.softmax" in n)
        assert set(metrics) >= {"digit/accuracy", "parity/accuracy", "task_schedule/prob_digit"}
        chosen.append(task)
    assert set(chosen) == {0, 1}


def test_model_task_name_trains_one_task(built):
    root, _, batch = built
    p = root.task.copy()
    p.model_task_name = "parity"
    model = p.instantiate()
    metrics, _ = _step(model, batch, 0)
    assert sorted(metrics) == ["loss", "parity/accuracy", "parity/loss"]
    p.model_task_name = "colour"
    with pytest.raises(ConfigError, match="--model_task_name=colour: no such task; .* has digit, parity"):
        p.instantiate()


def test_the_tensorpipe_form_resolves_with_its_exponential_schedule():
    root = _root("image.digits_multitask.DigitsTwoHeads", ["DigitsTwoHeads.filters = 4"])
    assert root.input.dev.tasks.parity.cls.__name__ == "DigitsParityInput"
    model = root.task.instantiate()
    assert isinstance(model.task_schedule, task_scheduler.ExponentialScheduler)


# ------------------------------------------------------------------------------------ schedulers
def _scheduler(cls, **settings):
    return cls.Params().set(**settings).instantiate()


def _probs(scheduler, step, tasks=("a", "b")):
    return scheduler.probs(FPropContext(step=tf.constant(step, tf.int64)), list(tasks)).numpy()


def test_lingvo_schedules_probabilities():
    constant = _scheduler(task_scheduler.ConstantScheduler, task_probs=[("a", 3.0), ("b", 1.0)])
    np.testing.assert_allclose(_probs(constant, 7), [0.75, 0.25])
    np.testing.assert_allclose(_probs(constant, 7, ("b", "a")), [0.25, 0.75])
    exponential = _scheduler(
        task_scheduler.ExponentialScheduler, alpha=0.1, task_probs=[("a", (0.2, 0.8)), ("b", (0.8, 0.2))]
    )
    np.testing.assert_allclose(_probs(exponential, 0), [0.2, 0.8], rtol=1e-6)
    a = 0.8 + (0.2 - 0.8) * math.exp(-0.1 * 10)
    np.testing.assert_allclose(_probs(exponential, 10), [a, 1 - a], rtol=1e-5)
    robin = _scheduler(task_scheduler.RoundRobinScheduler, tasks=["b", "a"])
    ctx = FPropContext(step=tf.constant(3, tf.int64))
    assert int(robin.sample(ctx, robin.probs(ctx, ["a", "b"]))) == 1


def test_adaptive_schedules_follow_the_moving_scores():
    simple = _scheduler(
        task_scheduler.SimpleAdaptiveScheduler, tasks=["a", "b"], expected=[0.8, 1.0], epsilon=0.1, decay=0.5
    )
    np.testing.assert_allclose(_probs(simple, 0), [0.5, 0.5])
    ctx = FPropContext(training=True)
    metrics = {"a": {"accuracy": (tf.constant(0.8), 1.0)}, "b": {"accuracy": (tf.constant(0.2), 1.0)}}
    simple.observe(ctx, metrics)
    ctx.apply_updates()
    np.testing.assert_allclose(simple.vars["scores"].numpy(), [0.4, 0.1])
    weights = np.array([1 + 0.1 - 0.4 / 0.8, 1 + 0.1 - 0.1])
    np.testing.assert_allclose(_probs(simple, 0), weights / weights.sum(), rtol=1e-6)
    with pytest.raises(ConfigError, match="task 'a' reports no 'accuracy'"):
        simple.observe(ctx, {"a": {"loss": (1.0, 1.0)}, "b": metrics["b"]})


def test_the_draw_is_seeded_by_the_step():
    constant = _scheduler(task_scheduler.ConstantScheduler, task_probs=[("a", 1.0), ("b", 1.0)])

    def draws():
        out = []
        for step in range(40):
            ctx = FPropContext(step=tf.constant(step, tf.int64))
            out.append(int(constant.sample(ctx, constant.probs(ctx, ["a", "b"]))))
        return out

    first = draws()
    assert first == draws() and 10 < sum(first) < 30


def test_tasks_sharing_a_pipelined_encoder_train():
    """GPipe inside the tasks' body (1F1B over two of the test session's logical devices), the
    pipeline shared by both tasks: a step trains the drawn task's loss."""
    from tasks.image.params.digits import GPipeConvNet
    from trainer.train_step import TrainStep

    root = _root("image.digits_multitask.DigitsTwoHeads", ["DigitsTwoHeads.filters = 4"])
    pipelined = GPipeConvNet(filters=4, hidden_dim=8).task()
    pipelined.body.sub[0].schedule = "one_f_one_b"
    p = root.task.copy()
    for name, classes in (("digit", 10), ("parity", 2)):
        task = pipelined.copy()
        task.softmax.num_classes = classes
        p.task_params.set(**{name: task})
    step = TrainStep(p.freeze(), root.input.train)
    for _ in range(2):
        finite, out = step.run(1)
        name = ("digit", "parity")[int(out["task"]["task_schedule/task"])]
        assert bool(finite) and float(out["task"]["loss"]) == float(out["task"][f"{name}/loss"])
