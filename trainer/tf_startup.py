"""Importing TensorFlow in a binary without its native start-up chatter on stderr.

TF 2.21 prints oneDNN and absl-initialization notices from its shared libraries at import time,
before any log level applies, and TF_CPP_MIN_LOG_LEVEL does not reach them. Binaries import TF through
``import_tensorflow()``, which points file descriptor 2 at /dev/null for the import only, so the one
line a user should read (an error) is not buried. Import errors still raise as usual.

It also skips Keras at import. TensorFlow's ``__init__`` imports ``keras.src.optimizers`` eagerly
(to register Keras optimizers for SavedModel loading), which pulls in Keras, scikit-learn and SciPy:
about 1.2 s of CPU in every process (measured here: 3.6 s of user CPU for ``import tensorflow``,
2.5 s without it), and TensorPipe uses none of them. With ``TF_USE_LEGACY_KERAS=1`` TensorFlow
imports ``tf_keras`` there instead and goes on when it is absent; the variable is set for the import
only (and only when neither it is set nor ``tf_keras`` is installed), so ``tf.keras`` in a user's
experiment still resolves to Keras 3 on first use, as it would otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def import_tensorflow() -> ModuleType:
    """Imports and returns ``tensorflow``: native import-time notices silenced, Keras not preloaded."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    skip_keras = "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is None
    if skip_keras:
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

    finally:
        if skip_keras:
            del os.environ["TF_USE_LEGACY_KERAS"]
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
    return tf
