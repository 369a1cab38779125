"""Lingvo-style Params code run through params.lingvo_compat builds the tree the native API builds."""

import pytest

from params import lingvo_compat as hyperparams
from params.errors import ConfigError
from params.hyperparams import FrozenParamsError, InstantiableParams, Params, UnknownParamError


class Scaler:
    """A class built from its Params, as Lingvo's layers are."""

    def __init__(self, params, offset=0.0):
        self.params = params
        self.offset = offset

    def apply(self, x):
        return x * self.params.scale + self.offset


def lingvo_tree():
    """Written as a Lingvo user writes it."""
    train = hyperparams.Params()
    train.Define("learning_rate", 0.1, "Learning rate.")
    train.Define("max_steps", 100, "Steps.")
    layer = hyperparams.Params()
    layer.Define("dim", 3, "Width.")
    p = hyperparams.InstantiableParams(Scaler)
    p.Define("name", "scaler", "Name.")
    p.Define("scale", 2.0, "Factor.")
    p.Define("train", train, "Training settings.")
    p.Define("layers", [layer, layer.Copy()], "Layers.")
    p.Set(**{"train.learning_rate": 0.5, "layers[1].dim": 4}, name="s")
    return p


def native_tree():
    """The same tree through the project's own API."""
    train = Params()
    train.define("learning_rate", 0.1, "Learning rate.")
    train.define("max_steps", 100, "Steps.")
    layer = Params()
    layer.define("dim", 3, "Width.")
    p = InstantiableParams(Scaler)
    p.define("name", "scaler", "Name.")
    p.define("scale", 2.0, "Factor.")
    p.define("train", train, "Training settings.")
    p.define("layers", [layer, layer.copy()], "Layers.")
    p.set(**{"train.learning_rate": 0.5, "layers[1].dim": 4}, name="s")
    return p


def test_the_lingvo_built_tree_is_the_native_tree():
    lingvo, native = lingvo_tree(), native_tree()
    assert isinstance(lingvo, InstantiableParams)  # anything here takes it
    assert lingvo == native and native == lingvo
    assert lingvo.ToText() == native.to_text() == lingvo.to_text()
    assert lingvo.Get("train.learning_rate") == 0.5 == native.get("train.learning_rate")
    assert lingvo.Get("layers[1].dim") == 4
    assert "layers[1].dim : 4\n" in lingvo.ToText()


def test_set_returns_self_and_unknown_keys_are_attribute_errors():
    p = lingvo_tree()
    assert p.Set(scale=3.0) is p
    with pytest.raises(AttributeError, match="unknown param 'train.learning_rat'; did you mean"):
        p.Set(**{"train.learning_rat": 1.0})
    with pytest.raises(AttributeError):
        p.Get("nope")


def test_iter_params_and_get_keys_are_the_own_names_in_definition_order():
    p = lingvo_tree()
    assert p.GetKeys() == ["cls", "name", "scale", "train", "layers"]
    items = dict(p.IterParams())
    assert list(items) == p.GetKeys()
    assert items["scale"] == 2.0 and items["train"] == native_tree().train


def test_copy_is_deep_and_a_frozen_copy_stays_frozen():
    p = lingvo_tree()
    q = p.Copy()
    q.Set(**{"train.max_steps": 7})
    assert p.train.max_steps == 100 and type(q) is type(p)
    p.Freeze()
    assert p.IsImmutable()
    frozen = p.Copy()
    assert frozen.IsImmutable()
    with pytest.raises(TypeError):
        frozen.Set(scale=1.0)
    with pytest.raises(FrozenParamsError):
        p.train.max_steps = 5  # Freeze reaches nested Params here


def test_delete_removes_dotted_keys():
    p = lingvo_tree()
    assert p.Delete("scale", "train.max_steps") is p
    native = native_tree().delete("scale", "train.max_steps")
    assert p.ToText() == native.to_text()
    assert "scale" not in p.GetKeys()


