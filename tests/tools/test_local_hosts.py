"""tools.local_cluster --hosts: one line and exit 2 where hosts cannot be made; as root, a SIGKILLed
tool's namespaces and links are removed by the next start, which then holds only its own.

The cleanup test runs the tool with a stand-in for Python (a script that sleeps) as every task's
program: what it checks is the tool's namespaces, links and processes, not training."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.runner import REPO, _env
from tools import local_hosts

TIMEOUT = 60


def test_without_ip_it_says_so_in_one_line_and_starts_nothing(tmp_path):
    env = dict(_env(), PATH=str(tmp_path))  # no ip, no tc
    command = [
        sys.executable,
        "-m",
        "tools.local_cluster",
        "--hosts=2",
        "--model=m",
        f"--logdir={tmp_path}/l",
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "local_cluster: error: --hosts needs the ip and tc commands (iproute2)\n"
    assert not (tmp_path / "l").exists()


def test_without_root_it_says_so(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(local_hosts.shutil, "which", lambda tool: f"/sbin/{tool}")
    assert local_hosts.unavailable() == "--hosts needs root (network namespaces, veth links and tc qdiscs)"


def test_link_mbit_needs_hosts(tmp_path):
    command = [sys.executable, "-m", "tools.local_cluster", "--link_mbit=100", "--model=m", "--logdir=l"]
    result = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 2 and "--link_mbit needs --hosts >= 1" in result.stderr


def _owned() -> tuple[set[str], set[str]]:
    """The namespaces and the links whose names the tool owns, as ``ip`` lists them now."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {line.split()[0] for line in netns.splitlines() if line.startswith(local_hosts.PREFIX)}
    link_names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    return names, {n for n in link_names if n.startswith(local_hosts.PREFIX)}


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a dead child nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class Tool:
    """``tools.local_cluster --hosts=2 --link_mbit=50`` whose tasks' program sleeps; its output read
    until it has made its hosts."""

    def __init__(self, tmp_path: Path) -> None:
        stand_in = tmp_path / "python"
        stand_in.write_text("#!/bin/sh\nexec sleep 120\n")
        stand_in.chmod(0o755)
        code = (
            f"import runpy, sys; sys.executable = {str(stand_in)!r}; "
            "sys.argv = ['local_cluster', '--hosts=2', '--link_mbit=50', '--workers=2', '--model=m', "
            f"'--logdir={tmp_path}/l']; runpy.run_module('tools.local_cluster', run_name='__main__')"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + TIMEOUT
        while not any(" hosts on bridge " in line for line in self.lines):
            line = self.proc.stdout.readline()
            assert line and time.monotonic() < deadline, self.lines
            self.lines.append(line)
        for _ in range(2):  # each task's command line
            self.lines.append(self.proc.stdout.readline())
        self.tag = f"{local_hosts.PREFIX}{self.proc.pid}"

    def sleepers(self, count: int = 2) -> list[int]:
        """The tool's ``count`` task processes, once all have started."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
            pids = [int(p) for p in out.split()]
            if len(pids) >= count or time.monotonic() > deadline:
                return pids
            time.sleep(0.1)

    def end(self, signum: int) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.mark.skipif(local_hosts.unavailable() is not None, reason=str(local_hosts.unavailable()))
def test_a_killed_tool_leaves_nothing_the_next_start_does_not_remove(tmp_path):
    first = Tool(tmp_path)
    children = first.sleepers()
    try:
        assert len(children) == 2, first.lines
        held = _owned()
        assert {f"{first.tag}h0", f"{first.tag}h1"} <= held[0]
        assert {f"{first.tag}br", f"{first.tag}h0", f"{first.tag}h1"} <= held[1]
        assert first.end(signal.SIGKILL) == -signal.SIGKILL
        time.sleep(0.5)
        assert not [pid for pid in children if _running(pid)]  # they died with the tool
        assert f"{first.tag}h0" in _owned()[0]  # left behind
        second = Tool(tmp_path)
        try:
            removed = [line for line in second.lines if "removed what a killed run left" in line]
            assert len(removed) == 1 and f"netns {first.tag}h0" in removed[0], second.lines
            netns, links = _owned()
            assert {n for n in netns if n.startswith(f"{first.tag}")} == set()
            assert {n for n in links if n.startswith(f"{first.tag}")} == set()
            assert {f"{second.tag}h0", f"{second.tag}h1"} <= netns
            assert {f"{second.tag}br", f"{second.tag}h0", f"{second.tag}h1"} <= links
            assert len(second.sleepers()) == 2
            time.sleep(0.5)  # the tool forwards signals once its tasks have started
            assert second.end(signal.SIGINT) == 128 + signal.SIGINT
        finally:
            if second.proc.poll() is None:
                second.proc.kill()
        netns, links = _owned()
        assert not {n for n in netns | links if n.startswith((first.tag, second.tag))}
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
        local_hosts.remove_leftovers()
