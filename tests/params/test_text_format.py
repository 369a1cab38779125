"""The text format: round trips of random nested Params, and refusal of anything but literals."""

import math
import warnings

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from params import text_format
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from([tf.float32, tf.int64, tf.bfloat16]),
    st.sampled_from([Params, dict]),
)
_values = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers()), children, max_size=3),
    ),
    max_leaves=8,
)


@st.composite
def _params(draw, depth=0):
    p = Params()
    for name in draw(st.lists(_names, unique=True, max_size=5)):
        if depth < 2 and draw(st.booleans()) and draw(st.booleans()):
            p.define(name, draw(_params(depth=depth + 1)), "nested")
        else:
            p.define(name, draw(_values), "a value")
    return p


def _blank_like(p: Params) -> Params:
    """Same structure and types, different values: from_text must restore every value."""
    q = p.copy()
    for key, value in p:
        q.set(**{key: _placeholder(value)})
    return q


def _placeholder(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return type(value)(0) if value else type(value)(1)
    if isinstance(value, str):
        return value + "_"
    if isinstance(value, (list, tuple)):
        return type(value)()
    if isinstance(value, dict):
        return {}
    return value


@settings(max_examples=200, deadline=None)
@given(_params())
def test_round_trip_random_nested_params(p):
    q = _blank_like(p)
    q.from_text(p.to_text())
    assert q == p, p.text_diff(q)


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd').read()",
        "[x for x in ()]",
        "lambda: 1",
        "1 + 1",
        "os.path",
        "{'a': print}",
        "(",
    ],
)
def test_parser_rejects_code(text):
    with pytest.raises(ValueError):
        text_format.parse_value(text)


def test_parser_reads_every_literal_kind():
    parsed = text_format.parse_value(
        "[1, -2.5e3, 'a;b', \"q'uote\", True, None, inf, -inf, (1,), {'k': float32}]"
    )
    assert parsed[:6] == [1, -2500.0, "a;b", "q'uote", True, None]
    assert math.isinf(parsed[6]) and parsed[7] == -math.inf
    assert parsed[8] == (1,) and parsed[9] == {"k": tf.float32}
    assert math.isnan(text_format.parse_value("nan"))


def test_format_then_parse_is_identity_for_tricky_strings():
    for s in ["", "it's", 'say "hi"', "back\\slash", "new\nline", "tab\t", "ünïcode", "a : b ; c"]:
        assert text_format.parse_value(text_format.format_value(s)) == s


@pytest.mark.parametrize(
    "text, match",
    [
        ("type/os/system", "not part of this project"),
        ("", "empty value"),
        ("   ", "empty value"),
        (r"'\d'", r"invalid escape sequence '\\d' \(a backslash itself is written"),
        (r"'\777'", r"invalid octal escape sequence '\\777'"),
    ],
)
def test_parse_value_raises_config_error_never_a_warning(text, match):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a DeprecationWarning would fail here instead
        with pytest.raises(ConfigError, match=match):
            text_format.parse_value(text)


@pytest.mark.parametrize("text", ["type/tp_never_imported/Thing", "'tp_never_imported.Thing'"])
def test_a_rejected_type_value_never_imports_its_module(canary, text):
    p = InstantiableParams(dict)
    with pytest.raises(ConfigError, match="was not imported"):
        p.from_text(f"cls : {text}")
    with pytest.raises(ValueError):
        text_format.parse_value(f"[{text}]" if text.startswith("type/") else "type/tp_never_imported/X")
