"""Mesh-TF's layout rules, each violation one line naming the layer; layers off the mesh unchanged."""

import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.attention import MultiHeadAttention
from layers.core import DropoutLayer, EmbeddingLayer, ProjectionLayer
from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError

RULES = "batch:data;hidden:model;heads:model;vocab:model"


def _mesh(shape=(2, 2), rules=RULES):
    return mesh_lib.create_mesh(list(shape), ["data", "model"], rules)


def _projection(**kwargs):
    return ProjectionLayer.Params().set(
        name="proj", input_dim=4, output_dim=8, input_dim_name="embed", output_dim_name="hidden", **kwargs
    )


def _build(params, mesh):
    with mesh_lib.mesh_scope(mesh):
        return params.instantiate()


def _error(params, mesh) -> str:
    with pytest.raises(ConfigError) as info:
        _build(params, mesh)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_rules_split_named_dimensions():
    layer = _build(_projection(), _mesh())
    assert isinstance(layer.vars["w"], dtensor.DVariable)
    assert dtensor.fetch_layout(layer.vars["w"]).sharding_specs == [dtensor.UNSHARDED, "model"]
    assert dtensor.fetch_layout(layer.vars["b"]).sharding_specs == ["model"]


def test_override_beats_rules():
    p = _projection(weight_split_dims_mapping={"w": ["model", None]})
    layer = _build(p, _mesh())
    assert dtensor.fetch_layout(layer.vars["w"]).sharding_specs == ["model", dtensor.UNSHARDED]
    p = _projection(weight_split_dims_mapping=["data", "model"])  # a list: the main weight
    layer = _build(p, _mesh())
    assert dtensor.fetch_layout(layer.vars["w"]).sharding_specs == ["data", "model"]


def test_without_a_mesh_nothing_changes():
    layer = _projection().instantiate()
    assert layer.mesh is None
    assert not isinstance(layer.vars["w"], dtensor.DVariable)
    same = _build(_projection(), None)
    assert not isinstance(same.vars["w"], dtensor.DVariable)
    tf.debugging.assert_equal(layer.vars["w"], same.vars["w"])


def test_initial_values_do_not_depend_on_the_mesh():
    plain = _projection().instantiate()
    for shape in ([2, 2], [1, 4]):
        sharded = _build(_projection(), _mesh(shape))
        full = dtensor.relayout(
            sharded.vars["w"].read_value(), dtensor.Layout.replicated(sharded.mesh.mesh, 2)
        )
        tf.debugging.assert_equal(dtensor.unpack(full)[0], plain.vars["w"])


def test_one_axis_per_dimension():
    message = _error(_projection(weight_split_dims_mapping={"w": [["data", "model"], None]}), _mesh())
    assert message.startswith("proj: weight 'w' dimension 0 is split over ['data', 'model']")
    assert "one mesh axis at most" in message
    with pytest.raises(ConfigError, match="split over one mesh axis at most"):
        mesh_lib.parse_layout_rules("hidden:data,model")
    with pytest.raises(ConfigError, match="both 'data' and 'model'"):
        mesh_lib.parse_layout_rules("hidden:data;hidden:model")


def test_two_dimensions_never_share_an_axis():
    message = _error(_projection(weight_split_dims_mapping={"w": ["model", "model"]}), _mesh())
    assert message == (
        "proj: weight 'w' dimensions 0 and 1 are both split over mesh axis 'model'; two dimensions of one "
        "tensor never share an axis"
    )


def test_sizes_divisible_by_the_axis():
    p = _projection().set(output_dim=6)
    message = _error(p, _mesh([1, 4]))
    assert message == "proj: weight 'w' dimension 1 (size 6) is not divisible by mesh axis 'model' (size 4)"
    emb = EmbeddingLayer.Params().set(name="emb", vocab_size=10, embedding_dim=4)
    assert _error(emb, _mesh([1, 4])).startswith("emb: weight 'emb' dimension 0 (size 10) is not divisible")
    atten = MultiHeadAttention.Params().set(name="atten", input_dim=6, num_heads=2, fused_qkv=False)
    assert _error(atten, _mesh([1, 4])).startswith(
        "atten: weight 'w_q' dimension 1 (size 6) is not divisible"
    )


def test_heads_must_divide_by_the_axis():
    atten = MultiHeadAttention.Params().set(name="atten", input_dim=16, num_heads=2, fused_qkv=False)
    message = _error(atten, _mesh([1, 4]))
    assert (
        message == "atten: num_heads=2 is not divisible by mesh axis 'model' (size 4) that splits the heads"
    )


def test_unknown_axes_and_bad_meshes():
    message = _error(_projection(weight_split_dims_mapping={"w": [None, "tensor"]}), _mesh())
    assert message == "proj: weight 'w' dimension 1 names mesh axis 'tensor', not one of ['data', 'model']"
    message = _error(_projection(weight_split_dims_mapping={"w": [None]}), _mesh())
    assert message.startswith("proj: weight 'w' split mapping [None] has 1 entries for a tensor of rank 2")
    with pytest.raises(ConfigError, match="needs 8 CPU devices, found 4"):
        mesh_lib.create_mesh([2, 4], ["data", "model"])
    with pytest.raises(ConfigError, match="mesh_axis_names"):
        mesh_lib.create_mesh([2, 2], ["data", "data"])
    with pytest.raises(ConfigError, match="not a mesh axis"):
        mesh_lib.create_mesh([2, 2], ["data", "model"], "batch:replica")


def test_dropout_is_refused_on_a_mesh():
    dropout = DropoutLayer.Params().set(name="drop", keep_prob=0.9)
    assert _error(dropout, _mesh()).startswith(
        "drop: keep_prob < 1 (dropout) is not supported on a device mesh"
    )
    _build(DropoutLayer.Params().set(name="drop", keep_prob=1.0), _mesh())
    atten = MultiHeadAttention.Params().set(name="atten", input_dim=8, num_heads=2, atten_dropout_prob=0.1)
    assert "atten_dropout_prob > 0 (dropout) is not supported" in _error(atten, _mesh())
    dropout.instantiate()  # off the mesh: as before
