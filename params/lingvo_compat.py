"""Lingvo's ``hyperparams`` API over this project's Params, for code carried over from Lingvo.

    from params import lingvo_compat as hyperparams   # instead of: from lingvo.core import hyperparams

    p = hyperparams.InstantiableParams(MyClass)
    p.Define('dim', 8, 'Width.')
    p.Set(**{'dim': 16})
    obj = p.Instantiate()

``hyperparams.Params()`` and ``hyperparams.InstantiableParams(cls)`` are subclasses of the project's
Params (``params.hyperparams``), so anything here takes them, their text is the project's text, and they
compare equal to the same tree built natively. They add Lingvo's method names with Lingvo's semantics:
``Define``, ``Set`` (dotted keys, returns self), ``Get``, ``Delete``, ``Copy`` (keeps a frozen copy
frozen), ``Freeze``, ``IsImmutable``, ``IterParams`` and ``GetKeys`` (the Params' own names, in
definition order), ``ToText`` (``include_types`` too), ``FromText`` (returns self), ``TextDiff``
(Lingvo's marks: ``>`` this side, ``<`` the other, ``?`` a group that differs, nested groups indented)
and ``Instantiate(**kwargs)``; ``str(p)`` is Lingvo's nested ``{ name: value }`` form. Module-level:
``CopyFieldsTo``.

What stays this project's (docs/lingvo.md): ``FromText`` reads values without ``eval`` and imports a
``type/`` value's class only from the project's packages; ``Freeze`` freezes nested Params too; errors
are this project's one-line ConfigErrors (unknown keys are also AttributeErrors, writes to frozen
Params TypeErrors, as in Lingvo).

A Params put into a tree built here (``Define``, ``Set``, ``p.x = ...``) or read from it gets Lingvo's
names as well (the same object, its class switched to the matching class of this module); ``adopt(p)``
does that for a tree built elsewhere, such as ``SomeLayer.Params()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from params import hyperparams
from params.errors import ConfigError


def adopt(value: Any) -> Any:
    """``value`` with Lingvo's method names: a Params (or each Params in a list or tuple) is the same
    object with its class switched from ``params.hyperparams.Params`` / ``InstantiableParams`` to this
    module's. The Params nested in it get the names when they are read through it. Anything else is
    returned as it is."""
    if isinstance(value, (list, tuple)):
        for item in value:
            adopt(item)
    else:
        target = _COMPAT_CLASS.get(type(value))
        if target is not None:
            object.__setattr__(value, "__class__", target)  # same layout: only the methods change
    return value


class Params(hyperparams.Params):
    """The project's Params with Lingvo's method names (see the module doc)."""

    def __getattr__(self, name: str) -> Any:
        return adopt(super().__getattr__(name))

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, adopt(value))

    def __str__(self) -> str:
        return _nested_text(self, 0)

    def Define(self, name: str, default_value: Any, description: str) -> None:
        """Adds a param ``name`` with a default value and a description."""
        self.define(name, adopt(default_value), description)

    def Set(self, **kwargs: Any) -> Params:
        """Sets values by (dotted) name: ``p.Set(**{'train.learning_rate': 0.1})``. Returns self."""
        return self.set(**{key: adopt(value) for key, value in kwargs.items()})

    def Get(self, name: str) -> Any:
        """The value at a (dotted) name."""
        return adopt(self.get(name))

    def Delete(self, *args: str) -> Params:
        """Removes the params at these (dotted) names. Returns self."""
        return self.delete(*args)

    def Copy(self) -> Params:
        """A deep copy; a copy of frozen Params is frozen, as in Lingvo."""
        result = self.copy()
        return result.freeze() if self.is_frozen else result

    def Freeze(self) -> None:
        """Makes these Params (and every Params nested in them) read-only."""
        self.freeze()

    def IsImmutable(self) -> bool:
        return self.is_frozen

    def IterParams(self) -> Iterator[tuple[str, Any]]:
        """(name, value) of this Params' own params, in definition order."""
        return ((name, adopt(value)) for name, value in self.iter_params())

    def GetKeys(self) -> list[str]:
        """This Params' own names, in definition order."""
        return [name for name, _ in self.iter_params()]

    def ToText(self, include_types: bool = False) -> str | tuple[str, dict[str, str]]:
        """The ``key : value`` text; with ``include_types``, also ``{key: type name}`` of every value."""
        text = self.to_text()
        if not include_types:
            return text
        return text, {key: type(value).__name__ for key, value in self}

    def FromText(self, text: str, type_overrides: dict[str, str] | None = None) -> Params:
        """Sets values from ``key : value`` lines, each read by the type of the value there. Returns self."""
        if type_overrides:
            raise ConfigError(
                "FromText: type_overrides is not supported (values are read by their own text here; "
                "Lingvo's ToTextWithTypes / FromTextWithTypes have no counterpart)"
            )
        self.from_text(text)
        return self

    def TextDiff(self, other: hyperparams.Params) -> str:
        """Lingvo's diff: ``>`` lines hold this side's value, ``<`` the other's, ``?`` opens a nested
        group that differs (indented two more spaces)."""
        return _diff_groups(self, other, " ")


