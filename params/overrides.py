"""Overrides from the command line: Params text, a Params file, and gin bindings.

Every failure is one ConfigError naming the flag (and the key), with limits on what is read:
``MAX_TEXT_CHARS`` per flag or file. Gin is data by default: a gin file or binding may only set the
constructor knobs of registered experiments to literal values, type-checked like ``--params_override``;
``import``, ``include``, ``@references``, ``%macros`` and scopes need ``allow_code=True`` (the binary's
``--gin_allow_code``), under which gin runs as the code it is.
"""

from __future__ import annotations

import inspect
from typing import Any

import gin
from gin import config_parser

from params import registry
from params.errors import ConfigError
from params.hyperparams import Params, clip, coerce_value

MAX_TEXT_CHARS = 1_000_000  # one --params_override, --gin_param, or file


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


def _check_size(text: str, source: str) -> None:
    if len(text) > MAX_TEXT_CHARS:
        raise ConfigError(f"{source}: {len(text)} characters; the limit is {MAX_TEXT_CHARS}")


def apply_params_text(root: Params, text: str, source: str) -> None:
    """Applies ``key : value`` statements; errors name the source (a flag or a file)."""
    _check_size(text, source)
    try:
        root.from_text("\n".join(split_statements(text)))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def read_config_file(path: str, source: str) -> str:
    """The UTF-8 text of a local or ``tf.io.gfile`` file; anything else is one ConfigError."""
    import tensorflow as tf

    try:
        if tf.io.gfile.isdir(path):
            raise ConfigError(f"{source}: cannot read it (a directory, not a file)")
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read(MAX_TEXT_CHARS * 4 + 1)
    except (tf.errors.OpError, OSError) as e:
        missing = isinstance(e, (tf.errors.NotFoundError, FileNotFoundError))
        reason = "no such file" if missing else " ".join(str(getattr(e, "message", e)).split())[:200]
        raise ConfigError(f"{source}: cannot read it ({reason})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x})") from None
    _check_size(text, source)
    return text


def apply_params_file(root: Params, path: str) -> None:
    """Applies a file of ``key : value`` lines (local path or any tf.io.gfile URI)."""
    source = f"--params_file_override={path}"
    text = read_config_file(path, source)
    try:
        root.from_text(text)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def apply_gin(
    files: list[str] | tuple[str, ...], bindings: list[str] | tuple[str, ...], allow_code: bool = False
) -> None:
    """Parses gin files then bindings (bindings win). Any gin failure is one ConfigError line.

    Without ``allow_code`` every statement is checked first (see the module doc) and nothing is bound
    unless all of them pass; nothing is ever imported or called."""
    if not files and not bindings:
        return
    if allow_code:
        try:
            gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
        except Exception as e:  # noqa: BLE001 (gin raises many types; all are configuration errors)
            raise ConfigError(f"gin: {' '.join(str(e).split())[:500]}") from None
        return
    sources = [(f"--gin_file={path}", read_config_file(path, f"--gin_file={path}")) for path in files]
    sources += [(f"--gin_param={clip(text, 60)}", text) for text in bindings]
    checked = []
    for source, text in sources:
        _check_size(text, source)
        checked += _checked_bindings(text, source)
    for binding_key, value in checked:
        gin.bind_parameter(binding_key, value)


class _Reference:
    """What a ``@name`` or ``%name`` parses to: refused unless gin may run code."""

    def __init__(self, kind: str, name: str) -> None:
        self.text = f"{kind}{name}"


class _Delegate(config_parser.ParserDelegate):
    def configurable_reference(self, scoped_configurable_name: str, evaluate: bool) -> _Reference:
        return _Reference("@", scoped_configurable_name + ("()" if evaluate else ""))

    def macro(self, macro_name: str) -> _Reference:
        return _Reference("%", macro_name)


def _parse_gin(text: str, source: str) -> list[Any]:
    try:
        return list(config_parser.ConfigParser(text, _Delegate()))
    except RecursionError:
        raise ConfigError(f"{source}: gin: value nests too deeply") from None
    except Exception as e:  # noqa: BLE001 (tokenize and gin's parser raise many types: all bad syntax)
        message = " ".join(str(getattr(e, "msg", None) or e).split()) or type(e).__name__
        line = getattr(e, "lineno", None)
        where = f" (line {line})" if isinstance(line, int) else ""
        raise ConfigError(f"{source}: gin: {message[:300]}{where}") from None


