"""A task holding one model and nothing else: how a benchmark builds a plain layer (the gpipe
benchmark's dense stack) under ``task.precision``."""

from __future__ import annotations

from layers.base_layer import BaseLayer
from params.hyperparams import InstantiableParams
from tasks.base_task import BaseTask


class ModelTask(BaseTask):
    """A task holding one model (``model``) and nothing else: the benchmarks' way to build a plain
    layer (the gpipe stack) under ``task.precision``."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802
        p = super().Params()
        p.define("model", None, "The model's Params.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self.create_child("model", self.params.model)