class InstantiableParams(Params, hyperparams.InstantiableParams):
    """Params that know the class they configure: ``p.Instantiate(**kwargs)`` is ``p.cls(p, **kwargs)``."""

    def __init__(self, cls: type | None = None) -> None:
        super().__init__(cls)

    def Instantiate(self, **kwargs: Any) -> Any:
        return self.instantiate(**kwargs)


_COMPAT_CLASS: dict[type, type] = {
    hyperparams.Params: Params,
    hyperparams.InstantiableParams: InstantiableParams,
}


def CopyFieldsTo(from_p: hyperparams.Params, to_p: hyperparams.Params, skip: Any = None) -> Any:
    """Lingvo's helper: copies ``from_p``'s params (Params deep-copied) into ``to_p``, except ``cls``
    and the names in ``skip`` (a name or a list of names). Returns ``to_p``."""
    skipped = {"cls", *([skip] if isinstance(skip, str) else list(skip or []))}
    for name, value in from_p.iter_params():
        if name not in skipped:
            to_p.set(**{name: value.copy() if isinstance(value, hyperparams.Params) else value})
    return to_p


# ------------------------------------------------------------------------------------- text forms
class _SortedDict(dict):
    """Prints its items sorted by key (how Lingvo shows a Params nested in a list or dict)."""

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in sorted(self.items())) + "}"


def _shown(value: Any) -> Any:
    if isinstance(value, hyperparams.Params):
        return _SortedDict({k: _shown(v) for k, v in value.iter_params()})
    if isinstance(value, dict):
        return _SortedDict({k: _shown(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_shown(v) for v in value)
    return value


def _nested_text(p: hyperparams.Params, depth: int) -> str:
    """Lingvo's ``str(params)``: ``{`` one ``name: value`` line per param, sorted, nested indented ``}``."""
    indent = "  " * (depth + 1)
    lines = []
    for name, value in sorted(p.iter_params(), key=lambda item: item[0]):
        if isinstance(value, hyperparams.Params):
            shown = _nested_text(value, depth + 1)
        elif isinstance(value, str):
            shown = f'"{value}"'
        else:
            shown = str(_shown(value))
        lines.append(f"{indent}{name}: {shown}")
    return "{\n" + "\n".join(lines) + "\n" + "  " * depth + "}"


def _text(value: Any) -> str:
    return _nested_text(value, 0) if isinstance(value, hyperparams.Params) else str(value)


# ------------------------------------------------------------------------------------------- diff
def _keys(group: Any) -> list[str]:
    if isinstance(group, hyperparams.Params):
        return [name for name, _ in group.iter_params()]
    return list(group)


def _diff_groups(a: Any, b: Any, spaces: str) -> str:
    a_keys, b_keys = set(_keys(a)), set(_keys(b))
    out = ""
    for key in sorted(a_keys | b_keys):
        if key not in b_keys:
            out += f">{spaces}{key}: {_text(a.get(key))}\n"
        elif key not in a_keys:
            out += f"<{spaces}{key}: {_text(b.get(key))}\n"
        else:
            out += _diff_values(a.get(key), b.get(key), key, spaces)
    return out


def _diff_values(a: Any, b: Any, key: str, spaces: str) -> str:
    if a == b:
        return ""
    groups = (hyperparams.Params, dict)
    if isinstance(a, groups) and isinstance(b, groups):
        return f"?{spaces}{key}:\n" + _diff_groups(a, b, spaces + "  ")
    if _is_sequence(a) and _is_sequence(b):
        out = ""
        for i in range(max(len(a), len(b))):
            key_i = f"{key}[{i}]"
            if i < len(a) and i < len(b):
                out += _diff_values(a[i], b[i], key_i, spaces)
            elif i < len(a):
                out += f">{spaces}{key_i}: {_text(a[i])}\n"
            else:
                out += f"<{spaces}{key_i}: {_text(b[i])}\n"
        return out
    return f">{spaces}{key}: {_text(a)}\n<{spaces}{key}: {_text(b)}\n"


def _is_sequence(value: Any) -> bool:
    if isinstance(value, (str, bytes)):
        return False
    try:
        len(value)
    except TypeError:
        return False
    return True
