"""Hierarchical Params: the one description of every model, task, input and job setting.

Lingvo's concepts with PEP 8 names. A Params holds named values, each defined once with a default and
a doc string; values may be nested Params or lists of Params (a key like ``body.layers[2].dim`` reaches
into a list). ``to_text()`` writes Lingvo's format (sorted ``dotted.key : value`` lines) and
``from_text()`` reads it back, typed by the value already there and without ever calling ``eval``.
"""

from __future__ import annotations

import copy as copy_lib
import difflib
from collections.abc import Iterator
from typing import Any

from params import registry, text_format, text_tree
from params.errors import ConfigError
from params.keys import MAX_KEY_CHARS, NAME_RE, clip, split_key

__all__ = ["MAX_KEY_CHARS", "InstantiableParams", "Params", "clip", "coerce_value", "parse_typed"]


class UnknownParamError(ConfigError, AttributeError):
    """A key that is not defined; the message names it and its closest known keys."""


class FrozenParamsError(TypeError):
    """A write to Params after ``freeze()``."""


DTYPE = "dtype"  # ``value_type`` of a param holding a TensorFlow dtype (or its name)
VALUE_TYPES = (bool, int, float, str, list, tuple, dict, type, DTYPE)  # and Params: a group


class _Param:
    """One param: its value, doc, and the value a set value is checked against (``proto``): the
    default, or for a None default a stand-in of its declared ``value_type``."""

    __slots__ = ("value", "doc", "proto")

    def __init__(self, value: Any, doc: str, proto: Any) -> None:
        self.value = value
        self.doc = doc
        self.proto = proto


class _Group:
    """``proto`` of a param holding a group of params (a Params, or a list of them)."""


_GROUP = _Group()


class _AnyOf:
    """``proto`` of a param declared with a tuple of value types: a value of any of them."""

    def __init__(self, protos: list[Any]) -> None:
        self.protos = protos


_DTYPE_PROTO = object()  # ``proto`` of a dtype param whose default is None


def _kinds(proto: Any) -> tuple[str, ...]:
    if proto is None:
        return ()
    if isinstance(proto, _AnyOf):
        return tuple(k for p in proto.protos for k in _kinds(p))
    if proto is _GROUP:
        return ("group",)
    if proto is _DTYPE_PROTO or text_format.is_dtype(proto):
        return ("dtype",)
    if isinstance(proto, type):
        return ("class",)
    return (type(proto).__name__,)


def _proto(name: str, default: Any, value_type: Any) -> Any:
    """What values of this param are checked against; ``value_type`` declares it for a None default."""
    if default is not None:
        return _GROUP if isinstance(default, Params) or _is_params_list(default) else default
    if value_type is None:
        return None
    if isinstance(value_type, tuple):  # one of several types, e.g. (dict, list)
        return _AnyOf([_proto(name, None, t) for t in value_type])
    if isinstance(value_type, type) and issubclass(value_type, Params):
        return _GROUP
    if value_type == DTYPE:
        return _DTYPE_PROTO
    if value_type is type:
        return object  # any class: the family check has nothing to compare with
    if value_type in VALUE_TYPES:
        return value_type()
    raise ConfigError(
        f"param {name!r}: value_type must be one of bool, int, float, str, list, tuple, "
        f"dict, type, Params or {DTYPE!r}, not {value_type!r}"
    )


def _is_params_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(v, Params) for v in value)


class _ClassBuildsFromText:
    """``p.from_text(text)`` sets values of an existing tree; ``Params.from_text(text)``, on the class,
    builds a new tree from the text alone (``build_from_text``: Lingvo's params.txt too)."""

    def __init__(self, method: Any) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    def __get__(self, instance: Any, owner: type) -> Any:
        if instance is None:
            return build_from_text
        return self._method.__get__(instance, owner)


