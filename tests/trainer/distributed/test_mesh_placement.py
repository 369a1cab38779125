"""The mesh from cluster Params: none by default, one-line errors for a bad one."""

import pytest

from params.errors import ConfigError
from params.experiment import cluster_params
from trainer.distributed.mesh_placement import mesh_from_cluster


def test_no_mesh_by_default():
    assert mesh_from_cluster(cluster_params()) is None


def test_mesh_from_cluster():
    cluster = cluster_params().set(
        mesh_shape=[2, 2], mesh_axis_names=["data", "model"], layout_rules="batch:data"
    )
    mesh = mesh_from_cluster(cluster)
    assert mesh.axis_sizes == {"data": 2, "model": 2} and mesh.rules == {"batch": "data"}
    assert mesh.describe() == "data=2 x model=2"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"layout_rules": "batch:data"}, "cluster.layout_rules is set but cluster.mesh_shape is empty"),
        ({"mesh_shape": [2, 0], "mesh_axis_names": ["a", "b"]}, "cluster.mesh_shape: expected"),
        ({"mesh_shape": [2, 2], "mesh_axis_names": ["data"]}, "cluster.mesh_axis_names: expected 2 distinct"),
        ({"mesh_shape": [2, 4], "mesh_axis_names": ["d", "m"]}, "needs 8 CPU devices, found 4"),
        (
            {"mesh_shape": [4], "mesh_axis_names": ["d"], "layout_rules": "batch d"},
            "cluster.layout_rules: expected 'name:axis' items",
        ),
    ],
)
def test_bad_meshes_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError) as info:
        mesh_from_cluster(cluster_params().set(**changes))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_pipeline_is_refused_on_a_mesh():
    from layers.parallel import mesh as mesh_lib
    from tasks.lm.params.synthetic import GPipeTransformerLM
    from trainer.distributed.mesh_placement import MeshPlacement
    from trainer.train_step import TrainStep

    exp = GPipeTransformerLM(num_layers=2, model_dim=8, hidden_dim=16, batch_size=4, num_train_sequences=16)
    mesh = mesh_lib.create_mesh([2, 1], ["data", "model"], "batch:data")
    with pytest.raises(ConfigError) as info:
        TrainStep(exp.task(), exp.train(), MeshPlacement(mesh))
    assert str(info.value) == (
        "task TransformerLmTask: a GPipe pipeline cannot run on a device mesh (cluster.mesh_shape); "
        "use one or the other"
    )
