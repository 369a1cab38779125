"""Mesh-TensorFlow's layouts on ``tf.experimental.dtensor``: any tensor dimension split over any mesh axis.

A mesh is a grid of devices with named axes (``mesh_shape [2, 2]``, ``mesh_axis_names ['data',
'model']``). Layers name the dimensions of their weights and activations with logical names
(``batch``, ``length``, ``embed``, ``hidden``, ``heads``, ``vocab``); the experiment's
``layout_rules`` map logical names to mesh axes (Mesh-TF's ``batch:data;hidden:model``), and a
layer's ``weight_split_dims_mapping`` / ``activation_split_dims_mapping`` (GShard's names: one mesh
axis or None per tensor dimension) override the rules where set. A split mapping becomes a DTensor
``Layout``; DTensor's SPMD expansion inserts the collectives.

Mesh-TF's rules are checked when a layer is built, each failure one line naming the layer: a
dimension is split over one mesh axis at most, two dimensions of one tensor never share an axis, and
a split dimension's size is divisible by its axis's size.

Layers find the mesh through ``mesh_scope`` (a ``contextvars`` scope, like ``tf.name_scope``): a
layer built inside ``with mesh_scope(mesh):`` (or under a parent built there) creates its variables
as DVariables in their layouts; outside any scope nothing changes, so every model built without a
mesh is exactly what it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.experimental import dtensor

from params.errors import ConfigError

SplitMapping = list  # one mesh axis name (str) or None per tensor dimension

# DTensor's switch for its all-reduce combiner (read once, when its device is made); see
# keep_all_reduces_apart.
COMBINE_ALL_REDUCES_ENV = "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION"

_ACTIVE: contextvars.ContextVar[DeviceMesh | None] = contextvars.ContextVar("tensorpipe_mesh", default=None)


def parse_layout_rules(rules: str | Mapping[str, Any] | None) -> dict[str, str]:
    """Mesh-TF's ``'batch:data;hidden:model'`` (or a dict) -> ``{logical name: mesh axis}``."""
    if rules is None or rules == "":
        return {}
    if isinstance(rules, str):
        pairs = []
        for item in rules.split(";"):
            if not item.strip():
                continue
            if ":" not in item:
                raise ConfigError(
                    f"cluster.layout_rules: expected 'name:axis' items separated by ';', got {item!r}"
                )
            name, axis = (s.strip() for s in item.split(":", 1))
            pairs.append((name, axis))
    elif isinstance(rules, Mapping):
        pairs = list(rules.items())
    else:
        raise ConfigError(f"cluster.layout_rules: expected 'name:axis;...' or a dict, got {rules!r}")
    result: dict[str, str] = {}
    for name, axis in pairs:
        if not isinstance(axis, str) or "," in axis or not axis:
            raise ConfigError(
                f"cluster.layout_rules: {name!r} maps to {axis!r}; a dimension is split over one mesh "
                "axis at most"
            )
        if name in result and result[name] != axis:
            raise ConfigError(
                f"cluster.layout_rules: {name!r} maps to both {result[name]!r} and {axis!r}; a dimension is "
                "split over one mesh axis at most"
            )
        result[name] = axis
    return result


