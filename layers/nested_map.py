"""NestedMap: Lingvo's ``py_utils.NestedMap``, a dict whose keys are also attributes.

    from layers.nested_map import NestedMap      # was: from lingvo.core import py_utils; py_utils.NestedMap

    batch = NestedMap(image=images, label=labels)
    batch.weight = tf.ones_like(labels)          # the same as batch['weight'] = ...
    batch.Transform(tf.shape)                    # a NestedMap of the same keys

It is a ``dict`` subclass, so ``tf.nest`` (and with it ``tf.function`` arguments and results and
``tf.data`` elements) takes it as a mapping: flattened in sorted key order, and packed back as a
NestedMap. It is also a TensorFlow ``Trackable``: a checkpoint holds the variables (and NestedMaps,
modules) among its values under their keys, whether the NestedMap is given to ``tf.train.Checkpoint``
or held by a ``tf.Module`` (a layer's ``theta``).

Keys are Python identifiers that are not ``dict`` method names (``NestedMap(keys=1)`` would hide
``keys()``); a bad key is one ``ValueError`` line, a missing attribute an ``AttributeError`` naming the
keys there are.

Lingvo's methods, with Lingvo's meaning: ``Flatten``, ``FlattenItems`` (dotted keys, ``a.b[0].c`` for
list elements), ``Pack``, ``Transform``, ``IsCompatible``, ``Filter``, ``FilterKeyVal``, ``DebugString``,
``VLog``, ``Get`` / ``GetItem`` / ``Set`` (dotted keys), ``DeepCopy``, ``CheckKey``, ``FromNestedDict``,
``ToNestedDict``. Leaves are anything that is not a dict, list or tuple (a NestedMap, dict, list or
tuple nests).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INDEX_RE = re.compile(r"^([^\[]*)((?:\[\d+\])*)$")
_DELETE = object()  # marks a leaf that Filter / FilterKeyVal leaves out


class NestedMap(dict, tf.__internal__.tracking.Trackable):
    """A dict with attribute access and Lingvo's NestedMap methods (see the module doc)."""

    _HAS_DYNAMIC_ATTRIBUTES = True  # for pytype, as Lingvo's
    _RESERVED_KEYS = frozenset(dir(dict))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for key in self.keys():
            NestedMap.CheckKey(key)

    # --------------------------------------------------------------------------- dict + attributes
    def __setitem__(self, key: str, value: Any) -> None:
        NestedMap.CheckKey(key)
        super().__setitem__(key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        # Trackable's bookkeeping (its _self_* fields, its _update_uid property) is not a key.
        if name.startswith("_") and (name.startswith("_self_") or hasattr(type(self), name)):
            object.__setattr__(self, name, value)
        else:
            self.__setitem__(name, value)

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any) -> dict[str, Any]:
        """What a checkpoint holds of it: its values that TensorFlow tracks (variables, NestedMaps,
        modules), under their keys."""
        del save_type, kwargs
        return {
            key: value for key, value in self.items() if isinstance(value, tf.__internal__.tracking.Trackable)
        }

    def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
        """The value a checkpoint's child ``name`` restores into (``_trackable_children``' inverse)."""
        del cached_dependencies
        value = self.get(name)
        return value if isinstance(value, tf.__internal__.tracking.Trackable) else None

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"NestedMap has no attribute {name!r}; its keys: {', '.join(sorted(self)) or 'none'}"
            ) from None

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(
                f"NestedMap has no attribute {name!r}; its keys: {', '.join(sorted(self)) or 'none'}"
            ) from None

    def setdefault(self, key: str, default: Any = None) -> Any:
        NestedMap.CheckKey(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def copy(self) -> NestedMap:
        """A shallow copy, as a NestedMap (``dict.copy`` would give a dict)."""
        return NestedMap(self)

    def __deepcopy__(self, memo: dict) -> NestedMap:
        return NestedMap({key: copy.deepcopy(value, memo) for key, value in self.items()})

    def DeepCopy(self) -> NestedMap:  # noqa: N802 (Lingvo's names, kept on purpose)
        """A copy of the structure (every NestedMap, dict and list new); the leaves are the same objects."""
        return self.Pack(self.Flatten())

    # ----------------------------------------------------------------------------------- keys
    @staticmethod
    def CheckKey(key: Any) -> None:  # noqa: N802
        """Raises ValueError unless ``key`` is an identifier that is not a dict method's name."""
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise ValueError(f"NestedMap key {key!r} is not a Python identifier")
        if key in NestedMap._RESERVED_KEYS:
            raise ValueError(f"NestedMap key {key!r} is the name of a dict method; rename it")

    @staticmethod
    def FromNestedDict(x: Any) -> Any:  # noqa: N802
        """``x`` with every dict in it (nested in dicts, lists and tuples) made a NestedMap."""
        if isinstance(x, dict):
            return NestedMap({key: NestedMap.FromNestedDict(value) for key, value in x.items()})
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(NestedMap.FromNestedDict(value) for value in x)
        return x

    def ToNestedDict(self) -> dict:  # noqa: N802
        """Plain dicts all the way down (lists and tuples kept)."""

        def convert(x: Any) -> Any:
            if isinstance(x, dict):
                return {key: convert(value) for key, value in x.items()}
            if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
                return type(x)(convert(value) for value in x)
            return x

        return convert(self)

    def GetItem(self, key: str) -> Any:  # noqa: N802
        """The value at a dotted key as ``FlattenItems`` writes it (``a.b``, ``a.b[0].c``; ``a.0`` indexes
        a list too). Raises KeyError or IndexError."""
        current: Any = self
        for part in key.split("."):
            match = _INDEX_RE.match(part)
            if match is None:
                raise KeyError(key)
            name, indices = match.groups()
            if isinstance(current, (list, tuple)) and name.isdigit():
                current = current[int(name)]
            elif name:
                current = current[name]
            for index in re.findall(r"\[(\d+)\]", indices):
                current = current[int(index)]
        return current

    def Get(self, key: str, default: Any = None) -> Any:  # noqa: N802
        """``GetItem(key)``, or ``default`` where the key is not there."""
        try:
            return self.GetItem(key)
        except (KeyError, IndexError, TypeError, ValueError):
            return default

    def Set(self, key: str, value: Any) -> None:  # noqa: N802
        """Sets a dotted key, making the NestedMaps on the way that are missing (``a.b.c = value``)."""
        parts = key.split(".")
        current = self
        for part in parts[:-1]:
            if part not in current:
                current[part] = NestedMap()
            current = current[part]
            if not isinstance(current, dict):
                raise ValueError(f"NestedMap.Set({key!r}): {part!r} holds a {type(current).__name__}")
        current[parts[-1]] = value

    # ----------------------------------------------------------------------- structure and leaves
    def _RecursiveMap(self, fn: Callable[[str, Any], Any], flatten: bool = False) -> Any:  # noqa: N802
        """``fn(dotted key, leaf)`` over the leaves in ``tf.nest`` order (sorted keys): their results
        as a list, or packed into this structure with leaves where ``fn`` gave ``_DELETE`` left out
        (and a NestedMap, dict or list that becomes empty that way left out too)."""
        flat: list = []

        def recurse(x: Any, key: str) -> Any:
            if isinstance(x, dict):
                out = type(x)() if isinstance(x, NestedMap) else {}
                for k in sorted(x):
                    value = recurse(x[k], f"{key}.{k}" if key else k)
                    if value is not _DELETE:
                        out[k] = value
                return _DELETE if (key and not out and x) else out
            if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
                items = [recurse(value, f"{key}[{i}]") for i, value in enumerate(x)]
                kept = [value for value in items if value is not _DELETE]
                if not kept and x:
                    return _DELETE
                return type(x)(kept)
            result = fn(key, x)
            if flatten:
                flat.append(result)
            return result

        packed = recurse(self, "")
        if flatten:
            return flat
        return NestedMap() if packed is _DELETE else packed

    def Flatten(self) -> list:  # noqa: N802
        """The leaves, in ``tf.nest.flatten`` order."""
        return self._RecursiveMap(lambda _, v: v, flatten=True)

    def FlattenItems(self) -> list[tuple[str, Any]]:  # noqa: N802
        """``(dotted key, leaf)`` pairs in ``Flatten`` order; list elements are ``key[i]``."""
        return self._RecursiveMap(lambda k, v: (k, v), flatten=True)

    def Pack(self, lst: list) -> NestedMap:  # noqa: N802
        """This structure with its leaves replaced, in ``Flatten`` order, by ``lst``'s items."""
        count = len(self.Flatten())
        if len(lst) != count:
            raise ValueError(f"NestedMap.Pack: {len(lst)} values for a structure of {count} leaves")
        values = iter(lst)
        return self._RecursiveMap(lambda _, __: next(values))

    def Transform(self, fn: Callable[[Any], Any]) -> NestedMap:  # noqa: N802
        """``fn`` applied to every leaf, in this structure."""
        return self._RecursiveMap(lambda _, v: fn(v))

    def IsCompatible(self, other: Any) -> bool:  # noqa: N802
        """Whether ``other`` has the same structure (keys, nesting and list lengths)."""
        if not isinstance(other, dict):
            return False
        mine = [key for key, _ in self.FlattenItems()]
        theirs = [key for key, _ in NestedMap.FromNestedDict(other).FlattenItems()]
        return mine == theirs

    def Filter(self, fn: Callable[[Any], bool]) -> NestedMap:  # noqa: N802
        """The leaves for which ``fn(leaf)`` is true, in this structure (empty groups left out)."""
        return self._RecursiveMap(lambda _, v: v if fn(v) else _DELETE)

    def FilterKeyVal(self, fn: Callable[[str, Any], bool]) -> NestedMap:  # noqa: N802
        """The leaves for which ``fn(dotted key, leaf)`` is true, in this structure."""
        return self._RecursiveMap(lambda k, v: v if fn(k, v) else _DELETE)

    def _ToStrings(self) -> list[str]:  # noqa: N802
        items = self.FlattenItems()
        width = max((len(key) for key, _ in items), default=0)
        return [f"{key:<{width}}    {value}" for key, value in items]

    def DebugString(self) -> str:  # noqa: N802
        """One ``key    value`` line per leaf (dotted keys, aligned), in ``Flatten`` order."""
        return "\n".join(self._ToStrings())

    def VLog(self, level: int | None = None, prefix: str | None = None) -> None:  # noqa: N802
        """Logs ``DebugString``'s lines at absl verbosity ``level`` (None: INFO)."""
        prefix = prefix or "nmap: "
        for line in self._ToStrings():
            if level is None:
                logging.info("%s %s", prefix, line)
            else:
                logging.vlog(level, "%s %s", prefix, line)
