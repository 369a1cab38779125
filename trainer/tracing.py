"""User errors raised while TensorFlow traces a function, given back as they were raised.

A layer that finds a bad setting or shape while ``tf.function`` traces it raises ConfigError, but
autograph re-raises it as a StagingError with a staging trace; the binary would then print a traceback
instead of the one line the user needs. ``user_errors()`` finds the original in the exception chain.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from params.errors import UserError


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
    except Exception as e:
        original = _original_user_error(e)
        if original is None:
            raise
        raise original.with_traceback(None) from None
