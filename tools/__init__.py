"""The tools.* binaries."""

import sys

if sys.argv[:1] == ["-m"]:  # python -m tools.<name>: its first instruction (trainer/signals.py says why)
    from trainer import signals

    signals.install_for_binary()
