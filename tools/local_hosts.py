"""Hosts apart on this machine: network namespaces joined to one bridge by rate-limited veth links.

``Hosts(n, link_mbit)`` makes ``n`` network namespaces ("hosts"), each with its loopback and one
veth link to a bridge in the root namespace, on a private subnet (``SUBNET``) that exists only inside
those namespaces: the root namespace has no address on it, so nothing outside them can reach it or be
reached from it. With ``link_mbit`` every link is limited to that rate in each direction: a ``tbf``
qdisc on the host's end (what it sends) and on the bridge's end (what it receives). ``command(i,
argv)`` runs ``argv`` on host ``i``; ``close()`` removes everything.

Every name starts with ``PREFIX`` and the process id of the run that owns it (``tph1234h0``: host 0
of process 1234, namespace and bridge-side link alike; ``tph1234br``: its bridge), and the run holds
a lock file (``LOCK_DIR``) while it lives. ``remove_leftovers()`` removes the names of every run whose
lock nobody holds (a run that was killed), killing what still runs in its namespaces; a live run's
names are left alone.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

PREFIX = "tph"
SUBNET = "10.245.45"  # /24, host i at .(i + 1), only inside the namespaces
LOCK_DIR = Path("/run/tensorpipe_hosts")
MAX_HOSTS = 200
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:br|h\d+)$")


class HostsError(RuntimeError):
    """The machine cannot make hosts (not root, or no ``ip``/``tc``), or a command to make them failed."""


def unavailable() -> str | None:
    """Why hosts cannot be made here (one line), or None."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (
            f"--hosts needs the {' and '.join(missing)} command{'s' if len(missing) > 1 else ''} (iproute2)"
        )
    if os.geteuid() != 0:
        return "--hosts needs root (network namespaces, veth links and tc qdiscs)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode:
        raise HostsError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _run(argv: Sequence[str]) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if result.returncode:
        raise HostsError(f"{' '.join(argv)}: {result.stderr.strip()}")


def owned_names() -> dict[int, list[str]]:
    """The namespaces and links whose names this module owns, by the owning run's process id."""
    names: dict[int, list[str]] = {}
    found = _ip("netns", "list").stdout.split()
    found += [
        line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").stdout.splitlines()
    ]
    for name in found:
        match = _NAME.match(name)
        if match:
            names.setdefault(int(match.group(1)), []).append(name)
    return names


def _lock_path(pid: int) -> Path:
    return LOCK_DIR / f"{PREFIX}{pid}.lock"


def _lock_held(pid: int) -> bool:
    """Whether the run of process ``pid`` still holds its lock (it is alive)."""
    path = _lock_path(pid)
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _remove(pid: int) -> list[str]:
    """Removes run ``pid``'s namespaces (killing what runs in them), bridge and links; returns the
    names it removed."""
    removed = []
    for ns in sorted(n for n in _ip("netns", "list").stdout.split() if _NAME.match(n or "")):
        if int(_NAME.match(ns).group(1)) != pid:
            continue
        for text in _ip("netns", "pids", ns, check=False).stdout.split():
            try:
                os.kill(int(text), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _ip("netns", "delete", ns, check=False)
        removed.append(f"netns {ns}")
    for name in owned_names().get(pid, []):  # the links left: bridge-side ends and the bridge
        if _ip("link", "delete", name, check=False).returncode == 0:
            removed.append(f"link {name}")
    _lock_path(pid).unlink(missing_ok=True)
    return removed


def remove_leftovers() -> list[str]:
    """Removes what runs that no longer live left behind (by name; a live run's are kept); returns
    the names removed."""
    removed = []
    for pid in sorted(owned_names()):
        if pid != os.getpid() and not _lock_held(pid):
            removed += _remove(pid)
    return removed


class Hosts:
    """``count`` namespaced hosts on one bridge, each link limited to ``link_mbit`` (None: no limit)."""

    def __init__(self, count: int, link_mbit: float | None = None) -> None:
        if not 1 <= count <= MAX_HOSTS:
            raise ValueError(f"--hosts must be between 1 and {MAX_HOSTS}, got {count}")
        if link_mbit is not None and not link_mbit > 0:
            raise ValueError(f"--link_mbit must be > 0, got {link_mbit}")
        self.count, self.link_mbit = count, link_mbit
        self.pid = os.getpid()
        self.tag = f"{PREFIX}{self.pid}"
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        self._lock = open(_lock_path(self.pid), "w")  # noqa: SIM115 (held until close())
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.leftovers = remove_leftovers()
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    @property
    def bridge(self) -> str:
        return f"{self.tag}br"

    def name(self, i: int) -> str:
        """Host ``i``'s namespace, and its link's end on the bridge."""
        return f"{self.tag}h{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def names(self) -> list[str]:
        """Every namespace and link this run holds."""
        return [self.bridge, *(self.name(i) for i in range(self.count))]

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i in range(self.count):
            ns, inner = self.name(i), f"{self.tag}n{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", ns, "type", "veth", "peer", "name", inner, "netns", ns)
            _ip("link", "set", ns, "master", self.bridge, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "address", "add", f"{self.address(i)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
        if self.link_mbit is not None:
            self.set_rate(self.link_mbit)

    def set_rate(self, link_mbit: float | None) -> None:
        """Every link limited to ``link_mbit`` Mbit/s in each direction from now on (None: no limit)."""
        if link_mbit is not None and not link_mbit > 0:
            raise ValueError(f"link_mbit must be > 0, got {link_mbit}")
        for i in range(self.count):
            ns, inner = self.name(i), f"{self.tag}n{i}"
            if link_mbit is None:
                for prefix in (["ip", "netns", "exec", ns], []):
                    subprocess.run([*prefix, "tc", "qdisc", "del", "dev", inner if prefix else ns, "root"],
                                   capture_output=True, timeout=30)  # fmt: skip
            else:
                _run(["ip", "netns", "exec", ns, *tbf(inner, link_mbit)])
                _run(tbf(ns, link_mbit))
        self.link_mbit = link_mbit

    def link_bytes(self, i: int) -> int:
        """Bytes host ``i``'s link has carried so far, both directions (its bridge end's counters)."""
        stats = Path("/sys/class/net") / self.name(i) / "statistics"
        return sum(int((stats / f"{way}_bytes").read_text()) for way in ("rx", "tx"))

    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run on host ``i`` (in its namespace)."""
        return ["ip", "netns", "exec", self.name(i), *argv]

    def describe(self) -> str:
        rate = f"{self.link_mbit:g} Mbit/s each way" if self.link_mbit else "no rate limit"
        hosts = ", ".join(f"{self.name(i)}={self.address(i)}" for i in range(self.count))
        return f"{self.count} hosts on bridge {self.bridge} ({rate}): {hosts}"

    def close(self) -> None:
        """Removes this run's namespaces (and whatever still runs in them), links and bridge."""
        if self._lock.closed:
            return
        _remove(self.pid)
        self._lock.close()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tbf(device: str, mbit: float) -> list[str]:
    """The ``tc`` command that limits what ``device`` sends to ``mbit`` Mbit/s (a token bucket of
    at least 2 ms of the rate and 64 KiB, so a segmentation-offloaded 64 KiB packet fits; 50 ms of
    queue)."""
    rate_bytes = mbit * 1e6 / 8
    burst = max(64 * 1024, int(rate_bytes * 0.002))
    rate = f"{mbit:g}mbit"
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        device,
        "root",
        "tbf",
        "rate",
        rate,
        "burst",
        str(burst),
        "latency",
        "50ms",
    ]
