"""Values in Lingvo's Params text format, written and read without ``eval``.

Grammar of a value: a quoted string, an int, a float (``inf``, ``nan`` too), ``True``/``False``/``None``
(Lingvo's ``NoneType`` too), a TF dtype name (``float32``), a class as ``type/module.path/Name`` (a
function as Lingvo's ``callable/module.path/qualname``), or a list ``[...]``, tuple ``(...)`` or dict
``{k: v}`` of values. Anything else is a ConfigError (a ValueError too); nothing is ever executed, and
a ``type/`` or ``callable/`` value imports only a module of the project (``registry.is_known_module``).
Limits keep
hostile input from exhausting the parser: ``MAX_VALUE_CHARS`` characters, ``MAX_DEPTH`` levels of brackets.
"""

from __future__ import annotations

import ast
import enum
import re
import warnings
from typing import Any

from params import module_aliases, registry
from params.errors import ConfigError

MAX_VALUE_CHARS = 100_000
MAX_DEPTH = 50

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


def is_dtype_name(text: Any) -> bool:
    """True for a TensorFlow dtype name such as 'float32'."""
    return isinstance(text, str) and text in _DTYPE_NAMES


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
    if len(text) > MAX_VALUE_CHARS:
        raise ConfigError(f"value is {len(text)} characters long; the limit is {MAX_VALUE_CHARS}")
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if not match:
            raise ConfigError(f"unexpected character {text[pos]!r} at position {pos}")
        pos = match.end()
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group()))
    return tokens


def parse_value(text: str) -> Any:
    """Parses one value of the grammar above; raises ConfigError (one line) on anything else."""
    tokens = _tokenize(text)
    if not tokens:
        raise ConfigError("empty value")
    _check_depth(tokens)
    value, pos = _parse(tokens, 0)
    if pos != len(tokens):
        raise ConfigError(f"unexpected {tokens[pos][1]!r} after the value")
    return value


def _check_depth(tokens: list[tuple[str, str]]) -> None:
    """Brackets nested deeper than MAX_DEPTH are an error (not a RecursionError in the parser)."""
    depth = 0
    for kind, text in tokens:
        if kind == "punct" and text in "[({":
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"brackets nest deeper than {MAX_DEPTH} levels (the limit)")
        elif kind == "punct" and text in "])}":
            depth -= 1


def _parse_string(text: str) -> str:
    """A quoted string token with Python's escapes; an escape Python does not define (``'\\d'``,
    ``'\\777'``, which Python only warns about) is a ConfigError, as is any other bad escape."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # Python's invalid-escape warning becomes the error below
            value = ast.literal_eval(text)  # a single string token: a literal, never code
    except (SyntaxError, ValueError, UnicodeError, MemoryError, Warning) as e:
        reason = getattr(e, "msg", None) or str(e) or type(e).__name__
        hint = " (a backslash itself is written \\\\)" if "escape" in reason else ""
        shown = f"{text[:40]!r}{'...' if len(text) > 40 else ''}"
        raise ConfigError(f"bad string {shown}: {reason}{hint}") from None
    if not isinstance(value, str):
        raise ConfigError(f"{text[:40]!r} is not a string")
    return value


def _parse(tokens: list[tuple[str, str]], pos: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise ConfigError("value ends too early")
    kind, text = tokens[pos]
    if kind == "string":
        return _parse_string(text), pos + 1
    if kind == "number":
        is_float = any(c in text for c in ".eE")
        try:
            return (float(text) if is_float else int(text)), pos + 1
        except ValueError:
            raise ConfigError(f"number {text[:20]}... has too many digits ({len(text)})") from None
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
    raise ConfigError(f"unexpected {text!r}")


def resolve_typeref(text: str) -> Any:
    """Imports the class named by ``type/module.path/Name`` (a module import, never an eval) from a
    module of the project only, checked before it is imported; Lingvo's ``callable/module.path/qualname``
    names a function the same way."""
    module_name, _, attr = text.partition("/")[2].rpartition("/")
    module_name, attr = module_aliases.current(module_name, attr)  # a path written before a move
    try:
        return registry.import_known(module_name, attr)
    except ValueError as e:
        raise ConfigError(f"cannot import {text!r} ({e})") from None


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
    raise ConfigError(f"{text!r} is not a value (strings need quotes)")


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
            raise ConfigError(f"expected ',' or {close!r}")


def _parse_dict(tokens: list[tuple[str, str]], pos: int) -> tuple[dict, int]:
    result = {}
    while True:
        if pos < len(tokens) and tokens[pos][1] == "}":
            return result, pos + 1
        key, pos = _parse(tokens, pos)
        if pos >= len(tokens) or tokens[pos][1] != ":":
            raise ConfigError("expected ':' in a dict")
        value, pos = _parse(tokens, pos + 1)
        try:
            result[key] = value
        except TypeError:
            raise ConfigError(f"dict key {key!r} is not hashable") from None
        if pos < len(tokens) and tokens[pos][1] == ",":
            pos += 1
        elif pos >= len(tokens) or tokens[pos][1] != "}":
            raise ConfigError("expected ',' or '}'")
