"""BaseLayer: a ``tf.Module`` built from its Params, Lingvo-style.

A layer's ``Params()`` classmethod defines its settings; ``p.instantiate()`` builds it. In ``__init__``
it makes children with ``create_child`` / ``create_children`` and weights with ``create_variable``.
``fprop(ctx, *inputs)`` computes; ``ctx`` (an FPropContext) says whether this is training, the global
step, the micro-batch, and collects updates (batch-norm moving statistics) that are applied once per
step, never during a re-materialized forward pass.

Children inherit ``dtype``, ``random_seed`` and ``weight_init`` from their parent unless set. Weights
are initialized statelessly from (random_seed, variable path), so the same seed gives the same
weights whatever order layers are built in.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np
import tensorflow as tf

from layers import precision
from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError
from params.hyperparams import DTYPE, InstantiableParams, Params

DEFAULT_SEED = 1234


def weight_init_params(method: str = "xavier", scale: float = 1.0) -> Params:
    """How a weight is initialized: method and scale."""
    p = Params()
    p.define(
        "method",
        method,
        "xavier (uniform, fan-in + fan-out), he (normal, fan-in), gaussian (stddev=scale), "
        "uniform (+-scale), truncated_gaussian, constant (=scale).",
    )
    p.define("scale", scale, "Scale of the method (gain for xavier/he, stddev, bound or value).")
    return p


def weight_params(
    shape: list[int] | tuple[int, ...],
    init: Params | None = None,
    dtype: tf.DType | None = None,
    trainable: bool = True,
    dims: list[str | None] | None = None,
) -> Params:
    """Describes one weight: shape, initializer (None: the layer's weight_init), dtype, trainable, and
    the logical names of its dimensions (``layers.parallel.mesh``'s layout rules split them on a mesh)."""
    p = Params()
    p.define("shape", list(shape), "Shape of the weight.")
    p.define("init", init, "weight_init_params(); None uses the layer's weight_init.")
    p.define("dtype", dtype, "dtype; None uses the layer's dtype.")
    p.define("trainable", trainable, "Whether the optimizer updates it.")
    p.define("dims", list(dims) if dims else None, "Logical dimension names (None: never split).")
    return p


def _fans(shape: list[int]) -> tuple[float, float]:
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    receptive = float(np.prod(shape[:-2])) if len(shape) > 2 else 1.0
    return shape[-2] * receptive, shape[-1] * receptive


def stateless_seed(*parts: Any) -> tf.Tensor:
    """A [2] int32 stateless seed from strings and ints (tensors allowed for ints)."""
    ints = []
    for part in parts:
        if isinstance(part, str):
            ints.append(tf.constant(zlib.crc32(part.encode()) & 0x7FFFFFFF, tf.int64))
        else:
            ints.append(tf.cast(part, tf.int64))
    a = ints[0]
    for x in ints[1:]:
        a = (a * 1000003 + x) % 0x7FFFFFFF
    b = tf.constant(0, tf.int64)
    for x in ints:
        b = (b * 7919 + x) % 0x7FFFFFFF
    return tf.cast(tf.stack([a, b]), tf.int32)


def initial_value(init: Params, shape: list[int], dtype: tf.DType, seed: tf.Tensor) -> tf.Tensor:
    """The stateless initial value of a weight."""
    fan_in, fan_out = _fans(list(shape))
    method, scale = init.method, float(init.scale)
    if method == "xavier":
        limit = scale * np.sqrt(6.0 / (fan_in + fan_out))
        value = tf.random.stateless_uniform(shape, seed, -limit, limit, tf.float32)
    elif method == "he":
        value = tf.random.stateless_normal(shape, seed, stddev=scale * np.sqrt(2.0 / fan_in))
    elif method == "gaussian":
        value = tf.random.stateless_normal(shape, seed, stddev=scale)
    elif method == "truncated_gaussian":
        value = tf.random.stateless_truncated_normal(shape, seed, stddev=scale)
    elif method == "uniform":
        value = tf.random.stateless_uniform(shape, seed, -scale, scale, tf.float32)
    elif method == "constant":
        value = tf.fill(shape, scale)
    else:
        raise ConfigError(f"unknown weight_init.method {method!r}")
    return tf.cast(value, dtype)


@dataclasses.dataclass
class FPropContext:
    """What a forward pass needs besides its inputs.

    ``updates`` collects ``(layer, name, value, weight)`` tuples (for example batch statistics) when
    ``record_updates`` is on; the owner of the step merges them over micro-batches by weight and calls
    each layer's ``apply_update`` once. A re-materialized forward pass runs with ``record_updates``
    off, so nothing is updated twice.
    """

    training: bool = False
    step: Any = 0
    seed: int = DEFAULT_SEED
    micro_batch: Any = 0
    record_updates: bool = True
    updates: list = dataclasses.field(default_factory=list)

    def for_micro_batch(self, index: Any, record_updates: bool | None = None) -> FPropContext:
        """A context for micro-batch ``index`` sharing this one's update list."""
        return dataclasses.replace(
            self,
            micro_batch=index,
            record_updates=self.record_updates if record_updates is None else record_updates,
        )

    def add_update(self, layer: BaseLayer, name: str, value: tf.Tensor, weight: Any) -> None:
        if self.training and self.record_updates:
            self.updates.append((layer, name, value, weight))

    def apply_updates(self) -> None:
        """Merges recorded updates by weight (per layer and name) and applies each once."""
        merged: dict[tuple[int, str], list] = {}
        for layer, name, value, weight in self.updates:
            merged.setdefault((id(layer), name), [layer, name, []])[2].append((value, weight))
        for layer, name, pairs in merged.values():
            weights = [tf.cast(w, tf.float32) for _, w in pairs]
            total = tf.add_n(weights)
            value = tf.add_n([tf.cast(v, tf.float32) * w for (v, _), w in zip(pairs, weights)])
            layer.apply_update(name, value / total)
        self.updates.clear()


class BaseLayer(tf.Module):
    """Base of every layer. Subclasses extend ``Params()`` and implement ``fprop``."""

    @classmethod
    def Params(cls) -> InstantiableParams:  # noqa: N802 (Lingvo's name, kept on purpose)
        p = InstantiableParams(cls)
        p.define("name", "", "Name of the layer; part of every variable path.")
        p.define(
            "dtype",
            None,
            "dtype of weights and computation; None inherits (float32 at root).",
            value_type=DTYPE,
        )
        p.define("random_seed", None, "Seed of initializers and dropout; None inherits.", value_type=int)
        p.define(
            "weight_init", None, "weight_init_params(); None inherits (xavier at root).", value_type=Params
        )
        return p

    def __init__(self, params: Params, parent: BaseLayer | None = None) -> None:
        p = params.copy()
        if not p.name:
            raise ConfigError(f"{type(self).__name__} needs params.name")
        if parent is not None:
            p.dtype = p.dtype if p.dtype is not None else parent.params.dtype
            if p.random_seed is None:
                p.random_seed = parent.params.random_seed
            if p.weight_init is None:
                p.weight_init = parent.params.weight_init.copy()
        p.dtype = p.dtype if p.dtype is not None else tf.float32
        p.random_seed = p.random_seed if p.random_seed is not None else DEFAULT_SEED
        p.weight_init = p.weight_init if p.weight_init is not None else weight_init_params()
        super().__init__(name=p.name)
        self._params = p.freeze()
        self._path = f"{parent.path}/{p.name}" if parent is not None else p.name
        self._child_names: list[str] = []
        # A precision policy's float32 weights (tasks: task.precision), inherited by every child.
        master = self._master_dtype_of(p)
        self._master_dtype = master if master is not None or parent is None else parent._master_dtype
        inherited = parent.cast_reads if parent is not None else None
        self._cast_reads = precision.CastReads() if master is not None else inherited
        self.vars: dict[str, tf.Variable] = {}
        if precision.casts_weights(p.dtype, self._master_dtype):
            self.vars = precision.CastWeights(p.dtype, self._cast_reads or precision.CastReads())
        # The innermost mesh_scope, else the parent's mesh (a GPipe stage builds its layers in a scope
        # of the stage's submesh under a parent that is on none).
        scoped = mesh_lib.active_mesh()
        self._mesh = scoped if scoped is not None or parent is None else parent._mesh

    def _master_dtype_of(self, params: Params) -> tf.DType | None:
        """The dtype this layer's and its children's weights are kept in when it differs from their
        compute dtype (a task's precision policy); None: each layer's own dtype."""
        return None

    @property
    def cast_reads(self) -> precision.CastReads | None:
        """How this layer's (and its task's) float32 weights are read in the compute dtype under a
        mixed precision policy (a pipelined step casts each once); None under float32."""
        return self._cast_reads

    @property
    def params(self) -> Params:
        """The frozen Params this layer was built from (with inherited values filled in)."""
        return self._params

    @property
    def path(self) -> str:
        """Slash-separated path from the root layer, e.g. ``task/body/conv0``."""
        return self._path

    @property
    def mesh(self) -> mesh_lib.DeviceMesh | None:
        """The device mesh this layer was built on (None: not sharded)."""
        return self._mesh

    def weight_split(self, name: str, wp: Params) -> list:
        """The checked split mapping of weight ``name``: the layer's ``weight_split_dims_mapping``
        where set, else the mesh's layout rules over ``wp.dims``."""
        shape = list(wp.shape)
        override = (
            self.params.get("weight_split_dims_mapping")
            if "weight_split_dims_mapping" in self.params
            else None
        )
        mapping = None
        if isinstance(override, dict):
            mapping = override.get(name)
        elif override is not None and name == self.MAIN_WEIGHT:
            mapping = override
        if mapping is None:
            mapping = self._mesh.mapping_from_names(wp.dims or [None] * len(shape))
        return self._mesh.check(self.path, f"weight {name!r}", shape, mapping)

    def shard_activation(self, x: tf.Tensor, last_dim: str | None = None) -> tf.Tensor:
        """On a mesh, relayouts the layer's output ``x [batch, ..., last]`` by its
        ``activation_split_dims_mapping`` or the rules (``batch`` first, ``last_dim`` last)."""
        if self._mesh is None:
            return x
        return self._mesh.shard(x, self.activation_split(x, last_dim))

    def activation_split(self, x: tf.Tensor, last_dim: str | None = None) -> list:
        """The checked split mapping of the layer's output ``x`` (see ``shard_activation``)."""
        rank = x.shape.rank
        override = (
            self.params.get("activation_split_dims_mapping")
            if "activation_split_dims_mapping" in self.params
            else None
        )
        if override is not None:
            mapping = override
        else:
            names = ["batch"] + [None] * (rank - 1)
            if rank > 1:
                names[-1] = last_dim
            mapping = self._mesh.mapping_from_names(names)
        return self._mesh.check(self.path, "activation", x.shape.as_list(), mapping)

    MAIN_WEIGHT = "w"

    def children(self) -> dict[str, BaseLayer]:
        return {name: getattr(self, name) for name in self._child_names}

    def create_child(self, name: str, params: Params) -> BaseLayer:
        """Builds a child layer from ``params`` (a copy named ``name``) and sets ``self.<name>``."""
        if name in self._child_names or hasattr(self, name):
            raise ConfigError(f"{self.path}: child {name!r} already exists")
        p = params.copy()
        p.name = name
        child = p.cls(p, parent=self)
        setattr(self, name, child)
        self._child_names.append(name)
        return child

    def create_children(self, name: str, params_list: list[Params]) -> list[BaseLayer]:
        """Builds a list of children ``name_0``, ``name_1``, ... and sets ``self.<name>``."""
        if hasattr(self, name):
            raise ConfigError(f"{self.path}: child {name!r} already exists")
        built = []
        for i, params in enumerate(params_list):
            p = params.copy()
            p.name = f"{name}_{i}"
            built.append(p.cls(p, parent=self))
        setattr(self, name, built)
        self._child_names.append(name)
        return built

    def create_variable(self, name: str, wp: Params) -> tf.Variable:
        """Creates weight ``name`` (stored in ``self.vars[name]``) from weight_params()."""
        if name in self.vars:
            raise ConfigError(f"{self.path}: variable {name!r} already exists")
        dtype = wp.dtype or self.params.dtype
        cast = isinstance(self.vars, precision.CastWeights) and dtype == self.params.dtype
        dtype = self._master_dtype if cast else dtype
        init = wp.init or self.params.weight_init
        var_path = f"{self.path}/{name}"
        seed = stateless_seed(self.params.random_seed, var_path)
        mapping = self.weight_split(name, wp) if self._mesh is not None else None
        with tf.init_scope():
            value = initial_value(init, list(wp.shape), dtype, seed)
            if mapping is None:
                var = tf.Variable(value, name=var_path.replace("/", "."), trainable=wp.trainable)
            else:  # the same value on any mesh: computed whole, then split
                var = self._mesh.variable(value, mapping, var_path.replace("/", "."), wp.trainable)
        if isinstance(self.vars, precision.CastWeights):
            self.vars.add(name, var, cast)
        else:
            self.vars[name] = var
        return var

    def dropout_seed(self, ctx: FPropContext, salt: str = "") -> tf.Tensor:
        """Stateless seed keyed by (seed, layer path, step, micro-batch): a recompute reproduces it."""
        return stateless_seed(ctx.seed, self.path + salt, ctx.step, ctx.micro_batch)

    def fprop(self, ctx: FPropContext, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.fprop")

    def __call__(self, ctx: FPropContext, *args: Any, **kwargs: Any) -> Any:
        return self.fprop(ctx, *args, **kwargs)

    def apply_update(self, name: str, value: tf.Tensor) -> None:
        """Applies a merged update recorded with ``ctx.add_update`` (see FPropContext)."""
        raise NotImplementedError(f"{type(self).__name__} recorded update {name!r} but cannot apply it")

    def num_parameters(self) -> int:
        return int(sum(np.prod(v.shape) for v in self.variables))

    def __getattr__(self, name: str) -> Any:
        """Only for names not found otherwise: a Lingvo layer method's name says what to use here."""
        if name in LINGVO_LAYER_NAMES:
            raise AttributeError(
                f"{type(self).__name__} has no {name}: Lingvo's {name} is {LINGVO_LAYER_NAMES[name]} here "
                "(or derive the layer from layers.lingvo_layer.LingvoLayer, which has Lingvo's names; "
                "docs/lingvo.md)"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


# Lingvo's layer methods -> this project's; a BaseLayer names the one to use (LingvoLayer implements them).
LINGVO_LAYER_NAMES = {
    "FProp": "fprop(ctx, *inputs), with the weights in self.vars",
    "FPropDefaultTheta": "calling the layer: layer(ctx, *inputs)",
    "theta": "self.vars (the layer's own weights; a child's are child.vars)",
    "CreateVariable": "self.create_variable(name, weight_params(shape, init=weight_init_params(...)))",
    "CreateChild": "self.create_child(name, params)",
    "CreateChildren": "self.create_children(name, params_list)",
    "_CreateLayerVariables": "create_variable calls in __init__",
    "do_eval": "not ctx.training",
}


def layers_of_type(root: Any, cls: type) -> list:
    """Every layer of type ``cls`` under ``root`` (a layer, or a list of them), depth first."""
    found: list = []
    stack = [root]
    while stack:
        layer = stack.pop()
        if isinstance(layer, (list, tuple)):
            stack.extend(reversed(layer))
        elif isinstance(layer, BaseLayer):
            if isinstance(layer, cls):
                found.append(layer)
            stack.extend(reversed(list(layer.children().values())))
    return found
