"""Params semantics, one behaviour per test."""

import pytest
import tensorflow as tf

from params.errors import ConfigError
from params.hyperparams import FrozenParamsError, InstantiableParams, Params, UnknownParamError


def _nested() -> Params:
    inner = Params()
    inner.define("dim", 3, "Width.")
    inner.define("act", "relu", "Activation.")
    p = Params()
    p.define("learning_rate", 0.1, "Learning rate.")
    p.define("body", inner, "The body.")
    p.define("layers", [inner.copy(), inner.copy()], "A list of layers.")
    return p


def test_define_get_set_by_attribute():
    p = Params()
    p.define("x", 1, "An int.")
    assert p.x == 1
    p.x = 5
    assert p.x == 5
    assert p.get_doc("x") == "An int."


def test_define_twice_and_bad_names_fail():
    p = Params()
    p.define("x", 1, "doc")
    with pytest.raises(ConfigError, match="already defined"):
        p.define("x", 2, "doc")
    for bad in ("1x", "a-b", "a.b", ""):
        with pytest.raises(ConfigError, match="invalid param name"):
            p.define(bad, 0, "doc")
    with pytest.raises(ConfigError, match="Params method"):
        p.define("copy", 0, "doc")


def test_unknown_attribute_suggests_close_match():
    p = _nested()
    with pytest.raises(UnknownParamError, match="did you mean 'learning_rate'"):
        p.learning_rat = 1
    with pytest.raises(AttributeError):
        _ = p.nope
    assert not hasattr(p, "nope")


def test_dotted_get_and_set_reach_nested_and_list_items():
    p = _nested()
    p.set(**{"body.dim": 7, "layers[1].act": "gelu", "learning_rate": 0.5})
    assert p.get("body.dim") == 7
    assert p.body.dim == 7
    assert p.get("layers[1].act") == "gelu"
    assert p.layers[0].act == "relu"
    assert p.learning_rate == 0.5
    assert "body.dim" in p and "body.width" not in p and "layers[5].dim" not in p


def test_dotted_unknown_key_names_it_and_suggests():
    p = _nested()
    with pytest.raises(UnknownParamError) as e:
        p.set(**{"body.dmi": 1})
    assert "'body.dmi'" in str(e.value) and "'body.dim'" in str(e.value)
    with pytest.raises(ConfigError, match="has 2 elements"):
        p.get("layers[2].dim")
    with pytest.raises(ConfigError, match="not a group"):
        p.get("learning_rate.x")


def test_copy_is_deep_and_unfrozen():
    p = _nested().freeze()
    q = p.copy()
    assert q == p and not q.is_frozen
    q.body.dim = 99
    q.layers[0].dim = 42
    assert p.body.dim == 3 and p.layers[0].dim == 3


def test_freeze_blocks_every_write_recursively():
    p = _nested().freeze()
    with pytest.raises(FrozenParamsError):
        p.learning_rate = 1.0
    with pytest.raises(FrozenParamsError):
        p.body.dim = 1
    with pytest.raises(FrozenParamsError):
        p.set(**{"layers[0].dim": 1})
    with pytest.raises(FrozenParamsError):
        p.from_text("learning_rate : 2.0")
    with pytest.raises(FrozenParamsError):
        p.define("new", 1, "doc")
    assert p.learning_rate == 0.1


def test_iteration_yields_sorted_dotted_leaves():
    keys = [k for k, _ in _nested()]
    assert keys == sorted(keys)
    assert keys == [
        "body.act", "body.dim", "layers[0].act", "layers[0].dim", "layers[1].act", "layers[1].dim",
        "learning_rate",
    ]  # fmt: skip


def test_to_text_is_lingvo_format():
    p = _nested()
    p.define("dtype", tf.float32, "dtype")
    p.define("cls", InstantiableParams, "a class")
    p.define("nothing", None, "None")
    p.define("shape", (2, 3), "tuple")
    p.define("flag", True, "bool")
    lines = p.to_text().splitlines()
    assert lines == sorted(lines)
    assert "body.act : 'relu'" in lines
    assert "dtype : float32" in lines
    assert "cls : type/params.hyperparams/InstantiableParams" in lines
    assert "nothing : None" in lines and "shape : (2, 3)" in lines and "flag : True" in lines


def test_from_text_is_typed_and_atomic():
    p = _nested()
    p.define("steps", 10, "int")
    p.define("flag", False, "bool")
    p.from_text("# a comment\n\nlearning_rate : 1\nsteps : 20\nflag : True\nbody.act : gelu\n")
    assert p.learning_rate == 1.0 and isinstance(p.learning_rate, float)
    assert p.steps == 20 and p.flag is True and p.body.act == "gelu"
    with pytest.raises(ConfigError, match="expected an int"):
        p.from_text("steps : 2.5")
    with pytest.raises(ConfigError, match="expected a bool"):
        p.from_text("flag : 3")
    with pytest.raises(ConfigError, match="expected a float"):
        p.from_text("learning_rate : 'fast'")
    before = p.copy()
    with pytest.raises(ConfigError):
        p.from_text("steps : 30\nbody.dmi : 1")
    assert p == before  # the good first line was not applied either


def test_from_text_never_runs_code(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('os').system('touch {marker}')"
    p = Params()
    p.define("name", "x", "a string")
    p.define("count", 1, "an int")
    p.define("anything", None, "None default")
    p.from_text(f"name : {code}")
    assert p.name == code  # a string param keeps the text as a string
    for key in ("count", "anything"):
        with pytest.raises(ConfigError, match="cannot parse"):
            p.from_text(f"{key} : {code}")
    assert not marker.exists()


def test_class_values_round_trip_by_import_path():
    p = InstantiableParams(Params)
    text = p.to_text()
    q = InstantiableParams(dict)
    q.from_text(text)
    assert q.cls is Params
    with pytest.raises(ConfigError, match="cannot import"):
        q.from_text("cls : type/no.such.module/Thing")


def test_text_diff_lists_changes():
    a, b = _nested(), _nested()
    b.set(**{"body.dim": 4})
    assert a.text_diff(b) == "- body.dim : 3\n+ body.dim : 4\n"
    assert a.text_diff(a.copy()) == ""


def test_instantiate_calls_cls_with_params():
    class Thing:
        def __init__(self, params, extra=0):
            self.params, self.extra = params, extra

    p = InstantiableParams(Thing)
    thing = p.instantiate(extra=3)
    assert thing.params is p and thing.extra == 3
    with pytest.raises(ConfigError, match="'cls' is None"):
        InstantiableParams().instantiate()
