"""Importing TensorFlow in a binary without its native start-up chatter on stderr.

TF 2.21 prints oneDNN and absl-initialization notices from its shared libraries at import time,
before any log level applies, and TF_CPP_MIN_LOG_LEVEL does not reach them. Binaries import TF through
``import_tensorflow()``, which points file descriptor 2 at /dev/null for the import only, so the one
line a user should read (an error) is not buried. Import errors still raise as usual.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def import_tensorflow() -> ModuleType:
    """Imports and returns ``tensorflow`` with native import-time notices silenced."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tf