class DeviceMesh:
    """A DTensor mesh and the experiment's layout rules."""

    def __init__(self, mesh: dtensor.Mesh, layout_rules: Mapping[str, str] | None = None) -> None:
        self.mesh = mesh
        self.axis_names: list[str] = list(mesh.dim_names)
        self.axis_sizes: dict[str, int] = {name: int(mesh.dim_size(name)) for name in self.axis_names}
        self.rules = dict(layout_rules or {})
        for name, axis in self.rules.items():
            if axis not in self.axis_sizes:
                raise ConfigError(
                    f"cluster.layout_rules: {name!r} maps to {axis!r}, not a mesh axis of {self.axis_names}"
                )

    @property
    def num_devices(self) -> int:
        return int(self.mesh.num_local_devices())

    def describe(self) -> str:
        return " x ".join(f"{name}={size}" for name, size in self.axis_sizes.items())

    # ------------------------------------------------------------------------------ mappings
    def mapping_from_names(self, dim_names: Sequence[str | None]) -> SplitMapping:
        """Logical dimension names -> split mapping by the layout rules (unknown names: None)."""
        return [self.rules.get(name) if name else None for name in dim_names]

    def layout(self, mapping: Sequence[str | None]) -> dtensor.Layout:
        specs = [axis if axis else dtensor.UNSHARDED for axis in mapping]
        return dtensor.Layout(specs, self.mesh)

    def replicated(self, rank: int) -> dtensor.Layout:
        return dtensor.Layout.replicated(self.mesh, rank)

    def check(
        self, where: str, what: str, shape: Sequence[int | None], mapping: Sequence[Any]
    ) -> SplitMapping:
        """Mesh-TF's rules for one tensor; returns the mapping as a list. ``where`` names the layer."""
        if not isinstance(mapping, (list, tuple)):
            raise ConfigError(
                f"{where}: {what} split mapping must be a list (one mesh axis or None per dim), "
                f"got {mapping!r}"
            )
        if len(mapping) != len(shape):
            raise ConfigError(
                f"{where}: {what} split mapping {list(mapping)} has {len(mapping)} entries for a tensor "
                "of rank "
                f"{len(shape)}"
            )
        seen: dict[str, int] = {}
        for dim, axis in enumerate(mapping):
            if axis is None:
                continue
            if isinstance(axis, (list, tuple)):
                raise ConfigError(
                    f"{where}: {what} dimension {dim} is split over {list(axis)}; a dimension is split "
                    "over one "
                    "mesh axis at most"
                )
            if axis not in self.axis_sizes:
                raise ConfigError(
                    f"{where}: {what} dimension {dim} names mesh axis {axis!r}, not one of {self.axis_names}"
                )
            if axis in seen:
                raise ConfigError(
                    f"{where}: {what} dimensions {seen[axis]} and {dim} are both split over mesh axis "
                    f"{axis!r}; "
                    "two dimensions of one tensor never share an axis"
                )
            seen[axis] = dim
            size = shape[dim]
            if size is not None and size % self.axis_sizes[axis]:
                raise ConfigError(
                    f"{where}: {what} dimension {dim} (size {size}) is not divisible by mesh axis {axis!r} "
                    f"(size {self.axis_sizes[axis]})"
                )
        return list(mapping)

    # ---------------------------------------------------------------------------- tensors
    def to_layout(self, value: tf.Tensor, mapping: Sequence[str | None]) -> tf.Tensor:
        """A regular tensor -> a DTensor on this mesh in ``mapping``'s layout (copied replicated, then
        split, so the value does not depend on the mesh)."""
        value = tf.convert_to_tensor(value)
        rep = dtensor.copy_to_mesh(value, self.replicated(value.shape.rank))
        if not any(mapping):
            return rep
        return dtensor.relayout(rep, self.layout(mapping))

    def variable(
        self, value: tf.Tensor, mapping: Sequence[str | None], name: str, trainable: bool
    ) -> tf.Variable:
        """A DVariable holding ``value`` in ``mapping``'s layout."""
        return dtensor.DVariable(self.to_layout(value, mapping), name=name, trainable=trainable)

    def shard(self, x: tf.Tensor, mapping: Sequence[str | None]) -> tf.Tensor:
        """Relayouts a DTensor activation to ``mapping`` (inside a DTensor function)."""
        return dtensor.relayout(x, self.layout(mapping))

    def move_to(self, x: tf.Tensor, dst: DeviceMesh) -> tf.Tensor:
        """A DTensor on this mesh -> the same value replicated on ``dst`` (another mesh, e.g. the next
        GPipe stage's). Gathered here first: DTensor copies between meshes only replicated tensors.
        The copy has no usable gradient in a function (DTensor's own fails at run time), so the
        pipeline executor moves gradients back with this too rather than differentiating it."""
        rank = x.shape.rank
        return dtensor.copy_to_mesh(dtensor.relayout(x, self.replicated(rank)), dst.replicated(rank))

    def split_batch(self, x: tf.Tensor, batch_dim: int) -> tf.Tensor:
        """``x`` (on this mesh) with its ``batch_dim`` split over the axis the rules give ``batch``
        (a data axis), the other dimensions replicated; ``x`` itself without such a rule."""
        axis = self.rules.get("batch")
        rank = x.shape.rank
        if axis is None or rank is None or rank <= batch_dim:
            return x
        return dtensor.relayout(x, self.layout([axis if d == batch_dim else None for d in range(rank)]))

    def local_bytes(self, x: tf.Tensor | tf.Variable) -> int:
        """Bytes of one device's component (the largest one) of a DTensor or DVariable."""
        value = x.read_value() if isinstance(x, tf.Variable) else x
        parts = dtensor.unpack(value)
        return max(int(p.shape.num_elements()) * p.dtype.size for p in parts)


def mesh_of(var: Any) -> dtensor.Mesh | None:
    """The DTensor mesh a DVariable lives on (None: a regular variable)."""
    return var.layout.mesh if isinstance(var, dtensor.DVariable) else None


def scalar_on(x: Any, mesh: dtensor.Mesh | None, src: dtensor.Mesh | None = None) -> Any:
    """A scalar (a learning rate, a norm, a flag) copied onto ``mesh``, replicated, wherever it was
    computed (inside a function too); ``x`` itself when ``mesh`` is None. DTensor runs no op on
    inputs from two meshes, so a step over several (GPipe stages on meshes of their own) moves the
    scalars its updates share to each variable's mesh."""
    if mesh is None:
        return x
    x = tf.convert_to_tensor(x)
    if src is not None:  # where it is computed, said explicitly (DTensor may not infer it)
        x = dtensor.relayout(x, dtensor.Layout.replicated(src, 0))
    return dtensor.copy_to_mesh(x, dtensor.Layout.replicated(mesh, 0))


