"""SIGTERM, what a cluster scheduler sends before preemption: stop cleanly, never mid-write.

``install()`` (the binary) makes SIGTERM raise ``Terminated`` wherever the program is, like SIGINT's
KeyboardInterrupt: context managers release the LOCK and close files on the way out, and every file
other jobs read is written atomically, so nothing is left half-written. Inside the training loop,
``deferred()`` only records the signal; the loop then saves a checkpoint at the current step and
raises ``Terminated`` itself, so the next start resumes from that step.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

EXIT_CODE = 128 + signal.SIGTERM  # the shell's status of a process ended by SIGTERM
INTACT = "the last saved checkpoint is intact"  # the binary names the checkpoint, or says none was saved


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no ``except Exception`` (which
    reads a failure as a damaged file) swallows it."""


def _raise(signum: int, frame: object) -> None:
    del signum, frame
    raise Terminated(f"terminated by SIGTERM; {INTACT}")


def install() -> None:
    """SIGTERM raises Terminated from now on (main thread only, as Python requires)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)


class Flag:
    """Set by SIGTERM while ``deferred()`` is active."""

    def __init__(self) -> None:
        self.raised = False


@contextlib.contextmanager
def deferred() -> Iterator[Flag]:
    """Within the block, SIGTERM sets the yielded flag instead of interrupting; the previous handler
    comes back afterwards. Outside the main thread (no signals there) the flag never sets."""
    flag = Flag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def _set(signum: int, frame: object) -> None:
        del signum, frame
        flag.raised = True

    previous = signal.signal(signal.SIGTERM, _set)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGTERM, previous)
