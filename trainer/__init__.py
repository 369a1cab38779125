"""The trainer binary and its jobs (controller, trainer, evaler, decoder)."""

import sys

if sys.argv[:1] == ["-m"]:  # python -m trainer: its first instruction (trainer/signals.py says why)
    from trainer import signals

    signals.install_for_binary("trainer", note=signals.TRAINER_NOTE)
