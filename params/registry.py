"""The experiment registry: ``@register`` names a class, ``get`` finds it by key.

Key rule: the module path under ``tasks/`` with the ``params`` package dropped, plus the class name, so
``tasks/image/params/digits.py: ConvNet`` is ``image.digits.ConvNet``. A class elsewhere is keyed by its
full path (``my_pkg.my_exps.MyExp``).

A name is resolved against the registry and the *experiment packages* only: ``tasks`` (whose
``*/params/*.py`` modules are imported to register their classes) and the packages a user opts in with
``--experiment_packages=my_pkg`` or ``TENSORPIPE_EXPERIMENT_PACKAGES=my_pkg,other`` (then
``--model=my_pkg.my_exps.MyExp`` imports ``my_pkg.my_exps``). A name outside them imports nothing: its
module's top-level code never runs (docs/experiments.md).
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil

import gin

from params.errors import ConfigError

EXPERIMENTS_PACKAGE = "tasks"
PACKAGES_ENV = "TENSORPIPE_EXPERIMENT_PACKAGES"  # the opt-in: comma-separated package names
# Packages whose classes a ``type/module/Name`` value may name (with the packages of registered
# experiments): configuration is data, so a value never imports a module the project does not know.
TRUSTED_PACKAGES = ("params", "layers", "tasks")

_REGISTRY: dict[str, type] = {}  # the project's one piece of module-level mutable state
_OPTED_IN: list[str] = []  # packages added by a binary's --experiment_packages (part of the registry)


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


def _package_names(text: str, source: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if not all(part.isidentifier() and not part.startswith("__") for part in name.split(".")):
            raise ConfigError(f"{source}: {name[:80]!r} is not a package name (like my_pkg or my_pkg.exps)")
    return names


def add_experiment_packages(
    names: list[str] | tuple[str, ...], source: str = "--experiment_packages"
) -> None:
    """Opts packages in: names under them may be imported to find an experiment class."""
    for name in _package_names(",".join(names), source):
        if name not in _OPTED_IN:
            _OPTED_IN.append(name)


def experiment_packages() -> list[str]:
    """``tasks``, then the packages of ``TENSORPIPE_EXPERIMENT_PACKAGES``, then those added by
    ``add_experiment_packages``: the only packages a ``--model`` name may import."""
    from_env = _package_names(os.environ.get(PACKAGES_ENV, ""), PACKAGES_ENV)
    return list(dict.fromkeys([EXPERIMENTS_PACKAGE, *from_env, *_OPTED_IN]))


def in_experiment_packages(module_name: str) -> bool:
    """Whether ``module_name`` is (under) one of ``experiment_packages()``."""
    return any(module_name == p or module_name.startswith(p + ".") for p in experiment_packages())


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
    module_name = key.rpartition(".")[0]
    if module_name and in_experiment_packages(module_name):
        cls = _import_by_path(key)
        if cls is not None:
            return cls
    matches = difflib.get_close_matches(key[:500], list(_REGISTRY), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
    if not hint and module_name and not in_experiment_packages(module_name):
        package = module_name.split(".")[0]
        package = package if len(package) <= 40 else "PKG"
        hint = (
            f"; nothing outside the experiment packages ({', '.join(experiment_packages()[:5])}) is "
            f"imported: opt in with --experiment_packages={package} (or {PACKAGES_ENV})"
        )
    elif not hint and "." in module_name:
        hint = "; a class outside this repo needs its package's directory on PYTHONPATH"
    shown = repr(key) if len(key) <= 100 else f"{key[:100]!r}... ({len(key)} characters)"
    raise ConfigError(f"unknown model {shown}{hint} (.venv/bin/python -m tools.list_models lists them all)")


def _import_by_path(key: str) -> type | None:
    """The class at a full path under an experiment package (the caller checked that), or None."""
    module_name, _, attr = key.rpartition(".")
    parts = module_name.split(".") if module_name else []
    if not parts or not all(p.isidentifier() and not p.startswith("__") for p in parts + [attr]):
        return None  # not a path of a module (relative, empty or dunder parts): never imported
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


def is_known_module(module_name: str) -> bool:
    """Whether a ``type/`` value may import ``module_name``: a module of the project's packages, of a
    registered experiment's package or of an experiment package (``experiment_packages()``), never a
    ``__main__`` or other dunder module. Checked before any import, so a rejected value runs no
    import-time code."""
    parts = module_name.split(".")
    if not all(part.isidentifier() and not part.startswith("__") for part in parts):
        return False
    packages = set(TRUSTED_PACKAGES) | {cls.__module__.split(".")[0] for cls in _REGISTRY.values()}
    return parts[0] in packages or in_experiment_packages(module_name)


def import_known(module_name: str, attr_path: str) -> object:
    """``module_name.attr_path`` for a known module (see ``is_known_module``); also builtin classes
    such as ``builtins.dict``. Raises ConfigError for anything else, before importing it."""
    attrs = attr_path.split(".")
    if not attr_path or not all(a.isidentifier() and not a.startswith("_") for a in attrs):
        raise ConfigError(f"{attr_path!r} is not a public name")
    if module_name == "builtins":
        import builtins

        obj = getattr(builtins, attr_path, None)
        if len(attrs) == 1 and isinstance(obj, type):
            return obj
        raise ConfigError(f"builtins.{attr_path} is not a builtin class")
    if not is_known_module(module_name):
        raise ConfigError(
            f"module {module_name!r} is not part of this project (only {', '.join(TRUSTED_PACKAGES)}, "
            "the packages of registered experiments and --experiment_packages may be named); "
            "it was not imported"
        )
    try:
        obj = importlib.import_module(module_name)
        for attr in attrs:
            obj = getattr(obj, attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot import {module_name}.{attr_path} ({e})") from None
    return obj


def doc_line(cls: type) -> str:
    """The first paragraph of a class's docstring on one line, or ''."""
    paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split())
