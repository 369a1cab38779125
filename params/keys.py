"""Dotted param keys (``task.body.layers[2].dim``): their grammar and limits, and one-line quoting of
user text in messages. Shared by the Params tree (hyperparams.py) and Params text (text_tree.py)."""

from __future__ import annotations

import re

from params.errors import ConfigError

MAX_KEY_CHARS = 500  # a dotted key; longer is an error naming the limit
MAX_INDEX_DIGITS = 9  # list indices in keys: body.layers[2]
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SEGMENT_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def clip(text: str, limit: int = 80) -> str:
    """``repr(text)``, shortened to about ``limit`` characters, for one-line error messages."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def split_key(key: str) -> list[tuple[str, list[int]]]:
    """'a.b[1].c' -> [('a', []), ('b', [1]), ('c', [])]; a malformed key is a ConfigError."""
    if not isinstance(key, str):
        raise ConfigError(f"param key of type {type(key).__name__} is not a string")
    if len(key) > MAX_KEY_CHARS:
        raise ConfigError(f"param key {clip(key)} is longer than {MAX_KEY_CHARS} characters (the limit)")
    segments = []
    for part in key.split("."):
        match = _SEGMENT_RE.match(part.strip())
        if not match:
            raise ConfigError(f"malformed param key {clip(key)}: bad segment {clip(part, 40)}")
        digits = re.findall(r"\[(\d+)\]", match.group(2))
        if any(len(i) > MAX_INDEX_DIGITS for i in digits):
            raise ConfigError(f"param key {clip(key)}: a list index has more than {MAX_INDEX_DIGITS} digits")
        segments.append((match.group(1), [int(i) for i in digits]))
    return segments
