"""NestedMap: Lingvo's methods, and round trips through tf.nest, tf.function, tf.data and a checkpoint."""

from __future__ import annotations

import pytest
import tensorflow as tf

from layers.nested_map import NestedMap


def _example() -> NestedMap:
    return NestedMap(b=NestedMap(y=2, x=1), a=[3, NestedMap(z=4)], c=5)


def test_attribute_access_and_bad_keys():
    m = NestedMap(x=1)
    m.y = 2
    assert m["y"] == 2 and m.x == 1 and isinstance(m, dict)
    del m.x
    with pytest.raises(AttributeError, match="has no attribute 'x'; its keys: y"):
        m.x  # noqa: B018
    with pytest.raises(ValueError, match="name of a dict method"):
        m.keys = 1
    with pytest.raises(ValueError, match="not a Python identifier"):
        NestedMap({"a b": 1})
    assert isinstance(m.copy(), NestedMap)


def test_lingvo_methods():
    m = _example()
    assert m.Flatten() == [3, 4, 1, 2, 5] == tf.nest.flatten(m)
    assert m.FlattenItems() == [("a[0]", 3), ("a[1].z", 4), ("b.x", 1), ("b.y", 2), ("c", 5)]
    packed = m.Pack([10, 40, 100, 200, 500])
    assert packed.a[1].z == 40 and packed.b.y == 200 and isinstance(packed.b, NestedMap)
    assert m.Transform(lambda v: v * 2).Flatten() == [6, 8, 2, 4, 10]
    assert m.IsCompatible(packed) and not m.IsCompatible(NestedMap(c=1))
    assert m.Filter(lambda v: v > 2) == NestedMap(a=[3, NestedMap(z=4)], c=5)
    assert m.FilterKeyVal(lambda k, _: k.startswith("b.")) == NestedMap(b=NestedMap(x=1, y=2))
    assert m.GetItem("a[1].z") == 4 and m.Get("b.q", "none") == "none"
    m.Set("d.e.f", 6)
    assert m.d.e.f == 6
    assert m.DebugString().splitlines()[:2] == ["a[0]      3", "a[1].z    4"]
    copied = m.DeepCopy()
    assert copied == m and copied.b is not m.b
    nested = NestedMap.FromNestedDict({"p": {"q": [{"r": 1}]}})
    assert nested.p.q[0].r == 1 and type(nested.ToNestedDict()["p"]) is dict


def test_tf_nest_function_and_dataset_keep_nested_maps():
    m = NestedMap(image=tf.ones([2, 3]), meta=NestedMap(label=tf.constant([1, 2])))
    mapped = tf.nest.map_structure(lambda t: t * 2, m)
    assert isinstance(mapped, NestedMap) and isinstance(mapped.meta, NestedMap)

    @tf.function(autograph=False)
    def double(batch: NestedMap) -> NestedMap:
        assert isinstance(batch, NestedMap)
        return batch.Transform(lambda t: t * 2)

    out = double(m)
    assert isinstance(out.meta, NestedMap) and out.meta.label.numpy().tolist() == [2, 4]
    ds = tf.data.Dataset.from_tensor_slices(m).batch(2)
    element = next(iter(ds))
    assert isinstance(element, NestedMap) and element.image.shape == (2, 3)


def test_checkpoint_round_trip(tmp_path):
    def variables(value: float) -> NestedMap:
        return NestedMap(w=tf.Variable([value, value]), inner=NestedMap(b=tf.Variable(value)))

    saved = variables(1.0)
    path = tf.train.Checkpoint(vars=saved).write(str(tmp_path / "ckpt"))
    restored = variables(0.0)
    tf.train.Checkpoint(vars=restored).read(path).assert_existing_objects_matched()
    assert restored.w.numpy().tolist() == [1.0, 1.0] and float(restored.inner.b.numpy()) == 1.0
    holder = tf.Module()  # a layer holding a NestedMap of variables: the checkpoint holds them by key
    holder.theta = variables(2.0)
    path = tf.train.Checkpoint(m=holder).write(str(tmp_path / "module"))
    keys = {name for name, _ in tf.train.list_variables(path)}
    assert {"m/theta/w/.ATTRIBUTES/VARIABLE_VALUE", "m/theta/inner/b/.ATTRIBUTES/VARIABLE_VALUE"} <= keys
