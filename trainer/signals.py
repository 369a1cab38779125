"""SIGTERM, what a cluster scheduler sends before preemption: stop cleanly, never mid-write.

``install()`` (the binary) makes SIGTERM raise ``Terminated`` wherever the program is, like SIGINT's
KeyboardInterrupt: context managers release the LOCK and close files on the way out, and every file
other jobs read is written atomically, so nothing is left half-written. Inside the training loop,
``deferred()`` only records the signal; the loop then saves a checkpoint at the current step and
raises ``Terminated`` itself, so the next start resumes from that step.

A job is often preempted in its first seconds, while TensorFlow imports: an exception raised inside
an import ends in a traceback (and SIGINT's default one in exit -2). ``install_for_binary`` is
therefore the first instruction of every binary (``trainer/__init__.py`` and ``tools/__init__.py``
call it when run by ``python -m``): from then on a signal that arrives inside an import or while
TensorFlow traces a graph prints the binary's one line and exits at once (143 for SIGTERM, 130 for
SIGINT; nothing is being written then, and an exception raised inside TensorFlow's C++ callbacks can
come back as another error with a traceback of its own; a LOCK left behind is stale and taken over),
one that arrives elsewhere raises as above, and an uncaught ``Terminated`` or KeyboardInterrupt, or
any error after a signal (``arrived()``), is the same one line and exit status, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType

EXIT_CODE = 128 + signal.SIGTERM  # the shell's status of a process ended by SIGTERM
INTERRUPT_EXIT_CODE = 128 + signal.SIGINT  # and by SIGINT (Ctrl-C)
TRAINER_NOTE = "; the last saved checkpoint is intact"  # ends the trainer's line for either signal


WORDS = {signal.SIGTERM: "terminated by SIGTERM", signal.SIGINT: "interrupted"}  # a binary's line says


def exit_code(signum: int) -> int:
    """The exit status of a binary stopped by ``signum`` (SIGTERM or SIGINT)."""
    return EXIT_CODE if signum == signal.SIGTERM else INTERRUPT_EXIT_CODE


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no ``except Exception`` (which
    reads a failure as a damaged file) swallows it."""


def _raise(signum: int, frame: object) -> None:
    del signum, frame
    raise Terminated(f"terminated by SIGTERM{TRAINER_NOTE}")


def install() -> None:
    """SIGTERM raises Terminated from now on (main thread only, as Python requires)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise)


def binary_name() -> str:
    """``export`` for ``python -m tools.export``, ``trainer`` for ``python -m trainer``."""
    argv = getattr(sys, "orig_argv", [])
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else os.path.basename(sys.argv[0] or "python")
    return module.rsplit(".", 1)[-1].removesuffix(".py")


def install_for_binary(name: str | None = None, note: str | Callable[[], str] = "") -> None:
    """A binary's first instruction: SIGTERM and SIGINT give the binary's one line and exit 143 / 130
    from here on, wherever they arrive (see the module doc). ``note`` ends both lines: a string, or a
    function asked when the signal arrives (the trainer's says whether a checkpoint was saved yet;
    if it fails the line ends without it). Installing again replaces the handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    name = name or binary_name()
    stderr = os.dup(2)  # the terminal's stderr, even while tf_startup points fd 2 at /dev/null

    def line(signum: int) -> str:
        try:
            ending = note() if callable(note) else note
        except Exception:  # noqa: BLE001 (the note must never hide the interruption)
            ending = ""
        return f"{name}: {WORDS[signum]}{ending}"

    def exit_with_line(signum: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(stderr, (line(signum) + "\n").encode(errors="backslashreplace"))
        os._exit(exit_code(signum))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        on_signal.arrived = signum  # type: ignore[attr-defined]  (read by arrived())
        if _in_import(frame) or _tracing(frame):
            exit_with_line(signum)  # an exception here would end in a traceback from the import
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(line(signum).split(": ", 1)[1])

    def excepthook(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, (Terminated, KeyboardInterrupt)):
            exit_with_line(signal.SIGTERM if issubclass(kind, Terminated) else signal.SIGINT)
        signum = arrived()
        if signum is not None:  # the interruption, raised inside TensorFlow's C++, came back as another error
            exit_with_line(signum)
        sys.__excepthook__(kind, error, tb)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sys.excepthook = excepthook


def arrived() -> int | None:
    """The signal ``install_for_binary``'s handler last received, or None.

    Raised inside a callback from TensorFlow's C++ (a gradient function while the step is traced,
    for example), KeyboardInterrupt or Terminated can come back out as an unrelated error (a
    ValueError from ``nest``); whoever reports an error asks this first, so a stopped run still ends
    with the signal's one line and exit status."""
    return getattr(signal.getsignal(signal.SIGTERM), "arrived", None)


def _in_import(frame: FrameType | None) -> bool:
    """Whether the frame runs inside an ``import`` (the interpreter's importlib is on its stack)."""
    return _on_stack(frame, lambda name: name.startswith("<frozen importlib"))


def _tracing(frame: FrameType | None) -> bool:
    """Whether TensorFlow is tracing a graph (its func_graph is on the stack): nothing is written
    then, and an exception raised there crosses TensorFlow's C++ (gradient functions, ``nest``),
    which can turn it into another error with a traceback of its own."""
    func_graph = os.path.join("tensorflow", "python", "framework", "func_graph.py")
    return _on_stack(frame, lambda name: name.endswith(func_graph))


def _on_stack(frame: FrameType | None, matches: Callable[[str], bool]) -> bool:
    while frame is not None:
        if matches(frame.f_code.co_filename):
            return True
        frame = frame.f_back
    return False


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
