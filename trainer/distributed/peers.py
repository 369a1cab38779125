"""Waiting for the other processes of a cluster: saying so, honouring signals, and giving up.

TensorFlow's strategies block inside C++, holding Python's GIL, until every task of the cluster has
started (``TFE_EnableCollectiveOps`` and the coordination service; a ``ParameterServerStrategy``
connecting to its servers): there no Python code runs, not even a signal handler, so a sync trainer
whose peer never came printed nothing and ignored SIGTERM and Ctrl-C. ``wait_for_peers`` therefore
waits in Python *before* that call, until every other task's address answers: every ``REPORT_SECS``
it prints which tasks (and addresses) do not answer yet, SIGTERM and SIGINT end the process as
anywhere else (exit 143 / 130, with the binary's usual line), and after ``--cluster_wait_secs`` it
gives up with one line naming the missing tasks.

While it waits, this process answers at its own address (a Python listener on its port), so its
peers, waiting the same way, see it; the listener is closed before TensorFlow's server takes the
port. A peer that already went on answers with TensorFlow's server.

A peer that dies later makes TensorFlow's collectives or coordination service fail on the others with
one of ``PEER_ERRORS``; ``peer_failure`` turns that into one line naming the cluster's peers.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator

import tensorflow as tf

from params.errors import UserError
from trainer import signals
from trainer.distributed import roles
from trainer.progress import print_line

REPORT_SECS = 10.0  # how often a waiting process says what it waits for
DEFAULT_WAIT_SECS = 600
POLL_SECS = 0.25

# Errors with which TensorFlow reports a peer that went away (or never came).
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.InternalError,
    tf.errors.UnknownError,
    tf.errors.FailedPreconditionError,
)


def peer_failure(role: roles.Role, error: Exception) -> str:
    """One line: which process stopped, and which peers it was training with."""
    others = ", ".join(
        f"{t}:{i} ({a})"
        for t, addresses in role.cluster.items()
        for i, a in enumerate(addresses)
        if (t, i) != (role.task_type, role.task_index)
    )
    reason = str(getattr(error, "message", error)).strip().splitlines()[0][:200]
    return (
        f"{role.name} stopped: a peer of the cluster failed or is unreachable (peers: {others}); "
        f"{type(error).__name__}: {reason}. Start every process again to resume from the last checkpoint"
    )


def answering(address: str, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def missing_peers(role: roles.Role) -> list[str]:
    """The other tasks of the cluster whose address does not answer yet, as ``worker:1 (host:port)``."""
    return [
        f"{task_type}:{index} ({address})"
        for task_type, addresses in role.cluster.items()
        for index, address in enumerate(addresses)
        if (task_type, index) != (role.task_type, role.task_index) and not answering(address)
    ]


def wait_for_peers(
    role: roles.Role,
    wait_secs: float,
    *,
    log: Callable[[str], None] = print_line,
    report_secs: float = REPORT_SECS,
) -> None:
    """Returns once every other task of the cluster answers at its address (module doc); raises
    UserError naming the missing tasks after ``wait_secs``."""
    with _exit_at_once_on_signals():
        _wait(role, wait_secs, log, report_secs)


@contextlib.contextmanager
def _exit_at_once_on_signals() -> Iterator[None]:
    """SIGTERM / SIGINT while waiting: the binary's line, then exit at once (143 / 130). Nothing was
    written yet, and TensorFlow's teardown at a normal exit takes seconds on a busy machine."""
    try:
        yield
    except signals.Terminated as e:
        _exit(f"trainer: {e}", signals.EXIT_CODE)
    except KeyboardInterrupt:
        _exit("trainer: interrupted while waiting for the cluster; nothing was written", 130)


def _exit(line: str, code: int) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def _wait(role: roles.Role, wait_secs: float, log: Callable[[str], None], report_secs: float) -> None:
    began = time.monotonic()
    next_report = began + report_secs
    with _answering_at(role.address(role.task_type, role.task_index)):
        while True:
            missing = missing_peers(role)
            if not missing:
                return
            now = time.monotonic()
            if now - began >= wait_secs:
                raise UserError(
                    f"{role.name} gave up after {wait_secs:g} s (--cluster_wait_secs) waiting for "
                    f"{', '.join(missing)}; start it, or check --cluster_spec"
                )
            if now >= next_report:
                next_report = now + report_secs
                waited = f"{now - began:.0f} s of --cluster_wait_secs={wait_secs:g}"
                log(f"trainer: {role.name} waiting for {', '.join(missing)}; {waited}")
            time.sleep(POLL_SECS)


@contextlib.contextmanager
def _answering_at(address: str) -> Iterator[None]:
    """A listener on this task's port while the block runs (none if the port cannot be bound: then
    TensorFlow's server could not bind it either, and says so itself)."""
    port = int(address.rpartition(":")[2])
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", port))
        server.listen(16)
        server.settimeout(POLL_SECS)
    except OSError:
        server.close()
        yield
        return
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:  # the prober closes first: its side keeps TIME_WAIT, not this port
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    conn.recv(1)

    thread = threading.Thread(target=serve, name="cluster-wait-listener", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(2.0)
        server.close()
