"""The experiment registry: ``@register`` names a class, ``get`` finds it by key.

Key rule: the module path under ``tasks/`` with the ``params`` package dropped, plus the class name, so
``tasks/image/params/digits.py: ConvNet`` is ``image.digits.ConvNet``. A class elsewhere is keyed by its
full path (``my_pkg.my_exps.MyExp``), and any importable experiment class can be named by that path
without registering it.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil

import gin

from params.errors import ConfigError

EXPERIMENTS_PACKAGE = "tasks"

_REGISTRY: dict[str, type] = {}  # the project's one piece of module-level mutable state


def key_for(cls: type) -> str:
    """The registry key of an experiment class."""
    parts = cls.__module__.split(".")
    if parts[0] == EXPERIMENTS_PACKAGE and len(parts) > 1:
        parts = [p for p in parts[1:] if p != "params"]
    return ".".join(parts + [cls.__name__])


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register(cls: type) -> type:
    """Class decorator: registers an experiment under ``key_for(cls)`` and lets gin bind its knobs.

    Gin knows it as ``ClassName`` and, module-qualified, as ``image.digits.ClassName``.
    """
    key = key_for(cls)
    existing = _REGISTRY.get(key)
    if existing is not None and _full_name(existing) != _full_name(cls):
        raise ConfigError(
            f"experiment key {key!r} is registered twice: {_full_name(existing)} and {_full_name(cls)}"
        )
    _REGISTRY[key] = cls
    module = key.rpartition(".")[0] or None
    try:
        gin.configurable(cls.__name__, module=module)(cls)  # decorates cls itself, unlike external_
    except ValueError:
        pass  # the same class re-imported (a reload): gin already knows it
    return cls


def unregister(key: str) -> None:
    """Removes a key (for tests that register throw-away experiments)."""
    _REGISTRY.pop(key, None)


def import_all_experiments(package: str = EXPERIMENTS_PACKAGE) -> None:
    """Imports every ``<package>/<domain>/params/*.py`` module so that their classes register."""
    try:
        root = importlib.import_module(package)
    except ImportError:
        return
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if ".params." in info.name + "." and not info.ispkg:
            importlib.import_module(info.name)


def all_keys() -> list[str]:
    import_all_experiments()
    return sorted(_REGISTRY)


def get(key: str) -> type:
    """The experiment class for ``key``; an unknown key fails listing the closest known keys."""
    if key in _REGISTRY:
        return _REGISTRY[key]
    import_all_experiments()
    if key in _REGISTRY:
        return _REGISTRY[key]
    cls = _import_by_path(key)
    if cls is not None:
        return cls
    matches = difflib.get_close_matches(key, list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
    if not hint and "." in key.rpartition(".")[0]:
        hint = "; a class outside this repo needs its package's directory on PYTHONPATH"
    raise ConfigError(f"unknown model {key!r}{hint} (.venv/bin/python -m tools.list_models lists them all)")


def _import_by_path(key: str) -> type | None:
    module_name, _, attr = key.rpartition(".")
    if not module_name:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return None  # no such module: an unknown key, not a broken one
        raise ConfigError(f"--model={key}: importing {module_name} failed: {e}") from None
    except Exception as e:  # the user's module itself is broken: say so, not "unknown model"
        raise ConfigError(f"--model={key}: importing {module_name} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, attr, None)
    return cls if isinstance(cls, type) else None


def doc_line(cls: type) -> str:
    """The first paragraph of a class's docstring on one line, or ''."""
    paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())