def test_from_text_reads_to_text_back_and_returns_self():
    p = lingvo_tree()
    text = p.Copy().Set(scale=9.0, name="other", **{"train.max_steps": 3}).ToText()
    settings = "".join(line + "\n" for line in text.splitlines() if not line.startswith("cls :"))
    assert p.FromText(settings) is p  # (a type/ value names only the project's classes, not a test's)
    assert (p.scale, p.name, p.train.max_steps) == (9.0, "other", 3)
    assert p.ToText() == text
    with pytest.raises(ConfigError, match="type_overrides"):
        p.FromText(text, type_overrides={"scale": "int"})


def test_text_diff_uses_lingvos_marks():
    a, b = lingvo_tree(), lingvo_tree()
    b.Set(scale=3.0, **{"train.max_steps": 7, "layers[0].dim": 5})
    b.Delete("name")
    b.train.Define("warmup", 10, "Warm-up steps.")
    assert a.TextDiff(b) == (
        "? layers[0]:\n"
        ">   dim: 3\n"
        "<   dim: 5\n"
        "> name: s\n"
        "> scale: 2.0\n"
        "< scale: 3.0\n"
        "? train:\n"
        ">   max_steps: 100\n"
        "<   max_steps: 7\n"
        "<   warmup: 10\n"
    )
    assert a.TextDiff(a.Copy()) == ""
    assert a.TextDiff(native_tree()) == ""  # the other side may be native Params


def test_instantiate_passes_the_params_and_keyword_arguments():
    p = lingvo_tree()
    obj = p.Instantiate(offset=1.0)
    assert isinstance(obj, Scaler) and obj.params is p
    assert obj.apply(2.0) == 5.0
    with pytest.raises(ConfigError, match="'cls' is None"):
        hyperparams.InstantiableParams(None).Instantiate()


def test_str_is_lingvos_nested_form():
    p = hyperparams.Params()
    p.Define("name", "x", "")
    inner = hyperparams.Params()
    inner.Define("dim", 2, "")
    p.Define("inner", inner, "")
    assert str(p) == '{\n  inner: {\n    dim: 2\n  }\n  name: "x"\n}'


def test_native_params_put_into_a_compat_tree_gain_lingvos_names():
    native = InstantiableParams(Scaler)
    native.define("scale", 1.0, "Factor.")
    p = hyperparams.Params()
    p.Define("scaler", native, "A native sub-tree.")
    p.Define("many", [Params()], "")
    assert p.scaler.Set(scale=4.0).Instantiate().apply(1.0) == 4.0
    assert p.Get("many")[0].GetKeys() == []
    adopted = hyperparams.adopt(native_tree())
    assert adopted.Set(scale=5.0).train.Get("max_steps") == 100


def test_copy_fields_to_skips_cls_and_the_names_given():
    src, dst = lingvo_tree(), hyperparams.adopt(native_tree())
    src.Set(scale=7.0, name="copied")
    hyperparams.CopyFieldsTo(src, dst, skip="name")
    assert dst.scale == 7.0 and dst.name == "s" and dst.train == src.train and dst.train is not src.train


def test_a_lingvo_method_on_native_params_names_the_snake_case_one_and_the_compat_module():
    p = native_tree()
    pairs = (("Define", "define"), ("Set", "set"), ("TextDiff", "text_diff"), ("GetKeys", "names"))
    for name, snake in pairs:
        with pytest.raises(UnknownParamError) as error:
            getattr(p, name)
        message = str(error.value)
        assert "\n" not in message and f"p.{snake}(" in message
        assert "from params import lingvo_compat as hyperparams" in message
        assert "unknown param" not in message
    assert not hasattr(p, "Instantiate")
    with pytest.raises(UnknownParamError, match="unknown param 'Scale'"):
        p.Scale  # noqa: B018 (a capitalised name that is no Lingvo method stays an unknown param)
