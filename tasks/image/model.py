"""ImageClassifierTask: a layer stack (``body``) over images, then a softmax over classes."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext
from layers.core import SequentialLayer, SoftmaxLayer
from layers.parallel.pipeline.gpipe import GPipeLayer
from params.errors import UserError
from params.hyperparams import InstantiableParams
from tasks import base_task


def _get(batch: dict[str, tf.Tensor], key: str) -> tf.Tensor:
    if key not in batch:
        raise UserError(
            f"image task: the batch has no {key!r} (it has {', '.join(sorted(batch)) or 'nothing'})"
        )
    return batch[key]


class ImageClassifierTask(base_task.BaseTask):
    """Classifies ``batch['image']`` into ``batch['label']``.

    ``body`` maps images to feature vectors ``[batch, softmax.input_dim]``; ``softmax`` gives the logits.
    An optional ``batch['weight']`` (0 for padding examples) weights every metric and decode record.

    When the body is a GPipeLayer (or a SequentialLayer ending in one), ``fprop`` computes the softmax
    and the per-example loss in the pipeline's last stage, one micro-batch at a time (the labels and
    weights travel with the micro-batches), and sums them over micro-batches: the metrics equal the
    unpipelined ones, and the full batch's logits never exist at once.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define(
            "body", SequentialLayer.Params(), "Layers from images to features (conv/bn/pool/flatten/...)."
        )
        p.define("softmax", SoftmaxLayer.Params(), "Features -> class logits and cross-entropy.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self.create_child("body", self.params.body)
        self.create_child("softmax", self.params.softmax)

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``{'features': body output, 'logits': [batch, num_classes]}``."""
        features = self.body(ctx, self._images(batch))
        return {"features": features, "logits": self.softmax.logits(ctx, features)}

    def _pipelined_body(self) -> tuple[list[BaseLayer], GPipeLayer] | None:
        """(the layers before the pipeline, the pipeline) when the body ends in a GPipeLayer."""
        if isinstance(self.body, GPipeLayer):
            return [], self.body
        if isinstance(self.body, SequentialLayer):
            layers = self.body.sub_layers()
            if layers and isinstance(layers[-1], GPipeLayer):
                return layers[:-1], layers[-1]
        return None

    def fprop(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> base_task.Metrics:
        pipelined = self._pipelined_body()
        if pipelined is None:
            return super().fprop(ctx, batch)
        before, pipeline = pipelined
        images = self._images(batch)
        labels = tf.cast(_get(batch, "label"), tf.int32)
        weights = self._weights(batch, labels)
        for layer in before:
            images = layer(ctx, images)

        def head(ctx: FPropContext, features: tf.Tensor, targets: dict) -> dict[str, tf.Tensor]:
            out = self.softmax.fprop(ctx, features, targets["label"], targets["weight"])
            predicted = tf.argmax(out["logits"], axis=-1, output_type=tf.int32)
            xent = out["per_example_xent"]
            w = tf.cast(targets["weight"], xent.dtype)  # float64 for a float64 model
            correct = tf.cast(tf.equal(predicted, targets["label"]), xent.dtype)
            return {"xent": xent * w, "correct": correct * w}

        sums = pipeline(ctx, images, head=head, head_inputs={"label": labels, "weight": weights})
        # The total from the batch, not from the pipeline's outputs: a loss normalized by those would
        # make each micro-batch's gradient wait for every micro-batch's forward (1F1B cannot run it).
        total = tf.cast(tf.reduce_sum(weights), sums["xent"].dtype)
        loss = tf.math.divide_no_nan(tf.reduce_sum(sums["xent"]), total)
        accuracy = tf.math.divide_no_nan(tf.reduce_sum(sums["correct"]), total)
        return {"loss": (loss, total), "accuracy": (accuracy, total)}

    def _images(self, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        images = _get(batch, "image")
        if images.shape.rank is not None and images.shape.rank != 4:
            raise UserError(
                f"image task: batch['image'] must be [batch, height, width, channels], got {images.shape}"
            )
        return images

    def _weights(self, batch: dict[str, tf.Tensor], labels: tf.Tensor) -> tf.Tensor:
        if "weight" in batch:
            return tf.cast(batch["weight"], tf.float32)
        return tf.ones(tf.shape(labels), tf.float32)

    def compute_loss(
        self, ctx: FPropContext, predictions: dict[str, tf.Tensor], batch: dict[str, tf.Tensor]
    ) -> base_task.Metrics:
        """``loss`` (mean cross-entropy) and ``accuracy``, each weighted by the number of examples."""
        labels = tf.cast(_get(batch, "label"), tf.int32)
        weights = self._weights(batch, labels)
        out = self.softmax.fprop(ctx, predictions["features"], labels, weights)
        predicted = tf.argmax(predictions["logits"], axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predicted, labels), tf.float32)
        total = out["total_weight"]
        accuracy = tf.math.divide_no_nan(tf.cast(tf.reduce_sum(correct * weights), total.dtype), total)
        return {"loss": (out["avg_xent"], total), "accuracy": (accuracy, total)}

    def decode(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Per example: ``predicted`` class, its ``probability``, the true ``label`` and its ``weight``."""
        logits = self.compute_predictions(ctx, batch)["logits"]
        labels = _get(batch, "label")
        probs = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
        return {
            "predicted": tf.argmax(logits, axis=-1, output_type=tf.int32),
            "probability": tf.reduce_max(probs, axis=-1),
            "label": tf.cast(labels, tf.int32),
            "weight": self._weights(batch, labels),
        }

    def create_decoder_metrics(self) -> dict[str, base_task.DecoderMetric]:
        return {"accuracy": base_task.AverageMetric()}

    def post_process_decode_out(
        self, decode_out: dict[str, np.ndarray], metrics: dict[str, base_task.DecoderMetric]
    ) -> list[dict[str, Any]]:
        """One record ``{'label', 'predicted', 'probability'}`` per example of weight > 0."""
        records = []
        weights = decode_out.get("weight", np.ones_like(decode_out["label"], dtype=np.float32))
        for label, predicted, probability, weight in zip(
            decode_out["label"], decode_out["predicted"], decode_out["probability"], weights
        ):
            if weight <= 0:
                continue
            metrics["accuracy"].update(float(label == predicted), float(weight))
            records.append(
                {"label": int(label), "predicted": int(predicted), "probability": float(probability)}
            )
        return records

    def inference(self, input_generator: Any) -> dict[str, Any]:
        """``serving_default``: ``images [batch, height, width, channels]`` -> ``classes`` (int32) and
        ``probabilities`` ([batch, num_classes]); as ``decode`` computes ``predicted`` and ``probability``."""
        spec = input_generator.dataset().element_spec["image"]
        ctx = FPropContext(training=False, seed=self.params.random_seed)

        @tf.function(
            input_signature=[tf.TensorSpec([None, *spec.shape[1:]], spec.dtype, name="images")],
            autograph=False,
        )
        def classify(images: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = self.compute_predictions(ctx, {"image": images})["logits"]
            return {
                "classes": tf.argmax(logits, axis=-1, output_type=tf.int32),
                "probabilities": tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1),
            }

        return {"serving_default": classify}
