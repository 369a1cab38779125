"""ImageClassifierTask: the task contract (metrics and weights, decode outputs and records)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from layers.base_layer import FPropContext
from layers.core import ActivationLayer, BatchNormLayer, Conv2DLayer, FlattenLayer, PoolingLayer
from layers.parallel.pipeline.gpipe import GPipeLayer
from params.errors import UserError
from tasks.image.input import DigitsInput
from tasks.image.model import ImageClassifierTask
from tests.tasks.pipelined_loss import (
    assert_loss_runs_per_micro_batch_in_last_stage,
    assert_same,
    copy_weights,
    metrics_and_grads,
)

EVAL = FPropContext(training=False)


@pytest.fixture(scope="module")
def task() -> ImageClassifierTask:
    p = ImageClassifierTask.Params()
    p.body.sub = [
        Conv2DLayer.Params().set(name="conv", filter_shape=[3, 3, 1, 4]),
        BatchNormLayer.Params().set(name="bn", dim=4),
        ActivationLayer.Params().set(name="relu", activation="relu"),
        PoolingLayer.Params().set(name="pool"),
        FlattenLayer.Params().set(name="flatten"),
    ]
    p.softmax.set(input_dim=4 * 4 * 4, num_classes=10)
    return p.instantiate()


@pytest.fixture(scope="module")
def batch() -> dict[str, tf.Tensor]:
    images, labels = DigitsInput.Params().set(split="dev").instantiate().load()
    return {"image": tf.constant(images[:24]), "label": tf.constant(labels[:24])}


def _numpy_xent(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -log_probs[np.arange(len(labels)), labels]


def test_metrics_are_loss_and_accuracy_weighted_by_examples(task, batch) -> None:
    metrics = task.fprop(EVAL, batch)
    assert set(metrics) == {"loss", "accuracy"}
    logits = task.compute_predictions(EVAL, batch)["logits"].numpy()
    labels = batch["label"].numpy()
    loss, loss_weight = metrics["loss"]
    accuracy, accuracy_weight = metrics["accuracy"]
    assert float(loss_weight) == float(accuracy_weight) == 24.0
    assert float(loss) == pytest.approx(_numpy_xent(logits, labels).mean(), rel=1e-5)
    assert float(accuracy) == pytest.approx(np.mean(logits.argmax(-1) == labels))


def test_example_weights_drop_padding_from_every_metric(task, batch) -> None:
    weights = np.array([1.0] * 10 + [0.0] * 14, np.float32)
    metrics = task.fprop(EVAL, {**batch, "weight": tf.constant(weights)})
    logits = task.compute_predictions(EVAL, batch)["logits"].numpy()[:10]
    labels = batch["label"].numpy()[:10]
    assert float(metrics["loss"][1]) == 10.0
    assert float(metrics["loss"][0]) == pytest.approx(_numpy_xent(logits, labels).mean(), rel=1e-5)
    assert float(metrics["accuracy"][0]) == pytest.approx(np.mean(logits.argmax(-1) == labels))


def test_partial_batches_run_in_one_compiled_function(task, batch) -> None:
    spec = {"image": tf.TensorSpec([None, 8, 8, 1], tf.float32), "label": tf.TensorSpec([None], tf.int32)}
    eval_fn = tf.function(lambda b: task.fprop(EVAL, b), input_signature=[spec])
    for size in (24, 5):
        part = {k: v[:size] for k, v in batch.items()}
        loss, weight = eval_fn(part)["loss"]
        assert float(weight) == size
        assert float(loss) == pytest.approx(float(task.fprop(EVAL, part)["loss"][0]), rel=1e-5)


def test_training_mode_records_batch_norm_updates(task, batch) -> None:
    ctx = FPropContext(training=True, step=0)
    task.fprop(ctx, batch)
    assert [(layer.path, name) for layer, name, _, _ in ctx.updates] == [("task/body/bn", "moments")]


def test_decode_outputs_and_records(task, batch) -> None:
    weights = tf.constant([1.0] * 20 + [0.0] * 4)
    out = tf.function(lambda b: task.decode(EVAL, b))({**batch, "weight": weights})
    assert {"predicted", "probability", "label"} <= set(out)
    logits = task.compute_predictions(EVAL, batch)["logits"].numpy()
    probs = tf.nn.softmax(logits).numpy()
    np.testing.assert_array_equal(out["predicted"].numpy(), logits.argmax(-1))
    np.testing.assert_allclose(out["probability"].numpy(), probs.max(-1), rtol=1e-5)
    np.testing.assert_array_equal(out["label"].numpy(), batch["label"].numpy())

    metrics = task.create_decoder_metrics()
    decode_out = {k: v.numpy() for k, v in out.items()}
    records = task.post_process_decode_out(decode_out, metrics)
    assert len(records) == 20  # the 4 padding examples are left out
    assert records[0] == {
        "label": int(batch["label"][0]),
        "predicted": int(logits[0].argmax()),
        "probability": pytest.approx(float(probs[0].max()), rel=1e-5),
    }
    json.dumps(records)
    want = np.mean(logits[:20].argmax(-1) == batch["label"].numpy()[:20])
    assert metrics["accuracy"].value == pytest.approx(want)

    # Metrics accumulate over batches: a second, all-correct batch moves the accuracy up.
    task.post_process_decode_out(
        {"label": np.arange(20), "predicted": np.arange(20), "probability": np.ones(20)}, metrics
    )
    assert metrics["accuracy"].value == pytest.approx((want * 20 + 20) / 40)


def test_a_batch_without_images_is_a_user_error(task, batch) -> None:
    with pytest.raises(UserError, match="the batch has no 'image' \\(it has label\\)"):
        task.fprop(EVAL, {"label": batch["label"]})


# ------------------------------------------------------------------------ a pipelined body
def _body_layers(batch_norm: bool):
    layers = [Conv2DLayer.Params().set(name="conv", filter_shape=[3, 3, 1, 4])]
    if batch_norm:
        layers.append(BatchNormLayer.Params().set(name="bn", dim=4))
    return layers + [
        ActivationLayer.Params().set(name="relu", activation="relu"),
        PoolingLayer.Params().set(name="pool"),
        FlattenLayer.Params().set(name="flatten"),
    ]


def _image_task(
    pipeline: dict | None, batch_norm: bool = False, dtype: tf.DType = tf.float32
) -> ImageClassifierTask:
    p = ImageClassifierTask.Params().set(dtype=dtype)
    layers = _body_layers(batch_norm)
    if pipeline is None:
        p.body.sub = layers
    else:
        p.body.sub = [GPipeLayer.Params().set(name="pipeline", layers=layers, split_points=[2], **pipeline)]
    p.softmax.set(input_dim=4 * 4 * 4, num_classes=10)
    return p.instantiate()


CASES = [(4, "always", "fill_drain"), (2, "never", "fill_drain"), (4, "never", "one_f_one_b")]


@pytest.mark.parametrize("m, remat, schedule", CASES)
def test_pipelined_body_computes_the_loss_per_micro_batch_in_its_last_stage(
    batch, m, remat, schedule
) -> None:
    """Labels and weights travel with the micro-batches; the metrics and gradients are the
    unpipelined task's (under either schedule), and the cross-entropy runs on the last stage's
    device, one micro-batch at a time."""
    weighted = {**batch, "weight": tf.constant([1.0, 0.0, 0.5] * 8)}
    plain = _image_task(None)
    piped = _image_task({"num_micro_batches": m, "remat": remat, "schedule": schedule})
    copy_weights(plain, piped)
    want = metrics_and_grads(plain, weighted)
    assert_same(metrics_and_grads(piped, weighted), want, rtol=1e-5, atol=1e-6)
    assert_loss_runs_per_micro_batch_in_last_stage(piped, weighted, k=2, m=m, rows=24 // m)
    # Evaluation runs the same head (the pipeline splits any batch) and gives the same metrics.
    got_eval = piped.fprop(EVAL, weighted)
    for name, (value, weight) in plain.fprop(EVAL, weighted).items():
        got = [float(got_eval[name][0]), float(got_eval[name][1])]
        np.testing.assert_allclose(got, [float(value), float(weight)], rtol=1e-5)


def test_pipelined_float64_body_computes_float64_metrics_equal_to_the_unpipelined(batch) -> None:
    """A float64 model's head multiplies its float64 cross-entropy by the (float32) example weights."""
    weighted = {**batch, "weight": tf.constant([1.0, 0.0, 0.5] * 8)}
    plain = _image_task(None, dtype=tf.float64)
    piped = _image_task({"num_micro_batches": 4, "remat": "always"}, dtype=tf.float64)
    copy_weights(plain, piped)
    metrics = piped.fprop(FPropContext(training=True, step=0, seed=11), weighted)
    assert metrics["loss"][0].dtype == tf.float64 and metrics["accuracy"][1].dtype == tf.float64
    want = metrics_and_grads(plain, weighted)
    assert_same(metrics_and_grads(piped, weighted), want, rtol=1e-12, atol=1e-13)


def test_pipelined_body_with_batch_norm_equals_the_loss_after_the_pipeline(batch) -> None:
    """With batch norm, micro-batches are normalized by their own statistics, so the reference is
    the same pipeline with the loss computed after it (the task's compute_loss)."""
    piped = _image_task({"num_micro_batches": 4, "remat": "always"}, batch_norm=True)

    def loss_after_pipeline(ctx, b):
        return piped.compute_loss(ctx, piped.compute_predictions(ctx, b), b)

    got = metrics_and_grads(piped, batch)
    piped.fprop = loss_after_pipeline  # the instance attribute shadows the task's fprop
    try:
        want = metrics_and_grads(piped, batch)
    finally:
        del piped.fprop
    assert_same(got, want, rtol=1e-5, atol=1e-6)
