"""Params text on its own: lines as a {key: value text} map, a Params tree built from text alone, and
Lingvo-TextDiff-style differences between two texts.

``Params.from_text(text)`` called on the class (not on an instance) builds its tree from ``nest``, so a
``params.txt`` (this project's or Lingvo's) can be inspected, diffed or instantiated without the
experiment that wrote it: a group with a ``cls : type/module/Name`` line becomes an
``InstantiableParams`` of that class, ``key[i].name`` lines become a list of Params, and each value is
parsed by its own text (to_text writes floats with a point, strings quoted, so nothing is lost). A value
no grammar reads (Lingvo writes unknown objects as their type name) is kept as its text. Docs are not in
the text, so they are empty.
"""

from __future__ import annotations

from typing import Any

from params import module_aliases, text_format
from params.errors import ConfigError
from params.keys import split_key

Lines = dict[str, str]


def parse_lines(text: str, source: str = "params text") -> Lines:
    """``{dotted key: value text}`` of ``key : value`` lines (blank lines and ``#`` comments skipped);
    a class path written before its module moved reads as the path of today (``module_aliases``)."""
    out: Lines = {}
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise ConfigError(f"{source}: line {line_no}: expected 'key : value', got {line!r}")
        key = key.strip()
        try:
            split_key(key)
        except ConfigError as e:
            raise ConfigError(f"{source}: line {line_no}: {e}") from None
        out[key] = module_aliases.upgrade(value.strip())
    return out


def same(a: str, b: str) -> bool:
    """Whether two Params texts say the same: equal lines, once old class paths read as today's."""
    if a == b:
        return True
    try:
        return parse_lines(a) == parse_lines(b)
    except ConfigError:
        return False


def parse_untyped(text: str) -> Any:
    """A value read by its own text; what no grammar reads stays a string."""
    try:
        return text_format.parse_value(text)
    except ValueError:
        return text


def nest(text: str, source: str = "params text") -> dict:
    """The lines of ``text`` as a nested dict: ``{name: ("value", v)}`` for a value, ``{name: {...}}``
    for a group, ``{name: {"[]": {index: {...}}}}`` for a list of groups. ``Params.from_text`` (on the
    class) turns it into a Params tree."""
    tree: dict = {}
    for key, value_text in parse_lines(text, source).items():
        node = tree
        segments = split_key(key)
        for i, (name, indices) in enumerate(segments):
            last = i == len(segments) - 1
            if last and not indices:
                if isinstance(node.get(name), dict):
                    raise ConfigError(f"{source}: {key!r} is both a value and a group of params")
                node[name] = ("value", parse_untyped(value_text))
                break
            child = node.setdefault(name, {}) if not indices else node.setdefault(name, {"[]": {}})
            if not isinstance(child, dict):
                raise ConfigError(f"{source}: {key!r} is both a value and a group of params")
            for index in indices:
                child = child.setdefault("[]", {}).setdefault(index, {})
            node = child
    return tree


def diff(a: Lines, b: Lines) -> list[str]:
    """One line per key, as ``diff`` marks an old and a new file: ``- key : v`` only in a, ``+ key : v``
    only in b, ``< key : old`` and ``> key : new`` where the values differ. Sorted by key; [] when
    equal. (Lingvo's TextDiff marks the other way round: ``lingvo_diff``.)"""
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in b:
            lines.append(f"- {key} : {a[key]}")
        elif key not in a:
            lines.append(f"+ {key} : {b[key]}")
        elif a[key] != b[key]:
            lines.append(f"< {key} : {a[key]}")
            lines.append(f"> {key} : {b[key]}")
    return lines


def lingvo_diff(a: Lines, b: Lines) -> list[str]:
    """Lingvo's TextDiff marks (``a.TextDiff(b)``), one line per key: ``> key : v`` a's value (a key
    only in a, or a's side of a change), ``< key : v`` b's (only in b, or b's side). Sorted by key, a
    change as its ``>`` line then its ``<`` line; [] when equal."""
    lines = []
    for key in sorted(set(a) | set(b)):
        if key in a and (key not in b or a[key] != b[key]):
            lines.append(f"> {key} : {a[key]}")
        if key in b and (key not in a or a[key] != b[key]):
            lines.append(f"< {key} : {b[key]}")
    return lines
