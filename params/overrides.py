"""Overrides from the command line: Params text, a Params file, and gin bindings."""

from __future__ import annotations

import gin

from params.errors import ConfigError
from params.hyperparams import Params


def split_statements(text: str) -> list[str]:
    """Splits ``'a : 1; b : "x;y"'`` on ``;`` and newlines that are not inside quotes."""
    statements, current, quote, escaped = [], [], None, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\" and quote:
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in ";\n":
            statements.append("".join(current))
            current = []
            continue
        current.append(ch)
    statements.append("".join(current))
    return [s.strip() for s in statements if s.strip()]


def apply_params_text(root: Params, text: str, source: str) -> None:
    """Applies ``key : value`` statements; errors name the source (a flag or a file)."""
    try:
        root.from_text("\n".join(split_statements(text)))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def apply_params_file(root: Params, path: str) -> None:
    """Applies a file of ``key : value`` lines (local path or any tf.io.gfile URI)."""
    import tensorflow as tf

    source = f"--params_file_override={path}"
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            text = f.read()
    except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError, OSError) as e:
        reason = "no such file" if isinstance(e, (tf.errors.NotFoundError, FileNotFoundError)) else e
        raise ConfigError(f"{source}: cannot read it ({reason})") from None
    try:
        root.from_text(text)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def apply_gin(files: list[str] | tuple[str, ...], bindings: list[str] | tuple[str, ...]) -> None:
    """Parses gin files then bindings (bindings win). Any gin failure is one ConfigError line."""
    if not files and not bindings:
        return
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
    except Exception as e:  # gin raises many types; all are configuration errors to the user
        message = " ".join(str(e).split())
        raise ConfigError(f"gin: {message}") from None