class Params:
    """A tree of named, documented settings.

    ``p.define('dim', 128, 'Width of the layer.')`` then ``p.dim = 256`` or
    ``p.set(**{'body.dim': 256})``. Unknown names raise with a suggestion; after ``freeze()`` every write
    raises. ``copy()`` is deep and returns an unfrozen copy.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_frozen", False)

    # ----------------------------------------------------------------------------------- definition
    def define(self, name: str, default: Any, doc: str, *, value_type: Any = None) -> None:
        """Adds a new param ``name`` with a default value and a one-line description.

        A value set later from text (overrides, params files, task_overrides) must have the default's
        type; for a None default, ``value_type`` declares it (int, str, list, Params, ``DTYPE``, ...),
        so that None params are checked too. Without it a None param takes any value."""
        self._check_not_frozen(name)
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(f"invalid param name {name!r}: use letters, digits and underscores")
        if hasattr(type(self), name):
            raise ConfigError(f"invalid param name {name!r}: it is a Params method")
        if name in self._params:
            raise ConfigError(f"param {name!r} is already defined")
        if not isinstance(doc, str):
            raise ConfigError(f"param {name!r} needs a doc string")
        self._params[name] = _Param(default, doc, _proto(name, default, value_type))

    # ------------------------------------------------------------------------------ attribute access
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        params = self.__dict__["_params"]
        if name not in params:
            if name in LINGVO_METHODS:
                raise UnknownParamError(_lingvo_method_message(type(self).__name__, name))
            raise self._unknown(name, list(params))
        return params[name].value

    def __setattr__(self, name: str, value: Any) -> None:
        self._check_not_frozen(name)
        if name not in self._params:
            pointer = _lingvo_param_pointer(self, name)
            if pointer:
                raise UnknownParamError(f"unknown param {clip(name)}: {pointer}")
            raise self._unknown(name, list(self._params))
        self._params[name].value = value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._params))

    def __contains__(self, key: str) -> bool:
        try:
            self.get(key)
        except (ConfigError, IndexError):
            return False
        return True

    def names(self) -> list[str]:
        """The names defined directly on this Params (not nested), sorted."""
        return sorted(self._params)

    def get_doc(self, key: str) -> str:
        """The doc string of a (dotted) key."""
        parent, name = self._resolve_parent(key)
        return parent._params[name].doc

    def declared_kinds(self, key: str) -> tuple[str, ...]:
        """The kinds of value ``key`` takes, by name (``('int',)``, ``('dict', 'list')``, ``('dtype',)``,
        ``('class',)``, ``('group',)``); () when unchecked (a None default without ``value_type``)."""
        return _kinds(self.declared(key))

    def declared(self, key: str) -> Any:
        """What a value set at ``key`` is checked against when the value there now is None: its
        default, or a stand-in of its declared ``value_type`` (None: unchecked)."""
        parent, name = self._resolve_parent(key)
        return parent._params[name].proto

    # ---------------------------------------------------------------------------------- dotted keys
    def get(self, key: str) -> Any:
        """The value at a dotted key such as ``'task.train.learning_rate'`` or ``'body.layers[1].dim'``."""
        parent, name = self._resolve_parent(key)
        return parent._params[name].value

    def set(self, **kwargs: Any) -> Params:
        """Sets values by dotted key: ``p.set(**{'train.learning_rate': 0.1}, name='x')``. Returns self."""
        for key, value in kwargs.items():
            parent, name = self._resolve_parent(key)
            parent._check_not_frozen(key)
            parent._params[name].value = value
        return self

    def delete(self, *keys: str) -> Params:
        """Removes the params at these dotted keys (Lingvo's ``Delete``). Returns self."""
        for key in keys:
            parent, name = self._resolve_parent(key)
            parent._check_not_frozen(key)
            del parent._params[name]
        return self

    def iter_params(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of the params defined directly on this Params, in definition order (Lingvo's
        ``IterParams``; ``iter(p)`` instead walks every leaf by dotted key)."""
        return ((name, param.value) for name, param in self._params.items())

    def _resolve_parent(self, key: str) -> tuple[Params, str]:
        segments = split_key(key)
        node: Params = self
        walked = ""
        for i, (name, indices) in enumerate(segments):
            if name not in node._params:
                pointer = _lingvo_param_pointer(node, name)
                if pointer:
                    raise UnknownParamError(f"unknown param {clip(key)}: {pointer}")
                raise self._unknown(key, self._all_keys(), local=(walked, name, node.names()))
            if i == len(segments) - 1 and not indices:
                return node, name
            value = node._params[name].value
            walked += ("." if walked else "") + name
            for index in indices:
                if not isinstance(value, (list, tuple)) or index >= len(value):
                    size = len(value) if isinstance(value, (list, tuple)) else "no"
                    raise ConfigError(f"param key {key!r}: {walked!r} has {size} elements")
                value = value[index]
                walked += f"[{index}]"
            if not isinstance(value, Params):
                raise ConfigError(f"param key {key!r}: {walked!r} is a value, not a group of params")
            node = value
        raise ConfigError(f"param key {key!r} names a group of params, not a value")

    def _all_keys(self) -> list[str]:
        keys = []
        for key, _ in self._walk("", include_groups=True):
            keys.append(key)
        return keys

    def _unknown(
        self, key: str, candidates: list[str], local: tuple[str, str, list[str]] | None = None
    ) -> UnknownParamError:
        matches = difflib.get_close_matches(key, candidates, n=3, cutoff=0.75)
        if local is not None and not matches:
            prefix, name, siblings = local
            matches = [
                (prefix + "." if prefix else "") + m
                for m in difflib.get_close_matches(name, siblings, n=3, cutoff=0.75)
            ]
        hint = f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
        return UnknownParamError(f"unknown param {clip(key)}{hint}")

    # ------------------------------------------------------------------------------------ iteration
    def _walk(self, prefix: str, include_groups: bool = False) -> Iterator[tuple[str, Any]]:
        for name in sorted(self._params):
            value = self._params[name].value
            key = prefix + name
            if isinstance(value, Params):
                if include_groups:
                    yield key, value
                yield from value._walk(key + ".", include_groups)
            elif _is_params_list(value):
                if include_groups:
                    yield key, value
                for i, item in enumerate(value):
                    yield from item._walk(f"{key}[{i}].", include_groups)
            else:
                yield key, value

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """Yields (dotted key, value) for every leaf, sorted by key."""
        return self._walk("")

    # ------------------------------------------------------------------------------ copy and freeze
    def copy(self) -> Params:
        """A deep, unfrozen copy."""
        new = object.__new__(type(self))
        object.__setattr__(new, "_params", {})
        object.__setattr__(new, "_frozen", False)
        for name, param in self._params.items():
            new._params[name] = _Param(_copy_value(param.value), param.doc, param.proto)
        return new

    def __deepcopy__(self, memo: dict) -> Params:
        return self.copy()

    def freeze(self) -> Params:
        """Makes this Params and everything nested in it read-only. Returns self."""
        object.__setattr__(self, "_frozen", True)
        for param in self._params.values():
            if isinstance(param.value, Params):
                param.value.freeze()
            elif _is_params_list(param.value):
                for item in param.value:
                    item.freeze()
        return self

    @property
    def is_frozen(self) -> bool:
        return self._frozen

    def _check_not_frozen(self, name: str) -> None:
        if self.__dict__["_frozen"]:
            raise FrozenParamsError(f"cannot set {name!r}: the Params are frozen")

    # ---------------------------------------------------------------------------------------- text
    def to_text(self) -> str:
        """Lingvo's text format: one sorted ``dotted.key : value`` line per leaf."""
        return "".join(f"{key} : {text_format.format_value(value)}\n" for key, value in self)

    @_ClassBuildsFromText
    def from_text(self, text: str) -> Params:
        """Sets values from ``key : value`` lines (``#`` comments and blank lines are skipped).

        Each value is parsed by the type of the value already there; every line is checked before
        any is applied, so a bad line changes nothing. Returns self.
        """
        updates = {}
        for line_no, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            if ":" not in line:
                raise ConfigError(f"line {line_no}: expected 'key : value', got {clip(line)}")
            key, value_text = (part.strip() for part in line.split(":", 1))
            current = self.get(key)
            updates[key] = parse_typed(key, value_text, current, self.declared(key))
        for key in updates:
            self._resolve_parent(key)[0]._check_not_frozen(key)
        return self.set(**updates)

    def text_diff(self, other: Params) -> str:
        """Lines ``- key : value`` (only or different in self) and ``+ key : value`` (in other)."""
        mine, theirs = dict(self), dict(other)
        lines = []
        for key in sorted(set(mine) | set(theirs)):
            in_mine, in_theirs = key in mine, key in theirs
            if in_mine and in_theirs and _values_equal(mine[key], theirs[key]):
                continue
            if in_mine:
                lines.append(f"- {key} : {text_format.format_value(mine[key])}")
            if in_theirs:
                lines.append(f"+ {key} : {text_format.format_value(theirs[key])}")
        return "\n".join(lines) + ("\n" if lines else "")

    # ------------------------------------------------------------------------------------ equality
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Params):
            return NotImplemented
        if set(self._params) != set(other._params):
            return False
        return all(_values_equal(self._params[n].value, other._params[n].value) for n in self._params)

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__}(\n{self.to_text()})"


