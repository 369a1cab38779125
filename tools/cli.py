"""What every ``tools.*`` binary does around its ``main``: absl flags whose errors are one line (exit 2),
``--help`` that exits 0, a UserError as ``<name>: error: ...`` with its exit status, and one line for
Ctrl-C (exit 130) or SIGTERM (exit 143). The lines are the same during start-up: ``tools/__init__.py``
installs ``trainer.signals.install_for_binary`` as a tool's first instruction.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from absl import app, flags
from absl import logging as absl_logging

from params.errors import UserError
from trainer import signals

HELP_FLAGS = ("-?", "-h", "--help", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(name: str, argv: list[str]) -> list[str]:
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"{name}: error: {e} (see --help)", file=sys.stderr)
        sys.exit(2)
    except SystemExit:
        if any(arg.split("=")[0] in HELP_FLAGS for arg in argv[1:]):
            sys.exit(0)  # absl exits 1 after printing help; asking for help is not a failure
        raise


def run_main(name: str, main: Callable[[list[str]], int]) -> None:
    """``app.run(main)`` with the project's error conventions."""

    def _main(argv: list[str]) -> None:
        if absl_logging.get_verbosity() == absl_logging.INFO:  # the default: no TensorFlow INFO chatter
            absl_logging.set_verbosity(absl_logging.WARNING)
        try:
            sys.exit(main(argv))
        except UserError as e:
            print(f"{name}: error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)
        except KeyboardInterrupt:
            print(f"{name}: interrupted", file=sys.stderr)
            sys.exit(signals.INTERRUPT_EXIT_CODE)
        except signals.Terminated:
            print(f"{name}: terminated by SIGTERM", file=sys.stderr)
            sys.exit(signals.EXIT_CODE)

    app.run(_main, flags_parser=lambda argv: parse_flags(name, argv))