def create_mesh(
    mesh_shape: Sequence[int],
    mesh_axis_names: Sequence[str],
    layout_rules: str | Mapping[str, Any] | None = None,
    device_type: str | None = None,
    across_processes: bool = False,
    first_device: int = 0,
) -> DeviceMesh:
    """The first prod(mesh_shape) logical devices (GPUs when present, else CPUs) as a named mesh.

    ``across_processes``: the devices of every DTensor client (multi-client DTensor, set up by
    ``dtensor.initialize_accelerator_system``), numbered client by client, the last mesh axis
    varying fastest (so it stays within a process when each process holds a multiple of its size).

    ``first_device``: the mesh takes the logical devices from this index on (a GPipe stage's submesh)."""
    shape, names = list(mesh_shape), list(mesh_axis_names)
    if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
        raise ConfigError(f"cluster.mesh_shape: expected a non-empty list of ints >= 1, got {mesh_shape!r}")
    if (
        len(names) != len(shape)
        or len(set(names)) != len(names)
        or not all(isinstance(n, str) and n for n in names)
    ):
        raise ConfigError(
            f"cluster.mesh_axis_names: expected {len(shape)} distinct names (one per mesh_shape entry), got "
            f"{mesh_axis_names!r}"
        )
    if device_type is None:
        device_type = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    devices = tf.config.list_logical_devices(device_type)
    needed = 1
    for s in shape:
        needed *= s
    if across_processes:
        clients, local = dtensor.num_clients(), dtensor.num_local_devices(device_type)
        if needed != local * clients:
            raise ConfigError(
                f"cluster.mesh_shape {shape} needs {needed} {device_type} devices; {clients} processes "
                f"with {local} each have {local * clients}"
            )
        mesh = dtensor.create_distributed_mesh(list(zip(names, shape)), device_type=device_type)
        return DeviceMesh(mesh, parse_layout_rules(layout_rules))
    if first_device + needed > len(devices):
        raise ConfigError(
            f"cluster.mesh_shape {shape} needs {needed} {device_type} devices, found {len(devices)} "
            f"(set cluster.num_logical_cpu_devices : {needed})"
        )
    mesh = dtensor.create_mesh(
        list(zip(names, shape)),
        devices=[d.name for d in devices[first_device : first_device + needed]],
        device_type=device_type,
    )
    return DeviceMesh(mesh, parse_layout_rules(layout_rules))


def keep_all_reduces_apart() -> bool:
    """Turns DTensor's all-reduce combiner off for the DTensor device this process has not made yet,
    unless the environment already says otherwise; whether it is off.

    Why (TensorFlow 2.21): DTensor's ``DTensorAllReduceCombineOptimization`` merges the all-reduces
    of one mesh's function that do not depend on each other *inside that function*. With several
    meshes in one step (a GPipe pipeline over stage meshes, layers/parallel/pipeline) two of them may
    depend on each other through another mesh, e.g. stage 0's forward all-reduce of micro-batch 1 feeds
    stage 1, which must run before stage 1 sends back the gradient that stage 0's backward all-reduce
    of micro-batch 0 reduces. Merged into one all-reduce, each waits for the other: the step hung with
    every thread idle. The combiner is built into DTensor's pass pipeline once, when its device is
    made, and only this environment variable (read by TensorFlow's C++; checked in layers/tf_compat.py)
    leaves it out. A single mesh loses only the merging of independent all-reduces. Called when this
    module is imported, so before any mesh of ``create_mesh`` makes the device; a script that makes
    DTensor's device itself before importing layers keeps the combiner."""
    os.environ.setdefault(COMBINE_ALL_REDUCES_ENV, "0")
    return os.environ[COMBINE_ALL_REDUCES_ENV] == "0"


keep_all_reduces_apart()  # at import: before this project makes DTensor's device (read once)


@contextlib.contextmanager
def mesh_scope(mesh: DeviceMesh | None) -> Iterator[DeviceMesh | None]:
    """Layers built inside are sharded over ``mesh`` (None: built as usual)."""
    token = _ACTIVE.set(mesh)
    try:
        yield mesh
    finally:
        _ACTIVE.reset(token)


def active_mesh() -> DeviceMesh | None:
    """The mesh of the innermost ``mesh_scope`` (None outside any)."""
    return _ACTIVE.get()


def refuse_random(layer: Any, setting: str) -> None:
    """Dropout is refused on a mesh: DTensor's stateless random ops mix each device into the seed, so
    the masks (and so the model) would depend on the mesh, even on a 1x1 one."""
    if layer.mesh is not None:
        raise ConfigError(
            f"{layer.path}: {setting} (dropout) is not supported on a device mesh: DTensor draws random "
            "values per device, so the masks would depend on the mesh; set it to no dropout"
        )


def define_split_params(p: Any) -> None:
    """Adds GShard's two split-mapping Params to a layer's Params (both default to the rules)."""
    p.define(
        "weight_split_dims_mapping",
        None,
        "On a mesh: None (the layout rules decide), or {variable name: [mesh axis or None per dim]} "
        "(a list alone applies to the layer's main weight).",
        value_type=(dict, list),
    )
    p.define(
        "activation_split_dims_mapping",
        None,
        "On a mesh: None (the layout rules decide), or [mesh axis or None per dim] of the layer's output.",
        value_type=list,
    )