class InstantiableParams(Params):
    """Params that know the class they configure: ``p.instantiate()`` is ``p.cls(p)``."""

    def __init__(self, cls: type | None = None) -> None:
        super().__init__()
        self.define("cls", cls, "The class these params build.", value_type=type)

    def instantiate(self, *args: Any, **kwargs: Any) -> Any:
        if self.cls is None:
            raise ConfigError("cannot instantiate params whose 'cls' is None")
        return self.cls(self, *args, **kwargs)


# Lingvo's Params method names -> this project's; p.Define(...) names the method to use instead of
# failing as an unknown param 'Define'. params/lingvo_compat.py gives Params with Lingvo's names.
LINGVO_METHODS = {
    "Define": "define",
    "Set": "set",
    "Get": "get",
    "Delete": "delete",
    "Copy": "copy",
    "Freeze": "freeze",
    "IsImmutable": "is_frozen",
    "ToText": "to_text",
    "FromText": "from_text",
    "TextDiff": "text_diff",
    "IterParams": "iter_params",
    "GetKeys": "names",
    "Instantiate": "instantiate",
}


def _lingvo_param_pointer(p: Params, name: str) -> str | None:
    """For a param Lingvo's version of ``p``'s class has and this one names otherwise: the class's
    ``LINGVO_PARAMS[name]``, a line naming the equivalent here."""
    entry = p.__dict__["_params"].get("cls")
    pointers = getattr(entry.value, "LINGVO_PARAMS", None) if entry is not None else None
    if isinstance(pointers, dict) and name in pointers:
        return f"{name!r} is Lingvo's name; here {pointers[name]}"
    return None


