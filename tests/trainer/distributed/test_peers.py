"""A cluster task whose peers never come: it says what it waits for, ends within 5 s of
SIGTERM (143) or SIGINT (130) with one line, and gives up after --cluster_wait_secs naming the task.

Three sync trainers (worker 0 of a two-worker cluster whose worker 1 never starts) run at once, so
the test waits for TensorFlow's import once."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pytest

from params.errors import UserError
from params.experiment import cluster_params
from tests.trainer import cluster_runner as cr
from tools import local_cluster
from trainer.distributed import peers, roles

TIMEOUT = 300


def _lonely_worker(procs: cr.Procs, name: str, logdir, wait_secs: int):
    ports = local_cluster.free_ports(2)
    spec = local_cluster.cluster_spec(2, 0, ports)
    proc = procs.trainer(
        name, "--model=image.digits.ConvNet", "--mode=sync", f"--cluster_spec={spec}", "--task_index=0",
        f"--logdir={logdir}", f"--cluster_wait_secs={wait_secs}",
    )  # fmt: skip
    return proc, f"worker:1 (127.0.0.1:{ports[1]})"


@pytest.mark.slow
def test_a_sync_trainer_without_its_peer_says_so_stops_on_signals_and_gives_up(tmp_path):
    with cr.Procs(tmp_path) as procs:
        term, missing = _lonely_worker(procs, "term", tmp_path / "a", 600)
        intr, _ = _lonely_worker(procs, "int", tmp_path / "b", 600)
        gives_up, gone = _lonely_worker(procs, "give_up", tmp_path / "c", 12)
        for proc, sig, code in ((term, signal.SIGTERM, 143), (intr, signal.SIGINT, 130)):
            cr.wait_until(lambda p=proc: "waiting for worker:1" in cr.output(p), TIMEOUT, [proc])
            assert f"trainer: worker:0 waiting for {missing if proc is term else ''}" in cr.output(proc)
            sent = time.monotonic()
            proc.send_signal(sig)
            exit_code, out = procs.wait(proc, 30)
            assert time.monotonic() - sent < 5.0, out[-2000:]
            assert exit_code == code, out[-2000:]
            assert "Traceback" not in out
        exit_code, out = procs.wait(gives_up, TIMEOUT)
    assert exit_code == 1, out[-2000:]
    assert f"trainer: worker:0 waiting for {gone}; " in out
    errors = [line for line in out.splitlines() if line.startswith("trainer: error:")]
    assert errors == [
        f"trainer: error: worker:0 gave up after 12 s (--cluster_wait_secs) waiting for {gone}; "
        "start it, or check --cluster_spec"
    ], out[-2000:]
    assert not (tmp_path / "c").exists()  # nothing written before the cluster is up


def _roles() -> list[roles.Role]:
    spec = local_cluster.cluster_spec(2, 0, local_cluster.free_ports(2))
    return [roles.resolve_role("sync", spec, None, i) for i in range(2)]


def test_two_waiting_peers_find_each_other():
    pair, lines, done = _roles(), [], []
    servers: list[socket.socket] = []

    def wait(role: roles.Role) -> None:
        peers.wait_for_peers(role, 30, log=lines.append, report_secs=0.1)
        done.append(role.name)
        # As TensorFlow's server does next in the binary: a task that went on answers at its port
        # (without it, worker 0 may see worker 1 and close its listener before worker 1 looks).
        server = socket.create_server(
            ("", int(role.address(role.task_type, role.task_index).rpartition(":")[2]))
        )
        servers.append(server)

    first = threading.Thread(target=wait, args=(pair[0],))
    first.start()
    time.sleep(0.5)  # worker 0 waits alone, and says so
    try:
        wait(pair[1])
        first.join(10)
    finally:
        for server in servers:
            server.close()
    assert sorted(done) == ["worker:0", "worker:1"]
    assert lines[0].startswith(f"trainer: worker:0 waiting for worker:1 ({pair[0].cluster['worker'][1]}); ")


def test_a_long_wait_gives_up_naming_the_missing_task():
    role = _roles()[0]
    with pytest.raises(
        UserError, match=r"^worker:0 gave up after 0.5 s \(--cluster_wait_secs\) .*worker:1 \("
    ):
        peers.wait_for_peers(role, 0.5, log=lambda _: None)


def test_the_trainer_of_remote_stages_is_called_the_trainer():
    """With no controller address in --cluster_spec the trainer's job is an internal 'localhost': its
    wait lines call it the trainer."""
    from trainer.distributed import remote_stages

    (port,) = local_cluster.free_ports(1)
    cluster = remote_stages.stage_cluster(
        cluster_params().set(stage_job="worker"), f"worker=localhost:{port}", wait_secs=0.5
    )
    with pytest.raises(UserError, match=r"^the trainer gave up after 0.5 s .*worker:0 \(localhost:"):
        peers.wait_for_peers(cluster.role(), 0.5, log=lambda _: None)
