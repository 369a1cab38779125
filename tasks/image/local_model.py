"""ImageClassifierTask whose body is a LocalParallelLayer: blocks trained by local losses."""

from __future__ import annotations

import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext
from layers.parallel import local as local_parallel
from params.errors import ConfigError, UserError
from params.hyperparams import InstantiableParams
from tasks import base_task, local
from tasks.image.model import ImageClassifierTask


class LocalImageClassifierTask(ImageClassifierTask):
    """``body`` is a LocalParallelLayer; its last block's output goes to ``softmax`` (the task's loss).

    In a pipelined training step the last block works on the batch taken K-1 steps earlier, so the
    labels and weights travel through the pipeline with it and the loss uses those.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.body = local_parallel.LocalParallelLayer.Params()
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        if not isinstance(self.body, local_parallel.LocalParallelLayer):
            raise ConfigError(f"{self.path}: params.body must be LocalParallelLayer.Params()")

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict:
        for key in ("image", "label"):
            if key not in batch:
                raise UserError(f"image task: the batch has no {key!r} (it has {', '.join(sorted(batch))})")
        images, labels = batch["image"], tf.cast(batch["label"], tf.int32)
        targets = {"label": labels, "weight": self._weights(batch, labels)}
        out = self.body(ctx, images, targets)
        return {"features": out.output, "logits": self.softmax.logits(ctx, out.output), "local": out}

    def compute_loss(
        self, ctx: FPropContext, predictions: dict, batch: dict[str, tf.Tensor]
    ) -> base_task.Metrics:
        out = predictions["local"]
        metrics = super().compute_loss(ctx, predictions, out.targets)
        return local.with_local_losses(metrics, out)

    def model_analysis(self) -> str:
        return local_parallel.local_reports(self)