def _lingvo_method_message(class_name: str, name: str) -> str:
    snake = LINGVO_METHODS[name]
    call = f"p.{snake}" if snake == "is_frozen" else f"p.{snake}(...)"
    return (
        f"{class_name} has no method {name!r}: this project's Params use snake_case names ({call}); "
        "for Lingvo's names build them with 'from params import lingvo_compat as hyperparams'"
    )


def build_from_text(text: str, source: str = "params text") -> Params:
    """A Params tree holding exactly the values of ``text`` (``params.text_tree`` says how it is read):
    a group with a ``cls : type/module/Name`` line is an InstantiableParams of that class, and its
    bool, int, float and str values are checked against that class's defaults (ConfigError: 2.5 for
    an int, 'four' for a number)."""
    return _from_tree(text_tree.nest(text, source), source)


_SCALARS = (bool, int, float, str)


def _check_against_class(p: InstantiableParams, source: str, prefix: str) -> None:
    """``p``'s scalar values, each of its class's default's type (ints taken as floats)."""
    make = getattr(p.cls, "Params", None)
    if not callable(make):
        return
    try:
        defaults = make()
    except Exception:  # noqa: BLE001 (a class whose Params() needs more than itself: nothing to check)
        return
    if not isinstance(defaults, Params):
        return
    for name, param in p._params.items():
        if name == "cls" or name not in defaults._params or param.value is None:
            continue
        default = defaults._params[name].value
        if default is None:
            default = defaults._params[name].proto
        if type(default) in _SCALARS:
            try:
                param.value = coerce_value(prefix + name, param.value, default)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None


