"""Container layers: SequentialLayer (a list of layers applied in order), RepeatLayer, and OnKeyLayer
(one layer applied to one entry of a dict state)."""

from __future__ import annotations

from typing import Any

from layers import checks
from layers.base_layer import BaseLayer, FPropContext
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params


def _check_layer_params(layer: BaseLayer, what: str, value: Any) -> None:
    if not isinstance(value, InstantiableParams) or not (
        isinstance(value.cls, type) and issubclass(value.cls, BaseLayer)
    ):
        got = repr(value.cls) if isinstance(value, InstantiableParams) else type(value).__name__
        raise ConfigError(f"{layer.path}: params.{what} must be a layer's Params (Layer.Params()), got {got}")


class SequentialLayer(BaseLayer):
    """Applies the ``sub`` layers in order; each child is named by its own name, else ``sub_<i>``."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("sub", [], "List of layer Params applied in order (children named by name or sub_<i>).")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        sub = self.params.sub
        if not isinstance(sub, (list, tuple)):
            raise ConfigError(f"{self.path}: params.sub must be a list of layer Params, got {sub!r}")
        self._sub_names: list[str] = []
        for i, sub_params in enumerate(sub):
            _check_layer_params(self, f"sub[{i}]", sub_params)
            name = sub_params.name or f"sub_{i}"
            self.create_child(name, sub_params)
            self._sub_names.append(name)

    def sub_layers(self) -> list[BaseLayer]:
        """The children in the order they are applied."""
        return [getattr(self, name) for name in self._sub_names]

    def fprop(self, ctx: FPropContext, x: Any) -> Any:
        for layer in self.sub_layers():
            x = layer(ctx, x)
        return x


class RepeatLayer(BaseLayer):
    """Applies ``repeat`` copies of ``body`` in order, each with its own weights (``body_<i>``)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("body", None, "Params of the repeated layer.", value_type=Params)
        p.define("repeat", 1, "Number of copies, applied in order; each has its own weights.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        _check_layer_params(self, "body", self.params.body)
        repeat = checks.positive_int(self, "repeat")
        self.create_children("body", [self.params.body] * repeat)

    def fprop(self, ctx: FPropContext, x: Any) -> Any:
        for layer in self.body:
            x = layer(ctx, x)
        return x


class OnKeyLayer(BaseLayer):
    """Applies ``body`` to one entry of a dict state and passes the other entries through.

    A pipeline's micro-batches can carry several batch-major tensors (inputs with their targets or
    masks) as one dict; wrapped this way, any ``fprop(ctx, x) -> x`` layer works on its entry, and a
    last layer can compute a per-example loss inside the last stage, so the full batch's output and
    its gradient never exist at once.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("body", None, "Params of the layer applied to state[key].", value_type=Params)
        p.define("key", "x", "The dict entry the body transforms.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        _check_layer_params(self, "body", self.params.body)
        self.create_child("body", self.params.body)

    def fprop(self, ctx: FPropContext, state: dict) -> dict:
        key = self.params.key
        if not isinstance(state, dict) or key not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ConfigError(f"{self.path}: expected a dict state with entry {key!r}, got {got}")
        return {**state, key: self.body(ctx, state[key])}
