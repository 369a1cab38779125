"""How the trainer traces functions, and user errors raised while it does, given back as raised.

``graph_function(fn)`` is ``tf.function(fn)`` without AutoGraph, for every function the trainer
compiles (the training step, eval, decode, preflight). Layers are written as Lingvo's are: control flow
that depends on a tensor's value uses ``tf.cond`` / ``tf.while_loop``, and Python ``if`` / ``for``
only see Python values (settings, shapes, the schedule). AutoGraph would convert every function the
step calls, and that conversion was most of the tracing: one GPipe Transformer LM step (8 layers,
2 stages, 4 micro-batches, remat) took 25.7 s of CPU to trace with it and 11.0 s without. A layer that
branches on a tensor in Python gets one line saying what to write instead.

A layer that finds a bad setting or shape while ``tf.function`` traces it raises ConfigError, but
TensorFlow may re-raise it as a StagingError with a staging trace; the binary would then print a
traceback instead of the one line the user needs. ``user_errors()`` finds the original in the
exception chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from params.errors import ConfigError, UserError

TENSOR_AS_PYTHON_VALUE = (
    "a layer used a tensor as a Python bool or iterated over it while its step was traced; the "
    "trainer traces without AutoGraph, as Lingvo does: write tensor-dependent control flow with "
    "tf.cond / tf.while_loop"
)


def graph_function(fn: Callable, **kwargs: Any) -> Callable:
    """``tf.function(fn, **kwargs)`` traced without AutoGraph (see the module docstring)."""
    return tf.function(fn, autograph=False, **kwargs)


def _original_user_error(error: BaseException) -> UserError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raises a UserError hidden in a tracing error as itself."""
    try:
        yield
    except UserError:
        raise
    except tf.errors.OperatorNotAllowedInGraphError as e:
        raise ConfigError(f"{TENSOR_AS_PYTHON_VALUE} ({e})") from None
    except Exception as e:
        original = _original_user_error(e)
        if original is None:
            raise
        raise original.with_traceback(None) from None
