"""Params.from_text on the class: a tree from text alone (this project's params.txt and Lingvo's)."""

from __future__ import annotations

import pytest

from params import experiment, text_format
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

LINGVO_TEXT = """
# written by Lingvo's ToText
cls : type/collections/OrderedDict
name : 'lm'
dtype : float32
fprop_dtype : NoneType
vn.global_vn : False
softmax.num_classes : 32000
activation_fn : callable/collections/namedtuple
stack[0].dims : [512, 512]
stack[1].dims : [512]
tpu : SomeUnknownObject
"""


def test_builds_a_lingvo_params_txt_without_its_classes():
    p = Params.from_text(LINGVO_TEXT)
    # Modules outside the project are never imported from text: their classes stay text.
    assert not isinstance(p, InstantiableParams) and p.cls == "type/collections/OrderedDict"
    assert p.fprop_dtype is None and p.vn.global_vn is False and p.softmax.num_classes == 32000
    assert p.activation_fn == "callable/collections/namedtuple"
    assert [layer.dims for layer in p.stack] == [[512, 512], [512]]
    assert p.tpu == "SomeUnknownObject"  # what no grammar reads stays text
    assert p.dtype.name == "float32"


@pytest.mark.parametrize("key", ["image.digits.GPipeConvNet", "mt.algorithmic.ReverseTransformer"])
def test_round_trips_every_value_of_an_experiment(key):
    root = experiment.resolve(key)
    rebuilt = Params.from_text(root.to_text())
    assert rebuilt.to_text() == root.to_text()
    assert rebuilt.task.cls is root.task.cls
    task = experiment.task_params_for(rebuilt, "dev")
    assert task.instantiate() is not None  # what tools.export does with a run's params.txt


def test_instance_from_text_still_sets_values():
    p = Params()
    p.define("x", 1, "")
    assert p.from_text("x : 3") is p and p.x == 3


def test_none_type_is_none_for_any_param():
    assert text_format.parse_value("NoneType") is None
    p = Params()
    p.define("x", 1, "")
    p.from_text("x : NoneType")
    assert p.x is None


def test_bad_text_is_one_config_error():
    with pytest.raises(ConfigError, match="line 2: expected 'key : value'"):
        Params.from_text("a : 1\nnot a statement\n")
    with pytest.raises(ConfigError, match="both a value and a group"):
        Params.from_text("a : 1\na.b : 2\n")
    with pytest.raises(ConfigError, match="not 0..n-1"):
        Params.from_text("a[1].b : 2\n")
