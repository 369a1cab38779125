"""``--mode=inspect_placement``: the device grid of the combination the trainer runs, as text and SVG.

The task is built as the trainer builds it (``mesh_placement.placement_from_cluster``: the stage
meshes, the cluster's mesh, or this process's devices and the GPipe stages' devices) and nothing is
trained. The grid's rows and columns are what the experiment's Params choose:

    placement                          rows                          columns
    StageMeshPlacement (pipeline x     each schedule device's        the coordinates of its mesh
      mesh)                            stages (stage k)              (model=0, model=1)
    MeshPlacement (a mesh)             the mesh's first axis         its other axes (one row for
                                       (data=0: a replica)           a mesh of one axis)
    OnDevice with a GPipe layer        each schedule device's stages one column
    OnDevice without one               each device holding weights   one column

A device holding weights outside these (layers before a pipeline on another device) gets a row of
its own. Each cell: the device, its weight bytes (the estimate the trainer prints at start for stage
meshes, ``mesh_placement.weight_slices``: each variable's part on that device; optimizer slots and
activations not counted), and what it holds: the largest layers below the task (paths of
variables) whose every variable has a part there, with the bytes it holds of them (``of`` the
whole, when they are split).
The SVG draws the same grid in the schedule picture's style (``picture.py``): title, labels on the
left, one colour per row; a bar under each cell shows its bytes against the fullest device's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

import tensorflow as tf

from layers.base_layer import layers_of_type
from layers.parallel.mesh import DeviceMesh
from layers.parallel.pipeline.gpipe import GPipeLayer
from params import experiment
from params.errors import ConfigError
from params.hyperparams import Params
from trainer import files
from trainer.distributed import mesh_placement
from trainer.pipeline_views import picture
from trainer.placement import Placement

FILE_NAME = "placement.svg"


@dataclass(frozen=True)
class Cell:
    """One device of the grid: its name, weight bytes and what it holds: (layer path, bytes held
    here, bytes of that layer's whole variables)."""

    device: str
    weight_bytes: int
    holds: tuple[tuple[str, int, int], ...]

    def lines(self) -> list[str]:
        """The cell's text: the device and its bytes, then one line per layer it holds."""
        out = [f"{self.device}  {_bytes(self.weight_bytes)}"]
        for path, here, whole in self.holds:
            out.append(f"  {path} {_bytes(here)}" + (f" of {_bytes(whole)}" if here != whole else ""))
        return out


@dataclass(frozen=True)
class Grid:
    """The device grid: ``cells[row][column]`` (None: no device there)."""

    title: str
    row_labels: tuple[str, ...]
    column_labels: tuple[str, ...]
    cells: tuple[tuple[Cell | None, ...], ...]
    unsharded_bytes: int

    @property
    def devices(self) -> list[str]:
        return [c.device for row in self.cells for c in row if c is not None]


def build(root: Params) -> Grid:
    """The grid of ``root``'s experiment as the trainer would place it (the task built, not trained)."""
    if "stage_job" in root.cluster and root.cluster.stage_job:
        raise ConfigError(
            f"cluster.stage_job ({root.cluster.stage_job!r}) runs the stages in other processes; "
            "--mode=inspect_placement draws one process's devices (leave cluster.stage_job empty)"
        )
    names = root.input.names()
    dataset = "train" if "train" in names or not names else names[0]
    task_params = experiment.task_params_for(root, dataset) if names else root.task
    placement = mesh_placement.placement_from_cluster(root.cluster, task_params)
    with placement.scope():
        task = placement.build_task(task_params)
    return grid_of(task, placement, str(root.model) if "model" in root else task_params.cls.__name__)


def grid_of(task: tf.Module, placement: Placement, model: str) -> Grid:
    """The grid of a built ``task`` under ``placement`` (module doc)."""
    variables = list(task.trainable_variables)
    slices = mesh_placement.weight_slices(variables)
    whole = {v.name: mesh_placement.variable_bytes(v) for v in variables}
    paths = {v.name: _path(v.name) for v in variables}
    if isinstance(placement, mesh_placement.StageMeshPlacement):
        pipe = placement.pipeline
        meshes = pipe.stage_meshes
        how = f"pipeline {pipe.num_stages} x mesh {meshes[0].describe()}"
        rows = [_stages_of(pipe, d) for d in range(len(meshes))]
        columns = _coordinates(meshes[0], list(meshes[0].axis_sizes))
        layout = [[mesh_placement.device_name(d) for d in m.mesh.local_devices()] for m in meshes]
    elif isinstance(placement, mesh_placement.MeshPlacement):
        mesh = placement.mesh
        axes = list(mesh.axis_sizes)
        flat = [mesh_placement.device_name(d) for d in mesh.mesh.local_devices()]
        how = f"mesh {mesh.describe()}"
        rows = _coordinates(mesh, axes[:1]) if len(axes) > 1 else [mesh.describe()]
        columns = _coordinates(mesh, axes[1:] if len(axes) > 1 else axes)
        width = len(columns)
        layout = [flat[r * width : (r + 1) * width] for r in range(len(rows))]
    else:
        pipes = [p for p in layers_of_type(task, GPipeLayer) if not p.stage_meshes]
        if pipes:
            pipe = pipes[0]
            how = f"pipeline {pipe.num_stages} (one device per stage)"
            rows = [_stages_of(pipe, d) for d in range(pipe.num_devices)]
            layout = [[_device_of(pipe, d)] for d in range(pipe.num_devices)]
        else:
            held = sorted(slices, key=mesh_placement.device_order)
            how = "one device" if len(held) <= 1 else f"{len(held)} devices"
            rows = [f"device {i}" for i in range(len(held))] or ["device 0"]
            layout = [[d] for d in held] or [["(none)"]]
        columns = ["device"]
    placed = {d for row in layout for d in row}
    for d in sorted(set(slices) - placed, key=mesh_placement.device_order):
        rows.append("outside")  # weights on a device the grid's axes do not name
        layout.append([d])
    cells = tuple(
        tuple(_cell(d, slices.get(d, {}), paths, whole) for d in row) + (None,) * (len(columns) - len(row))
        for row in layout
    )
    count = len(placed | set(slices))
    title = f"{model}: {how} ({type(placement).__name__}), {count} device{'s' if count > 1 else ''}"
    return Grid(title, tuple(rows), tuple(columns), cells, sum(whole.values()))


def to_text(grid: Grid) -> str:
    """The grid as aligned text: a header of column labels, then each row's cells side by side."""
    texts = [[c.lines() if c is not None else [] for c in row] for row in grid.cells]
    widths = [
        max([len(label)] + [len(line) for row in texts for line in row[j]])
        for j, label in enumerate(grid.column_labels)
    ]
    left = max(len(label) for label in grid.row_labels)
    out = [grid.title, f"weight bytes per device; unsharded model {_bytes(grid.unsharded_bytes)}"]
    header = ["".ljust(left)] + [label.ljust(w) for label, w in zip(grid.column_labels, widths)]
    out.append(" | ".join(header).rstrip())
    for label, row in zip(grid.row_labels, texts):
        for i in range(max(len(lines) for lines in row)):
            parts = [(label if i == 0 else "").ljust(left)]
            parts += [(lines[i] if i < len(lines) else "").ljust(w) for lines, w in zip(row, widths)]
            out.append(" | ".join(parts).rstrip())
    return "\n".join(out) + "\n"


_LEFT, _TOP, _PAD, _LINE, _CHAR, _BAR, _GAP = 150, 64, 8, 15, 7, 6, 8


def to_svg(grid: Grid) -> str:
    """The grid as an SVG document (text): the schedule picture's layout and colours (module doc)."""
    texts = [[c.lines() if c is not None else [] for c in row] for row in grid.cells]
    widths = [
        max([len(label)] + [len(line) for row in texts for line in row[j]]) * _CHAR + 2 * _PAD
        for j, label in enumerate(grid.column_labels)
    ]
    heights = [max(1, *(len(lines) for lines in row)) * _LINE + 2 * _PAD + _BAR for row in texts]
    width = max(_LEFT + sum(widths) + _GAP * len(widths), _LEFT + len(grid.title) * (_CHAR + 2)) + 16
    height = _TOP + sum(heights) + _GAP * len(heights) + 24
    fullest = max([c.weight_bytes for row in grid.cells for c in row if c is not None] + [1])
    palette = list(picture.COLORS.values())
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="DejaVu Sans Mono, monospace" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="24" font-size="14">{escape(grid.title)}</text>',
    ]
    x = _LEFT
    for label, w in zip(grid.column_labels, widths):
        out.append(f'<text x="{x + _PAD}" y="{_TOP - 10}">{escape(label)}</text>')
        x += w + _GAP
    y = _TOP
    for r, (label, row, h) in enumerate(zip(grid.row_labels, grid.cells, heights)):
        color = palette[r % len(palette)]
        out.append(f'<rect x="0" y="{y}" width="{width}" height="{h}" fill="rgb(245,245,245)"/>')
        out.append(f'<text x="8" y="{y + _PAD + 11}">{escape(label[:20])}</text>')
        x = _LEFT
        for j, (cell, w) in enumerate(zip(row, widths)):
            if cell is not None:
                out.append(_svg_cell(cell, texts[r][j], x, y, w, h, color, fullest))
            x += w + _GAP
        y += h + _GAP
    out.append(
        f'<text x="{_LEFT}" y="{height - 8}">bar: weight bytes against the fullest device '
        f"({_bytes(fullest)}); unsharded model {_bytes(grid.unsharded_bytes)}</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _svg_cell(
    cell: Cell, lines: list[str], x: int, y: int, w: int, h: int, color: tuple, fullest: int
) -> str:
    rgb, tint = (
        "rgb({},{},{})".format(*color),
        "rgb({},{},{})".format(*(c + (255 - c) * 4 // 5 for c in color)),
    )
    parts = [
        f'<g class="cell" data-device="{escape(cell.device)}" data-bytes="{cell.weight_bytes}">',
        f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="{tint}" stroke="{rgb}"/>',
    ]
    for i, line in enumerate(lines):
        weight = ' font-weight="bold"' if i == 0 else ""
        text = escape(line).replace(" ", "\u00a0")  # keep the indentation
        parts.append(f'<text x="{x + _PAD}" y="{y + _PAD + 11 + i * _LINE}"{weight}>{text}</text>')
    bar = max(1, round((w - 2 * _PAD) * cell.weight_bytes / fullest))
    parts.append(
        f'<rect x="{x + _PAD}" y="{y + h - _PAD - _BAR + 4}" width="{bar}" height="{_BAR}" fill="{rgb}"/>'
    )
    parts.append("</g>")
    return "\n".join(parts)


def run(root: Params, logdir: str, log: Callable[[str], None]) -> int:
    """Prints the grid of ``root``'s experiment and writes it to ``<logdir>/placement.svg``."""
    grid = build(root)
    log(to_text(grid).rstrip("\n"))
    tf.io.gfile.makedirs(logdir)
    path = files.join(logdir, FILE_NAME)
    files.write_text_atomic(path, to_svg(grid))
    log(f"inspect_placement: wrote {path}")
    return 0


# ------------------------------------------------------------------------------------ helpers
def _bytes(n: int) -> str:
    """Bytes as the trainer's start line prints them (``10.4K``), in M or G when large."""
    for unit, size in (("G", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n / 1e3:.1f}K"


def _path(name: str) -> tuple[str, ...]:
    """A variable's path below the task: ``task.stack.layers_0.ffn.w:0`` -> (stack, layers_0, ffn, w)."""
    parts = name.split(":")[0].replace("/", ".").split(".")
    return tuple(parts[1:]) if len(parts) > 1 else tuple(parts)


def _stages_of(pipe: GPipeLayer, device: int) -> str:
    stages = [s for s in range(pipe.num_stages) if s % pipe.num_devices == device]
    return ("stage " if len(stages) == 1 else "stages ") + ", ".join(map(str, stages))


def _device_of(pipe: GPipeLayer, device: int) -> str:
    """Where a schedule device's layers hold their variables (its device may be None: the caller's)."""
    for s in range(device, pipe.num_stages, pipe.num_devices):
        for layer in pipe.stage_layers(s):
            for v in layer.trainable_variables:
                return mesh_placement.device_name(v.device)
    named = pipe.devices[device]
    return mesh_placement.device_name(named) if named else "default device"


def _coordinates(mesh: DeviceMesh, axes: Sequence[str]) -> list[str]:
    """Labels of every coordinate over ``axes`` (row-major, as DTensor orders a mesh's devices)."""
    labels = [""]
    for axis in axes:
        labels = [f"{lead} {axis}={i}".strip() for lead in labels for i in range(mesh.axis_sizes[axis])]
    return labels


def _cell(device: str, here: dict[str, int], paths: dict[str, tuple], whole: dict[str, int]) -> Cell:
    """A device's cell: the largest layers all of whose variables have a part on it (module doc)."""
    held = set(here)
    groups: list[tuple[str, int, int]] = []

    def visit(prefix: tuple[str, ...], names: list[str]) -> None:
        inside = [n for n in names if n in held]
        if not inside:
            return
        if len(inside) == len(names) and (prefix or len(names) == 1):  # the root: its children
            label = "/".join(prefix)
            groups.append((label, sum(here[n] for n in names), sum(whole[n] for n in names)))
            return
        children: dict[str, list[str]] = {}
        for n in names:
            rest = paths[n][len(prefix) :]
            children.setdefault(rest[0] if rest else "", []).append(n)
        for child, sub in children.items():
            visit((*prefix, child), sub)

    visit((), list(paths))
    return Cell(device, sum(here.values()), tuple(groups))
