"""Benchmarks that print their figures as JSON lines: ``python -m tools.benchmark NAME [--flags]``.

Each benchmark is a module ``tools/benchmarks/<name>.py`` with ``main(argv) -> int``; both sides of
every ratio are measured in the same run, since these machines are shared and noisy.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from tools import benchmarks
from trainer import tf_startup

# Modules of tools/benchmarks/ that benchmarks import, not benchmarks themselves.
LIBRARIES = ("harness", "lm_family", "model_task", "text_input")
# Benchmarks whose driver only starts and reads processes (each worker imports TensorFlow itself):
# their driver skips the import, about 3 s of CPU per run. The others run TensorFlow in the driver.
PROCESS_ONLY_DRIVERS = ("gpipe", "local", "multiworker", "network", "remote", "schedules")


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name not in LIBRARIES)


def main(argv: list[str]) -> int:
    names = available()
    usage = f"usage: .venv/bin/python -m tools.benchmark {{{','.join(names)}}} [flags]"
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    if argv[1] in ("-h", "--help"):
        print(f"{usage}\n\nEach benchmark's flags (.venv/bin/python -m tools.benchmark NAME --help):")
        tf_startup.import_tensorflow()
        for name in names:
            print(f"\n== {name} ==", flush=True)
            try:
                importlib.import_module(f"tools.benchmarks.{name}").main([name, "--help"])
            except SystemExit:  # argparse exits after printing its help
                pass
            sys.stdout.flush()
        return 0
    if argv[1] not in names:
        print(
            f"benchmark: error: unknown benchmark {argv[1]!r}; choose from {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    if argv[1] not in PROCESS_ONLY_DRIVERS:
        tf_startup.import_tensorflow()
    module = importlib.import_module(f"tools.benchmarks.{argv[1]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
