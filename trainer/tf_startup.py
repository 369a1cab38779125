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

``use_system_allocator()`` (the trainer binary calls it before TensorFlow starts) gives freed tensor
memory back to the operating system. Where TensorFlow's oneDNN is on (x86 Linux builds: the default),
its CPU allocator serves every tensor of 256 KiB or more from a BFC pool that grows and never shrinks:
a process's resident memory is then the pool's high-water mark plus its fragmentation, not the
tensors it holds (measured in a stage process of ``tools.benchmark remote``: 170 to 500 MiB over
the 2.5 GiB it held at most, different from run to run). ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1``
makes oneDNN's allocator take every tensor from malloc, which maps large blocks on their own and
unmaps them when they are freed. Set the variable to 0 to keep the pool.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import MutableMapping
from types import ModuleType

SYSTEM_ALLOCATOR_ENV = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"


def use_system_allocator(environ: MutableMapping[str, str] | None = None) -> None:
    """Has TensorFlow's CPU tensors come from malloc (freed memory goes back to the OS) unless the
    user set ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR`` already. Call it before TensorFlow allocates (it reads
    the variable once, at its first tensor); child processes inherit it."""
    (os.environ if environ is None else environ).setdefault(SYSTEM_ALLOCATOR_ENV, "1")


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
