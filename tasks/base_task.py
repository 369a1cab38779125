"""The task contract: a model (a BaseLayer tree) plus how it is trained, evaluated and decoded.

Jobs call, with ``batch`` a dict of tensors from the task's input generator:
- ``compute_predictions(ctx, batch)`` -> predictions (a dict of tensors);
- ``compute_loss(ctx, predictions, batch)`` -> metrics ``{name: (value, weight)}`` with a ``loss``
  entry; evaluation averages each metric over batches by its weight;
- ``decode(ctx, batch)`` -> decode output (a dict of tensors), run inside ``tf.function``;
- ``create_decoder_metrics()`` -> ``{name: DecoderMetric}``, fresh for each checkpoint decoded;
- ``post_process_decode_out(decode_out, metrics)`` -> JSON-able records for the decoder's file,
  updating the decoder metrics on the way (runs eagerly, on NumPy values).

``tools.export`` calls ``inference(input_generator)`` (Lingvo's per-task inference graph): the serving
functions of a SavedModel, computed the way ``decode`` computes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from layers import precision
from layers.base_layer import BaseLayer, FPropContext
from layers.parallel.pipeline import gpipe
from params.hyperparams import InstantiableParams, Params
from tasks import learner

Metrics = dict[str, tuple[tf.Tensor, tf.Tensor]]


def eval_params() -> Params:
    """``task.eval``: how evaler jobs evaluate checkpoints."""
    p = Params()
    p.define("samples_per_summary", 0, "Examples evaluated per checkpoint (0: the whole data set).")
    p.define(
        "checkpoints",
        "all",
        "all: evaluate every checkpoint, in order; latest: only the newest one when the job is free.",
    )
    p.define("poll_interval_seconds", 2.0, "How often evaler and decoder jobs look for checkpoints.")
    return p


def decode_params() -> Params:
    """``task.decode``: how decoder jobs decode checkpoints."""
    p = Params()
    p.define("samples_per_summary", 0, "Examples decoded per checkpoint (0: the whole data set).")
    return p


def _policy(params: Params) -> str:
    """``task.precision``; float32 for Params written without it (an older params.txt)."""
    return params.precision if "precision" in params else "float32"


class DecoderMetric:
    """A metric accumulated in Python over a checkpoint's decode outputs."""

    def update(self, value: float, weight: float = 1.0) -> None:
        raise NotImplementedError

    @property
    def value(self) -> float:
        raise NotImplementedError


class AverageMetric(DecoderMetric):
    """Weighted mean of the values it is given."""

    def __init__(self) -> None:
        self._total = 0.0
        self._weight = 0.0

    def update(self, value: float, weight: float = 1.0) -> None:
        self._total += float(value) * float(weight)
        self._weight += float(weight)

    @property
    def value(self) -> float:
        return self._total / self._weight if self._weight else 0.0


class BaseTask(BaseLayer):
    """Base of tasks: owns the model layers and the train/eval/decode settings."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.name = "task"
        p.define("train", learner.train_params(), "Learner and training-loop settings.")
        p.define("eval", eval_params(), "Evaluation settings.")
        p.define("decode", decode_params(), "Decoding settings.")
        p.define(
            "precision",
            "float32",
            "float32; mixed_bfloat16 (layers compute in bfloat16, weights, optimizer slots and the loss "
            "stay float32); mixed_float16 (the same in float16, with loss scaling). docs/precision.md",
        )
        return p

    def __init__(self, params: Params, parent: BaseLayer | None = None) -> None:
        compute = precision.compute_dtype(_policy(params))
        if compute is not None and params.dtype in (None, tf.float32):
            params = params.copy()
            params.dtype = compute
        super().__init__(params, parent)

    def _master_dtype_of(self, params: Params) -> tf.DType | None:
        return precision.MASTER_DTYPE if precision.compute_dtype(_policy(params)) is not None else None

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.compute_predictions")

    def compute_loss(self, ctx: FPropContext, predictions: Any, batch: dict[str, tf.Tensor]) -> Metrics:
        raise NotImplementedError(f"{type(self).__name__}.compute_loss")

    def fprop(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> Metrics:
        """Predictions then loss: the metrics of one batch."""
        return self.compute_loss(ctx, self.compute_predictions(ctx, batch), batch)

    def decode(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        raise NotImplementedError(f"{type(self).__name__}.decode")

    def model_analysis(self) -> str:
        """Extra text for ``model_analysis.txt``: by default the partition report of each pipeline."""
        return gpipe.partition_reports(self)

    def create_decoder_metrics(self) -> dict[str, DecoderMetric]:
        return {}

    def inference(self, input_generator: Any) -> dict[str, Any]:
        """Serving functions for ``tools.export``: ``{signature name: tf.function with an
        input_signature returning a dict of tensors}``, one of them ``serving_default``.

        ``input_generator`` is an evaluation data set's input: the shapes and vocabulary the model was
        trained with. Only TensorFlow ops: the SavedModel must load without this project. The built-in
        tasks trace them with ``autograph=False``, as the trainer traces its functions (tensor control
        flow with ``tf.cond`` / ``tf.while_loop``): AutoGraph's conversion was half of an LM's export."""
        raise NotImplementedError(f"{type(self).__name__} has no inference() to export")

    def post_process_decode_out(
        self, decode_out: dict[str, np.ndarray], metrics: dict[str, DecoderMetric]
    ) -> list[dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__}.post_process_decode_out")
