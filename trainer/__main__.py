"""``python -m trainer``: the binary in trainer/main.py."""

from absl import flags

from trainer import main

flags.adopt_module_key_flags(main)  # so --helpshort lists the binary's flags
__doc__ = main.__doc__  # noqa: A001 (absl prints the main module's docstring as usage)

main.run()
