"""Values in Lingvo's Params text format, written and read without ``eval``.

Grammar of a value: a quoted string, an int, a float (``inf``, ``nan`` too), ``True``/``False``/``None``
(Lingvo's ``NoneType`` too), a TF dtype name (``float32``), a class as ``type/module.path/Name`` (a
function as Lingvo's ``callable/module.path/qualname``), or a list ``[...]``, tuple ``(...)``
or dict ``{k: v}`` of values. Anything else is a ValueError; nothing is ever executed.
"""

from __future__ import annotations

import ast
import enum
import importlib
import re
from typing import Any

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<typeref>(?:type|callable)/[A-Za-z_][\w.]*/[A-Za-z_][\w.]*)
  | (?P<number>[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.]))
  | (?P<signed>[-+](?:inf|nan)\b)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<punct>[\[\](){},:])
    """,
    re.VERBOSE,
)

_DTYPE_NAMES = frozenset(
    "float16 bfloat16 float32 float64 half double int8 int16 int32 int64 uint8 uint16 uint32 "
    "uint64 bool complex64 complex128 string".split()
)


def is_dtype(value: Any) -> bool:
    """True for a ``tf.DType`` (checked without importing TensorFlow)."""
    return type(value).__name__ == "DType" and hasattr(value, "as_numpy_dtype")


def format_value(value: Any) -> str:
    """The text of one value; ``parse_value`` reads it back to an equal value."""
    if value is None or isinstance(value, bool):
        return str(value)
    if isinstance(value, enum.Enum):
        return format_value(value.name)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if is_dtype(value):
        return value.name
    if isinstance(value, type):
        return f"type/{value.__module__}/{value.__qualname__}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{format_value(k)}: {format_value(v)}" for k, v in items) + "}"
    if hasattr(value, "to_text"):  # nested Params inside a container: show, cannot round-trip
        return "{" + "; ".join(line for line in value.to_text().splitlines()) + "}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"type/{value.__module__}/{value.__qualname__}"
    return repr(str(value))


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if not match:
            raise ValueError(f"unexpected character {text[pos]!r} at position {pos}")
        pos = match.end()
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group()))
    return tokens


def parse_value(text: str) -> Any:
    """Parses one value of the grammar above; raises ValueError on anything else."""
    tokens = _tokenize(text)
    if not tokens:
        raise ValueError("empty value")
    value, pos = _parse(tokens, 0)
    if pos != len(tokens):
        raise ValueError(f"unexpected {tokens[pos][1]!r} after the value")
    return value


def _parse(tokens: list[tuple[str, str]], pos: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise ValueError("value ends too early")
    kind, text = tokens[pos]
    if kind == "string":
        return ast.literal_eval(text), pos + 1  # a single string token: a literal, never code
    if kind == "number":
        is_float = any(c in text for c in ".eE")
        return (float(text) if is_float else int(text)), pos + 1
    if kind == "signed":
        return float(text), pos + 1
    if kind == "typeref":
        return resolve_typeref(text), pos + 1
    if kind == "name":
        return _parse_name(text), pos + 1
    if text == "[":
        items, pos = _parse_sequence(tokens, pos + 1, "]")
        return items, pos
    if text == "(":
        items, pos = _parse_sequence(tokens, pos + 1, ")")
        return tuple(items), pos
    if text == "{":
        return _parse_dict(tokens, pos + 1)
    raise ValueError(f"unexpected {text!r}")


def resolve_typeref(text: str) -> Any:
    """Imports the class named by ``type/module.path/Name`` (a module import, never an eval); Lingvo's
    ``callable/module.path/qualname`` names a function the same way."""
    module_name, _, attr = text.partition("/")[2].rpartition("/")
    try:
        module = importlib.import_module(module_name)
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import {text!r} ({e})") from None
    return obj


def _parse_name(text: str) -> Any:
    constants = {"True": True, "False": False, "None": None, "true": True, "false": False}
    constants["NoneType"] = None  # Lingvo's ToText writes None as its type name
    if text in constants:
        return constants[text]
    if text in ("inf", "nan"):
        return float(text)
    if text in _DTYPE_NAMES:
        import tensorflow as tf  # only when a dtype is actually written

        return tf.as_dtype(text)
    raise ValueError(f"{text!r} is not a value (strings need quotes)")


def _parse_sequence(tokens: list[tuple[str, str]], pos: int, close: str) -> tuple[list, int]:
    items = []
    while True:
        if pos < len(tokens) and tokens[pos][1] == close:
            return items, pos + 1
        value, pos = _parse(tokens, pos)
        items.append(value)
        if pos < len(tokens) and tokens[pos][1] == ",":
            pos += 1
        elif pos >= len(tokens) or tokens[pos][1] != close:
            raise ValueError(f"expected ',' or {close!r}")


def _parse_dict(tokens: list[tuple[str, str]], pos: int) -> tuple[dict, int]:
    result = {}
    while True:
        if pos < len(tokens) and tokens[pos][1] == "}":
            return result, pos + 1
        key, pos = _parse(tokens, pos)
        if pos >= len(tokens) or tokens[pos][1] != ":":
            raise ValueError("expected ':' in a dict")
        value, pos = _parse(tokens, pos + 1)
        try:
            result[key] = value
        except TypeError:
            raise ValueError(f"dict key {key!r} is not hashable") from None
        if pos < len(tokens) and tokens[pos][1] == ",":
            pos += 1
        elif pos >= len(tokens) or tokens[pos][1] != "}":
            raise ValueError("expected ',' or '}'")