def _checked_bindings(text: str, source: str) -> list[tuple[str, Any]]:
    """(binding key, value) for each statement of ``text``, or a ConfigError for the first bad one."""
    out = []
    for statement in _parse_gin(text, source):
        if isinstance(statement, config_parser.BlockDeclaration):
            continue
        if isinstance(statement, config_parser.ImportStatement):
            raise ConfigError(
                f"{source}: gin: '{statement.format()}' imports code; gin may only bind experiment "
                "knobs to literal values (--gin_allow_code trusts gin files as code)"
            )
        if isinstance(statement, config_parser.IncludeStatement):
            raise ConfigError(
                f"{source}: gin: 'include {clip(statement.filename, 60)}' is not allowed; pass each file "
                "with --gin_file (or trust gin files as code with --gin_allow_code)"
            )
        if not isinstance(statement, config_parser.BindingStatement):
            raise ConfigError(f"{source}: gin: unsupported statement {type(statement).__name__}")
        out.append(_checked_binding(statement, source))
    return out


def _checked_binding(statement: config_parser.BindingStatement, source: str) -> tuple[str, Any]:
    name = f"{statement.selector}.{statement.arg_name}"
    if statement.scope:
        raise ConfigError(
            f"{source}: gin: scope {clip(statement.scope, 40)} in {clip(name, 60)}: scopes are "
            "not used by experiments (--gin_allow_code allows full gin)"
        )
    if not statement.arg_name:
        raise ConfigError(
            f"{source}: gin: {clip(statement.selector, 60)} = ... defines a macro; only experiment knobs "
            "(Experiment.knob = value) can be bound (--gin_allow_code allows full gin)"
        )
    key, cls = _experiment_for(statement.selector, source)
    reference = _find_reference(statement.value)
    if reference is not None:
        raise ConfigError(
            f"{source}: gin: {name} = {clip(reference.text, 60)}: references run code; only literal "
            "values are allowed (--gin_allow_code trusts gin files as code)"
        )
    parameters = _knobs(cls)
    knobs = list(parameters)
    if statement.arg_name not in knobs:
        raise ConfigError(
            f"{source}: gin: {cls.__name__} has no knob {clip(statement.arg_name, 60)}; its knobs: "
            f"{', '.join(knobs) or 'none'}"
        )
    default = parameters[statement.arg_name].default
    current = None if default is inspect.Parameter.empty else default
    try:
        value = coerce_value(name, statement.value, current)
    except ConfigError as e:
        raise ConfigError(f"{source}: gin: {e}") from None
    return f"{key}.{statement.arg_name}", value


def _knobs(cls: type) -> dict[str, inspect.Parameter]:
    """The constructor arguments of ``cls``, following ``**kwargs`` into its bases' constructors."""
    knobs: dict[str, inspect.Parameter] = {}
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        try:
            parameters = list(inspect.signature(klass.__init__).parameters.values())[1:]
        except (TypeError, ValueError):
            break
        for p in parameters:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                knobs.setdefault(p.name, p)
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return knobs


def _experiment_for(selector: str, source: str) -> tuple[str, type]:
    matches = [key for key in registry.all_keys() if key == selector or key.endswith("." + selector)]
    if len(matches) == 1:
        return matches[0], registry.get(matches[0])
    if not matches:
        raise ConfigError(
            f"{source}: gin: {clip(selector, 60)} is not a registered experiment; gin binds only "
            "experiment knobs, like ConvNet.num_layers (--gin_allow_code allows full gin)"
        )
    raise ConfigError(f"{source}: gin: {clip(selector, 60)} is ambiguous: {', '.join(matches[:5])}")


def _find_reference(value: Any, depth: int = 0) -> _Reference | None:
    if isinstance(value, _Reference):
        return value
    if depth > 100:
        return None
    if isinstance(value, dict):
        items = list(value.keys()) + list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    for item in items:
        found = _find_reference(item, depth + 1)
        if found is not None:
            return found
    return None
