"""--mode=inspect_placement: the device grid of one device, a GPipe pipeline, a data x model mesh and
pipeline x mesh, as text and SVG (parsed back), built in this process on the four logical CPUs of
tests/conftest.py; one run of the binary; and the one-line refusals of impossible combinations."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import gin
import pytest

from params import experiment
from params.errors import ConfigError
from tests.trainer.runner import REPO, _env
from trainer.pipeline_views import placement_grid

SMALL = ["model_dim = 16", "hidden_dim = 32", "num_heads = 2", "batch_size = 8", "seq_length = 8"]
NS = "{http://www.w3.org/2000/svg}"


def _grid(model: str, *knobs: str, override: str | None = None) -> placement_grid.Grid:
    gin.clear_config()
    name = model.rsplit(".", 1)[-1]
    root = experiment.resolve(model, gin_bindings=[f"{name}.{k}" for k in knobs], params_override=override)
    return placement_grid.build(root)


def _svg_cells(grid: placement_grid.Grid) -> dict[str, str]:
    """Each drawn cell's device -> its text, read back from the SVG."""
    svg = ET.fromstring(placement_grid.to_svg(grid))
    assert svg.tag == f"{NS}svg"
    cells = {}
    for g in svg.iter(f"{NS}g"):
        assert g.get("class") == "cell"
        text = "\n".join(t.text.replace("\u00a0", " ") for t in g.iter(f"{NS}text"))
        assert text.startswith(g.get("data-device")), text
        cells[g.get("data-device")] = text
    titles = [t.text for t in svg.findall(f"{NS}text")]
    assert grid.title in titles and all(label in titles for label in grid.row_labels[:1])
    return cells


def _cells(grid: placement_grid.Grid) -> list[list[str]]:
    return [[c.device if c else "" for c in row] for row in grid.cells]


def _holds(cell: placement_grid.Cell) -> dict[str, tuple[int, int]]:
    return {path: (here, whole) for path, here, whole in cell.holds}


def test_one_device_is_one_cell_holding_the_whole_model():
    grid = _grid("image.digits.ConvNet")
    assert _cells(grid) == [["CPU:0"]] and grid.title.endswith("(OnDevice), 1 device")
    (cell,) = grid.cells[0]
    assert cell.weight_bytes == grid.unsharded_bytes > 0
    assert sorted(_holds(cell)) == ["body", "softmax"]  # the task's layers, none split
    assert all(here == whole for here, whole in _holds(cell).values())
    cells = _svg_cells(grid)
    assert list(cells) == ["CPU:0"] and "body" in cells["CPU:0"]


def test_gpipe_stages_are_rows_of_their_devices():
    grid = _grid("lm.synthetic.GPipeTransformerLM", "num_layers = 2", *SMALL)
    assert _cells(grid) == [["CPU:0"], ["CPU:1"]] and grid.row_labels == ("stage 0", "stage 1")
    first, second = (row[0] for row in grid.cells)
    assert "stack/pipeline/layers_0" in _holds(first) and "emb" in _holds(first)
    assert list(_holds(second)) == ["stack/pipeline/layers_1"]
    assert first.weight_bytes + second.weight_bytes == grid.unsharded_bytes  # nothing copied
    text = placement_grid.to_text(grid)
    assert "pipeline 2 (one device per stage)" in text and "stack/pipeline/layers_1" in text
    assert set(_svg_cells(grid)) == {"CPU:0", "CPU:1"}


def test_mesh_rows_are_its_data_axis_and_columns_its_model_axis():
    grid = _grid("lm.synthetic.MeshTransformerLM", "num_layers = 1", *SMALL)
    assert _cells(grid) == [["CPU:0", "CPU:1"], ["CPU:2", "CPU:3"]]
    assert grid.row_labels == ("data=0", "data=1") and grid.column_labels == ("model=0", "model=1")
    cell = grid.cells[1][0]
    here, whole = _holds(cell)["emb"]
    assert 2 * here == whole  # the vocabulary split over model
    assert cell.weight_bytes == grid.cells[0][0].weight_bytes < grid.unsharded_bytes  # replicas
    assert len(_svg_cells(grid)) == 4


def test_stage_mesh_grid_is_stages_by_mesh_coordinates():
    grid = _grid("lm.synthetic.StageMeshTransformerLM", *SMALL)
    assert _cells(grid) == [["CPU:0", "CPU:1"], ["CPU:2", "CPU:3"]]
    assert grid.row_labels == ("stage 0", "stage 1") and grid.column_labels == ("model=0", "model=1")
    assert "pipeline 2 x mesh model=2 (StageMeshPlacement), 4 devices" in grid.title
    for row, layers in ((0, ["emb", "stack/pipeline/layers_0", "stack/pipeline/layers_1"]), (1, ["softmax"])):
        for cell in grid.cells[row]:
            held = _holds(cell)
            assert all(layer in held for layer in layers), held
            assert all(held[layer][0] < held[layer][1] for layer in layers)  # split by the mesh
            assert cell.weight_bytes <= 0.27 * grid.unsharded_bytes  # about a quarter each
    cells = _svg_cells(grid)
    assert sorted(cells) == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]
    assert "stack/pipeline/layers_2" in cells["CPU:3"] and "of" in cells["CPU:3"]


@pytest.mark.parametrize(
    "knobs, override, message",
    [
        ((), "cluster.mesh_shape : [2]; cluster.mesh_axis_names : ['model']",
         "cluster.mesh_shape and a GPipe layer's stage_mesh_shape both place the model; set one"),
        (("stage_mesh_size = 4",), None, "num_stages=2 x stage_mesh_shape [4] needs 8 CPU devices, found 4"),
    ],
)  # fmt: skip
def test_impossible_combinations_are_one_line(knobs, override, message):
    with pytest.raises(ConfigError, match="^[^\n]*$") as e:
        _grid("lm.synthetic.StageMeshTransformerLM", *SMALL, *knobs, override=override)
    assert message in str(e.value)


def test_the_binary_prints_the_grid_and_writes_the_svg(tmp_path):
    knobs = [f"--gin_param=StageMeshTransformerLM.{k}" for k in SMALL]
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--model=lm.synthetic.StageMeshTransformerLM",
         "--mode=inspect_placement", f"--logdir={tmp_path}", *knobs],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert all(f"CPU:{d}  " in result.stdout for d in range(4)), result.stdout
    assert f"inspect_placement: wrote {tmp_path / 'placement.svg'}" in result.stdout
    assert result.stderr.count("layers in 2 stages") == 1, result.stderr  # the partition table, once
    assert not (tmp_path / "train").exists()  # nothing trained, no checkpoint
    svg = ET.parse(tmp_path / "placement.svg").getroot()
    assert len([g for g in svg.iter(f"{NS}g") if g.get("class") == "cell"]) == 4
