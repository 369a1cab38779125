"""``python -m tools.list_models``: experiment keys, each with its doc line.

    .venv/bin/python -m tools.list_models                           # every experiment under tasks/
    .venv/bin/python -m tools.list_models --module=my_experiments   # the experiments of your module

Without ``--module`` it lists the registered experiments of the project's packages. ``--module=NAME``
imports the module NAME (found like ``python -m`` finds modules: the current directory, then
PYTHONPATH), which runs its code: it is your explicit request to import it. It then lists the
Experiment classes defined in that module, registered or not, by the key ``--model`` takes.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags  # noqa: E402

from params import registry  # noqa: E402
from params.errors import ConfigError  # noqa: E402
from tools import cli  # noqa: E402
from trainer import tf_startup  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "module",
    None,
    "List the experiments of this module instead (e.g. my_experiments, or my_pkg.my_exps): it is imported, "
    "from the current directory or PYTHONPATH, and its code runs.",
)


def module_experiments(name: str) -> dict[str, type]:
    """``{key: class}`` of the Experiment classes defined in module ``name`` (imported here)."""
    from params.experiment import Experiment

    if name.endswith(".py") or not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(f"--module={name}: not a module name (my_exps or my_pkg.my_exps, not a file path)")
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            raise ConfigError(
                f"--module={name}: no such module here; run from the directory that holds it or put that "
                "directory on PYTHONPATH"
            ) from None
        raise ConfigError(f"--module={name}: importing it failed: {e}") from None
    except ConfigError as e:
        raise ConfigError(f"--module={name}: {e}") from None
    except Exception as e:  # noqa: BLE001 (the user's module is broken: say so in one line)
        raise ConfigError(f"--module={name}: importing it failed: {type(e).__name__}: {e}") from None
    return {
        registry.key_for(cls): cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Experiment) and cls is not Experiment and cls.__module__ == module.__name__
    }


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r} (see --help)")
    tf_startup.import_tensorflow()
    if FLAGS.module:
        experiments = module_experiments(FLAGS.module)
    else:
        experiments = {key: registry.get(key) for key in registry.all_keys()}
    width = max((len(k) for k in experiments), default=0)
    for key in sorted(experiments):
        print(f"{key:<{width}}  {registry.doc_line(experiments[key])}")
    if not experiments:
        where = f"module {FLAGS.module}" if FLAGS.module else "the registry"
        print(f"list_models: no experiments in {where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    cli.run_main("list_models", main)
