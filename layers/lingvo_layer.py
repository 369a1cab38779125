"""Lingvo's layer API over BaseLayer, for layers carried over from Lingvo: ``py_utils`` and ``BaseLayer``.

    from layers import lingvo_layer as py_utils       # was: from lingvo.core import py_utils
    from layers.lingvo_layer import LingvoLayer       # was: base_layer.BaseLayer

    class Proj(LingvoLayer):
        @classmethod
        def Params(cls):
            p = super().Params()
            p.define("input_dim", 0, "Depth of the input.")
            p.define("output_dim", 0, "Depth of the output.")
            return p

        def _CreateLayerVariables(self):               # or CreateVariable calls in __init__
            p = self.params
            self.CreateVariable("w", py_utils.WeightParams([p.input_dim, p.output_dim],
                                                          py_utils.WeightInit.Gaussian(0.1)))

        def FProp(self, theta, inputs):
            return tf.matmul(inputs, theta.w)

A LingvoLayer is a BaseLayer, so it goes anywhere a layer goes (a task's child, a GPipe stage); calling
it with a context (``layer(ctx, x)``, what TensorPipe layers do) runs ``FProp(self.theta, x)``. It has:
``CreateVariable(name, WeightParams(...))``, ``CreateChild``, ``CreateChildren``,
``_CreateLayerVariables`` (run once, after the outermost ``__init__``, as Lingvo does), ``theta`` (a
NestedMap of the layer's variables and, under each child's name, the child's theta), ``vars`` (a NestedMap
of its own variables), ``FProp(theta, ...)``, ``FPropDefaultTheta(...)`` and ``do_eval``. Inside
``FProp``, ``self.fprop_context`` is the step's FPropContext (training, step, seed, micro-batch), so a
TensorPipe child is called as ``self.child(self.fprop_context, x)``.

What differs from Lingvo: ``theta`` holds the variables themselves (TensorFlow 2 reads them where they
are used), not tensors a caller may replace; a child whose ``Params`` is a TensorPipe layer's is computed
with its own weights whatever theta is passed. Params methods are this project's snake_case ones
(``p.define``), or Lingvo's through ``params.lingvo_compat``.

Under a task's mixed precision policy (``task.precision``, docs/precision.md) a LingvoLayer is cast as
every layer is: its weights are float32 variables (``vars``), ``theta`` gives them in the layer's
compute dtype, and the float tensors passed to ``FProp`` are cast to it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import tensorflow as tf

from layers import precision
from layers.base_layer import BaseLayer, FPropContext, weight_init_params, weight_params
from layers.nested_map import NestedMap
from params.hyperparams import Params

__all__ = ["LingvoLayer", "NestedMap", "WeightInit", "WeightParams"]


class WeightInit:
    """Lingvo's ``py_utils.WeightInit``: each method returns this project's ``weight_init_params``."""

    @staticmethod
    def Gaussian(scale: float = 1.0, seed: int | None = None) -> Params:  # noqa: N802 (Lingvo's names)
        del seed  # weights are seeded by (random_seed, variable path) here
        return weight_init_params("gaussian", scale)

    @staticmethod
    def TruncatedGaussian(scale: float = 1.0, seed: int | None = None) -> Params:  # noqa: N802
        del seed
        return weight_init_params("truncated_gaussian", scale)

    @staticmethod
    def Uniform(scale: float = 1.0, seed: int | None = None) -> Params:  # noqa: N802
        del seed
        return weight_init_params("uniform", scale)

    @staticmethod
    def Xavier(scale: float = 1.0, seed: int | None = None) -> Params:  # noqa: N802
        del seed
        return weight_init_params("xavier", scale)

    @staticmethod
    def Constant(scale: float = 1.0) -> Params:  # noqa: N802
        return weight_init_params("constant", scale)


def WeightParams(  # noqa: N802
    shape: list[int] | tuple[int, ...],
    init: Params | None = None,
    dtype: Any = None,
    collections: Any = None,
    **unused: Any,
) -> Params:
    """Lingvo's ``py_utils.WeightParams``: this project's ``weight_params`` (``collections`` and
    Lingvo's mesh arguments are not used; ``dims`` names dimensions for a mesh here)."""
    del collections, unused
    return weight_params(shape, init=init, dtype=dtype)


_CONTEXTS = threading.local()


def _context_stack() -> list[FPropContext]:
    if not hasattr(_CONTEXTS, "stack"):
        _CONTEXTS.stack = []
    return _CONTEXTS.stack


class LingvoLayer(BaseLayer):
    """A BaseLayer with Lingvo's layer method names (see the module doc)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def wrapped(self: LingvoLayer, *args: Any, **kw: Any) -> None:
            depth = self.__dict__.get("_lingvo_init_depth", 0)
            object.__setattr__(self, "_lingvo_init_depth", depth + 1)
            try:
                init(self, *args, **kw)
            finally:
                object.__setattr__(self, "_lingvo_init_depth", depth)
            if depth == 0:
                self._CreateLayerVariables()

        cls.__init__ = wrapped

    def __init__(self, params: Params, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        # Under a task's mixed precision policy: the compute dtype its float32 weights are read in
        # (theta) and its float inputs cast to; None: each weight and input as it is.
        self._mixed_dtype = self.params.dtype if isinstance(self.vars, precision.CastWeights) else None
        self._cast_names: tuple[str, ...] = ()
        self.vars = NestedMap()
        if self.__dict__.get("_lingvo_init_depth", 0) == 0:  # no subclass __init__ wraps this one
            self._CreateLayerVariables()

    # ------------------------------------------------------------------------------- building
    def _CreateLayerVariables(self) -> None:  # noqa: N802 (Lingvo's names, kept on purpose)
        """Override to create variables once every child exists (Lingvo's hook). Default: none."""

    def CreateVariable(self, name: str, var_params: Params, trainable: bool = True) -> Any:  # noqa: N802
        """Lingvo's ``CreateVariable(name, WeightParams(...))``: the variable, also in ``self.vars``."""
        p = var_params.copy()
        if not trainable:
            p.trainable = False
        return self.create_variable(name, p)

    def create_variable(self, name: str, wp: Params) -> Any:
        """``BaseLayer.create_variable``; under a mixed precision policy a weight of the layer's dtype
        is made float32 and read through ``theta`` in the layer's dtype."""
        if self._mixed_dtype is None or (wp.dtype or self.params.dtype) != self.params.dtype:
            return super().create_variable(name, wp)
        wp = wp.copy()
        wp.dtype = self._master_dtype
        var = super().create_variable(name, wp)
        self._cast_names = (*self._cast_names, name)
        return var

    def CreateChild(self, name: str, params: Params) -> BaseLayer:  # noqa: N802
        return self.create_child(name, params)

    def CreateChildren(self, name: str, params_list: list[Params]) -> list[BaseLayer]:  # noqa: N802
        return self.create_children(name, params_list)

    # -------------------------------------------------------------------------------- computing
    @property
    def theta(self) -> NestedMap:
        """The layer's variables by name and each child's theta under the child's name."""
        theta = NestedMap(self.vars)
        for name in self._cast_names:
            theta[name] = tf.cast(self.vars[name], self._mixed_dtype)
        for name, child in self.children().items():
            theta[name] = [_theta_of(c) for c in child] if isinstance(child, list) else _theta_of(child)
        return theta

    def _inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``args`` and ``kwargs`` with every float tensor in the mixed precision dtype (unchanged
        without a policy)."""
        if self._mixed_dtype is None:
            return args, kwargs

        def cast(x: Any) -> Any:
            if isinstance(x, (tf.Tensor, tf.Variable)) and x.dtype.is_floating:
                return tf.cast(x, self._mixed_dtype)
            return x

        return tf.nest.map_structure(cast, args), tf.nest.map_structure(cast, kwargs)

    @property
    def fprop_context(self) -> FPropContext:
        """The FPropContext of the forward pass running now (an evaluation context outside one)."""
        stack = _context_stack()
        return stack[-1] if stack else FPropContext(training=False)

    @property
    def do_eval(self) -> bool:
        """Lingvo's ``do_eval``: whether this forward pass is not training."""
        return not self.fprop_context.training

    def FProp(self, theta: NestedMap, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        raise NotImplementedError(f"{type(self).__name__}.FProp(theta, ...)")

    def FPropDefaultTheta(self, *args: Any, **kwargs: Any) -> Any:  # noqa: N802
        """``FProp(self.theta, ...)``."""
        args, kwargs = self._inputs(args, kwargs)
        return self.FProp(self.theta, *args, **kwargs)

    def fprop(self, ctx: FPropContext, *args: Any, **kwargs: Any) -> Any:
        """What a TensorPipe parent calls: ``FProp(self.theta, ...)`` with ``ctx`` as the context."""
        stack = _context_stack()
        stack.append(ctx)
        try:
            args, kwargs = self._inputs(args, kwargs)
            return self.FProp(self.theta, *args, **kwargs)
        finally:
            stack.pop()


def _theta_of(layer: BaseLayer) -> NestedMap:
    if isinstance(layer, LingvoLayer):
        return layer.theta
    theta = NestedMap(layer.vars)
    for name, child in layer.children().items():
        theta[name] = [_theta_of(c) for c in child] if isinstance(child, list) else _theta_of(child)
    return theta
