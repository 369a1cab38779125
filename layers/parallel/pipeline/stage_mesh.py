"""Stage meshes (pipeline x mesh): each schedule device of a GPipe layer as a DTensor mesh of its own.

``build`` checks the ``stage_mesh_shape`` knobs, the devices and the environment, and makes one mesh
per schedule device (device d on logical devices d*size .. (d+1)*size - 1). ``StageMeshes`` is what
the layer and the executor use: the mesh of each stage and the one hand-off of a tensor from one
stage's mesh to another's.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import tensorflow as tf

from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class StageMeshes:
    """The meshes of the schedule devices (empty: plain devices, no stage meshes), and the replicas
    a mesh's data axis splits each micro-batch over (1: none)."""

    meshes: tuple[mesh_lib.DeviceMesh, ...] = ()
    replicas: int = 1

    def of(self, stage: int) -> mesh_lib.DeviceMesh | None:
        """Stage ``stage``'s mesh (stage s runs on schedule device ``s % len(meshes)``)."""
        return self.meshes[stage % len(self.meshes)] if self.meshes else None

    def hand(self, t: Any, src: int, dst: int, batch_dim: int) -> Any:
        """Stage ``src``'s tensor handed to stage ``dst``: an identity (placed by the caller on dst's
        device, or on a shared mesh), or a copy onto dst's mesh with the batch split over dst's data
        axis, so the replicas keep their rows."""
        src_mesh, dst_mesh = self.of(src), self.of(dst)
        if src_mesh is None or dst_mesh is None or src_mesh is dst_mesh:
            return tf.identity(t)
        moved = src_mesh.move_to(tf.convert_to_tensor(t), dst_mesh)
        return dst_mesh.split_batch(moved, batch_dim)

    def copy(self, x: Any, src: int, dst: int) -> Any:
        """A nest of tensors on stage ``src``'s mesh -> the same values on stage ``dst``'s (no
        gradient: for inputs such as labels, not activations); ``x`` itself where the two are one
        mesh, or without stage meshes."""
        src_mesh, dst_mesh = self.of(src), self.of(dst)
        if src_mesh is dst_mesh:
            return x
        return tf.nest.map_structure(lambda t: src_mesh.move_to(tf.convert_to_tensor(t), dst_mesh), x)


def build(
    path: str,
    params: Any,
    num_devices: int,
    enclosing: mesh_lib.DeviceMesh | None,
) -> StageMeshes:
    """The meshes of ``num_devices`` schedule devices from a GPipe layer's ``params``
    (stage_mesh_shape, stage_mesh_axis_names, stage_layout_rules, devices); none without
    stage_mesh_shape. ``enclosing``: the mesh the layer is built on, if any. An impossible
    combination is one ConfigError naming the knobs."""
    shape, names = list(params.stage_mesh_shape), list(params.stage_mesh_axis_names)
    rules = params.stage_layout_rules
    if not shape:
        if names or rules:
            raise ConfigError(
                f"{path}: stage_mesh_axis_names / stage_layout_rules are set but "
                "stage_mesh_shape is empty; set stage_mesh_shape too"
            )
        return StageMeshes()
    _check_shape(path, shape, names, bool(params.devices))
    size = 1
    for n in shape:
        size *= n
    device_type = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    found = len(tf.config.list_logical_devices(device_type))
    if num_devices * size > found:
        raise ConfigError(
            f"{path}: num_stages={num_devices} x stage_mesh_shape {shape} needs {num_devices * size} "
            f"{device_type} devices, found {found}; set cluster.num_logical_cpu_devices : "
            f"{num_devices * size}, or fewer stages or a smaller stage mesh"
        )
    try:
        batch_axis = mesh_lib.parse_layout_rules(rules).get("batch")
        meshes = [
            mesh_lib.create_mesh(shape, names, rules, device_type, first_device=d * size)
            for d in range(num_devices)
        ]
    except ConfigError as e:
        raise ConfigError(f"{path}: {str(e).replace('cluster.layout_rules', 'stage_layout_rules')}") from None
    if enclosing is not None and enclosing.mesh != meshes[0].mesh:
        # Built inside its first stage's mesh (a trainer's stage-mesh placement puts the layers
        # before the pipeline there) is fine; any other enclosing mesh is a second placement.
        raise ConfigError(
            f"{path}: stage_mesh_shape puts each stage on a mesh of its own, but the layer is "
            f"already built on a mesh ({enclosing.describe()}, cluster.mesh_shape); set one"
        )
    _check_all_reduces_apart(path)
    replicas = meshes[0].axis_sizes[batch_axis] if batch_axis is not None else 1
    return StageMeshes(tuple(meshes), replicas)


def _check_shape(path: str, shape: list[Any], names: list[Any], devices_set: bool) -> None:
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
        raise ConfigError(f"{path}: stage_mesh_shape must list ints >= 1, got {shape}")
    if len(names) != len(shape) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(
            f"{path}: stage_mesh_axis_names {names} must name each of the {len(shape)} "
            f"stage_mesh_shape {shape} axes"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"{path}: stage_mesh_axis_names {names} names mesh axis {twice[0]!r} twice; give "
            "each axis its own name"
        )
    if devices_set:
        raise ConfigError(f"{path}: params.devices and stage_mesh_shape both place the stages; set one")


def _check_all_reduces_apart(path: str) -> None:
    if not mesh_lib.keep_all_reduces_apart():
        env = mesh_lib.COMBINE_ALL_REDUCES_ENV
        raise ConfigError(
            f"{path}: stage_mesh_shape needs DTensor's all-reduce combiner off (two merged "
            "all-reduces of a stage can wait for each other through the next stage's mesh: the "
            f"step hangs), but the environment turns it on ({env}={os.environ.get(env)!r}); "
            f"set {env}=0 in the environment"
        )