def _from_tree(tree: dict, source: str, prefix: str = "") -> Params:
    cls_entry = tree.get("cls")
    if isinstance(cls_entry, tuple) and isinstance(cls_entry[1], type):
        p: Params = InstantiableParams(cls_entry[1])
    else:
        p = Params()
    for name in sorted(tree):
        entry = tree[name]
        if name == "cls" and isinstance(p, InstantiableParams):
            continue
        if isinstance(entry, tuple):
            value = entry[1]
        elif "[]" in entry:
            items = entry["[]"]
            if sorted(items) != list(range(len(items))):
                raise ConfigError(f"{source}: {name!r} lists elements {sorted(items)}, not 0..n-1")
            value = [_from_tree(items[i], source, f"{prefix}{name}[{i}].") for i in range(len(items))]
        else:
            value = _from_tree(entry, source, f"{prefix}{name}.")
        p.define(name, value, "")
    if isinstance(p, InstantiableParams):
        _check_against_class(p, source, prefix)
    return p


def _copy_value(value: Any) -> Any:
    if isinstance(value, Params):
        return value.copy()
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copy_value(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, type) or callable(value):
        return value
    try:
        return copy_lib.deepcopy(value)
    except TypeError:
        return value


def _values_equal(a: Any, b: Any) -> bool:
    if isinstance(a, Params) and isinstance(b, Params):
        return a == b  # by content: a tree built through params.lingvo_compat equals the native one
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN == NaN for settings
    try:
        return bool(a == b) and type(a) is type(b)
    except (TypeError, ValueError):
        return a is b


# ---------------------------------------------------------------------------------------- parsing
def parse_typed(key: str, text: str, current: Any, declared: Any = None) -> Any:
    """Parses ``text`` for the param ``key`` whose current value is ``current`` (``declared``: what it
    is checked against when ``current`` is None, ``Params.declared``).

    A str param takes any text: quoted it is unquoted, unquoted it is kept verbatim (so code stays a
    string). Other params take only a literal of a compatible type; anything else is a ConfigError.
    """
    if current is None and declared is not None:
        if text.strip() in ("None", "NoneType"):
            return None
        current = declared
    if isinstance(current, Params) or _is_params_list(current):
        raise ConfigError(f"param {key!r} is a group of params: set its fields, like '{key}.name'")
    if isinstance(current, str):
        try:
            parsed = text_format.parse_value(text)
        except ValueError as e:
            if (
                text[:1] and text[:1] in "'\""
            ):  # meant as a quoted string: an unterminated quote or a bad escape
                raise ConfigError(f"param {key!r}: cannot parse {clip(text)} ({e})") from None
            return text
        return parsed if isinstance(parsed, str) else text
    try:
        parsed = text_format.parse_value(text)
    except ValueError as e:
        if isinstance(current, type) and text.startswith("type/"):
            raise ConfigError(f"param {key!r}: {e}") from None
        raise ConfigError(f"param {key!r}: cannot parse {clip(text)} ({e})") from None
    return _coerce(key, text, parsed, current)


def _coerce(key: str, text: str, parsed: Any, current: Any) -> Any:
    return coerce_value(key, parsed, current, shown=text)


