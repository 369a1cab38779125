"""A Transformer LM trained with local parallelism: embedding, layers and final layer norm cut into
blocks, each block trained by its own loss (a small softmax on its output; the last block's loss is
the LM's). The softmax is not tied to the embedding: tying would send the last block's gradient to
the first block. No decoding (evaluation reports log-perplexity)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from layers.base_layer import BaseLayer, FPropContext
from layers.core import LayerNorm, OnKeyLayer, SoftmaxLayer
from layers.parallel import local as local_parallel
from layers.transformer_input import TransformerInput
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params
from tasks import local
from tasks.base_task import BaseTask, Metrics
from tasks.lm import vocabulary
from tasks.lm.metrics import token_metrics


class LocalTransformerLmTask(BaseTask):
    """``local``: a LocalParallelLayer over ``{'x', 'paddings'}`` states, whose layers start with the
    embedding of ``x`` (the ids) and end with a layer norm; then ``softmax`` gives the logits."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("vocab", vocabulary.vocab_params(size=36), "Vocabulary (the inputs use the same).")
        p.define("local", local_parallel.LocalParallelLayer.Params(), "The blocks (see local_lm_layers).")
        p.define("softmax", SoftmaxLayer.Params(), "Output layer (num_classes: the vocabulary size).")
        p.define("label_smoothing", 0.0, "Label smoothing of the training loss.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        if not isinstance(p.local, InstantiableParams) or not issubclass(
            p.local.cls, local_parallel.LocalParallelLayer
        ):
            raise ConfigError(f"{self.path}: params.local must be LocalParallelLayer.Params()")
        self.create_child("local", p.local)
        self.create_child("softmax", p.softmax.copy().set(num_classes=p.vocab.size))

    def compute_predictions(self, ctx: FPropContext, batch: dict[str, tf.Tensor]) -> dict[str, Any]:
        state = {"x": batch["ids"], "paddings": batch["paddings"]}
        targets = {"labels": batch["labels"], "paddings": batch["paddings"]}
        if "label_entropy" in batch:
            targets["label_entropy"] = batch["label_entropy"]
        out = self.local(ctx, state, targets)
        return {"logits": self.softmax.logits(ctx, out.output["x"]), "local": out}

    def compute_loss(self, ctx: FPropContext, predictions: Any, batch: dict[str, tf.Tensor]) -> Metrics:
        out = predictions["local"]
        targets = out.targets
        metrics, weights = token_metrics(
            predictions["logits"], targets["labels"], targets["paddings"], self.params.label_smoothing
        )
        if "label_entropy" in targets:  # as TransformerLmTask: the gap to the best achievable value
            num_tokens = metrics["log_pplx"][1]
            best = tf.math.divide_no_nan(tf.reduce_sum(targets["label_entropy"] * weights), num_tokens)
            metrics["achievable_log_pplx"] = (best, num_tokens)
            metrics["log_pplx_gap"] = (metrics["log_pplx"][0] - best, num_tokens)
        return local.with_local_losses(metrics, out)

    def model_analysis(self) -> str:
        return local_parallel.local_reports(self)


def local_lm_layers(
    vocab_size: int, model_dim: int, stack_layers: list[Params], max_length: int, dropout_prob: float = 0.0
) -> list:
    """``[embedding, layers_0, ..., final_ln]``, each working on the ``'x'`` of a state dict."""
    emb = TransformerInput.Params().set(
        vocab_size=vocab_size, model_dim=model_dim, max_length=max_length, dropout_prob=dropout_prob
    )
    layers = [OnKeyLayer.Params().set(name="emb", body=emb)]
    layers += [lp.copy().set(name=f"layers_{i}") for i, lp in enumerate(stack_layers)]
    layers.append(OnKeyLayer.Params().set(name="final_ln", body=LayerNorm.Params().set(input_dim=model_dim)))
    return layers