def coerce_value(key: str, value: Any, current: Any, shown: str | None = None, declared: Any = None) -> Any:
    """``value`` (already parsed: a gin binding, a task_overrides entry) checked against the type of
    the param's ``current`` value, as ``--params_override`` checks text; returns it, converted where
    that is lossless (int -> float, list -> tuple, a class path or dtype name -> the class or dtype).
    ``shown`` is the user's text for the message; ``declared`` is checked against when ``current`` is
    None (``Params.declared``). Raises ConfigError."""
    if current is None:
        current = declared
    if current is None or value is None:
        return value
    if isinstance(current, _AnyOf):
        errors = []
        for proto in current.protos:
            try:
                return coerce_value(key, value, proto, shown)
            except ConfigError as e:
                errors.append(str(e).split(": expected ", 1)[-1].split(", got ")[0])
        text = shown if shown is not None else _format_for_message(value)
        raise ConfigError(f"param {key!r}: expected {' or '.join(errors)}, got {clip(text)}")
    expected = None
    if current is _GROUP:
        expected = "a group of params (set its fields, like 'KEY.name')".replace("KEY", key)
    elif current is _DTYPE_PROTO:
        if text_format.is_dtype(value):
            return value
        if text_format.is_dtype_name(value):
            return text_format.parse_value(value)
        expected = "a dtype such as float32"
    elif isinstance(current, bool):
        if isinstance(value, bool):
            return value
        expected = "a bool (True or False)"
    elif isinstance(current, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        expected = "an int"
    elif isinstance(current, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:  # an int past a float's range (10**400)
                expected = "a float (this int is past a float's range)"
        else:
            expected = "a float"
    elif isinstance(current, str):
        if isinstance(value, str):
            return value
        expected = "a string"
    elif isinstance(current, type):
        if isinstance(value, str):
            value = import_symbol(key, value)
        if isinstance(value, type):
            return _check_class_family(key, value, current)
        expected = "a class (type/module/Name)"
    elif text_format.is_dtype(current):
        if text_format.is_dtype(value):
            return value
        if text_format.is_dtype_name(value):
            return text_format.parse_value(value)
        expected = "a dtype such as float32"
    elif isinstance(current, (list, tuple)):
        if isinstance(value, (list, tuple)):
            _check_elements(key, value, current, shown)
            return type(current)(value)
        expected = "a list" if isinstance(current, list) else "a tuple"
    elif isinstance(current, dict):
        if isinstance(value, dict):
            return value
        expected = "a dict"
    else:
        return value
    text = shown if shown is not None else _format_for_message(value)
    raise ConfigError(f"param {key!r}: expected {expected}, got {clip(text)}")


def _format_for_message(value: Any) -> str:
    try:
        return text_format.format_value(value)
    except Exception:  # noqa: BLE001 (only for a message; any object may be passed)
        return type(value).__name__


def _check_elements(key: str, value: Any, current: Any, shown: str | None) -> None:
    """A list whose default holds only ints (floats, strings, bools) takes only those (and None)."""
    kinds = {type(v) for v in current}
    if len(kinds) != 1 or next(iter(kinds)) not in (bool, int, float, str):
        return
    kind = next(iter(kinds))
    for i, item in enumerate(value):
        if item is None:
            continue
        if kind is float and isinstance(item, int) and not isinstance(item, bool):
            continue
        if type(item) is not kind:
            text = shown if shown is not None else _format_for_message(value)
            raise ConfigError(f"param {key!r}: element {i} should be {kind.__name__}, got {clip(text)}")


def _class_family(cls: type) -> type | None:
    """The most general class of the project package ``cls`` first descends from: BaseLayer for a
    layer, BaseTask for a task, BaseInput for an input, Params for Params. None outside the project."""
    packages = registry.TRUSTED_PACKAGES
    first = next((c for c in cls.__mro__ if c.__module__.split(".")[0] in packages), None)
    if first is None:
        return None
    package = first.__module__.split(".")[0]
    return [c for c in cls.__mro__ if c.__module__.split(".")[0] == package][-1]


def _check_class_family(key: str, value: type, current: type) -> type:
    family = _class_family(current)
    if family is not None and not issubclass(value, family):
        raise ConfigError(
            f"param {key!r}: {value.__module__}.{value.__qualname__} is not a {family.__name__} "
            f"(the class there now is {current.__module__}.{current.__qualname__})"
        )
    return value


def import_symbol(key: str, path: str) -> Any:
    """Imports 'pkg.module.Name' or 'type/pkg.module/Name' from a module of the project only
    (``registry.is_known_module``, checked before the import)."""
    if path.startswith("type/"):
        module_name, _, attr = path[len("type/") :].rpartition("/")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"param {key!r}: {clip(path)} is not an importable 'module.Name'")
    try:
        return registry.import_known(module_name, attr)
    except ValueError as e:
        raise ConfigError(f"param {key!r}: cannot import {clip(path)} ({e})") from None
