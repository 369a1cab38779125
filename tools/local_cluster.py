"""``python -m tools.local_cluster``: a training cluster on this machine, one process per task.

    python -m tools.local_cluster --workers=2 --model=image.digits.ConvNet --logdir=runs/digits2
    python -m tools.local_cluster --workers=2 --ps=1 --model=image.digits.ConvNet --logdir=runs/async
    python -m tools.local_cluster --workers=2 --model=... --logdir=... -- --params_override='...'
    python -m tools.local_cluster --mesh --workers=2 --model=lm.synthetic.MeshTransformerLM --logdir=runs/m
    python -m tools.local_cluster --stages=2 --model=image.digits.GPipeConvNet --logdir=runs/remote
    python -m tools.local_cluster --hosts=3 --link_mbit=1000 --stages=2 --model=... --logdir=...

``--hosts=N`` (root, ``ip`` and ``tc``: docs/cluster.md): the tasks run on N hosts apart, network
namespaces joined to one bridge (``tools/local_hosts.py``), in order (the stage tasks, then the
trainer; else as listed below) round-robin, so N equal to the number of tasks gives each its own host.
``--link_mbit=R`` limits each host's link to R Mbit/s in each direction. The namespaces, links and
bridge are removed when the tool ends (also on Ctrl-C), and what a killed run left is removed by the
next start with ``--hosts``, which says so.

``--stages=K``: a cross-process pipeline (docs/parallelism/remote.md): K stage tasks
(``--mode=stages``) and the trainer (``--mode=train``, every job of the run), all with
``cluster.stage_job : 'worker'`` added to ``--params_override``; the stage tasks are stopped when
the trainer is done.

Picks free ports on 127.0.0.1, starts ``python -m trainer`` once per task with ``--mode=sync`` (no
ps), ``--mode=async`` (``--ps`` > 0: a controller, the trainers and the parameter servers) or
``--mode=mesh`` (``--mesh``: the experiment's DTensor mesh spread over ``--workers`` processes), the
right ``--cluster_spec``, ``--job`` and ``--task_index``, and prints every output line prefixed with
the process's name (``[trainer:1] ...``). Before starting, it prints each process's command: the ones
to run on real machines, with real host names. Ctrl-C (or SIGTERM) is forwarded to every process, which
then get ``--grace_seconds`` to stop (a process blocked inside TensorFlow's runtime, waiting for a peer
that already stopped, cannot answer a signal), then are killed; the tool's one line names them. When
one process exits with an error, the others get ``--grace_seconds`` to stop on their own (they should:
the cluster noticed), then are killed. The exit status is the first non-zero one, else 0 (128 + the
signal's number after a forwarded signal).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools import local_hosts
from trainer.planning.trial import free_ports  # noqa: F401 (tools and tests take it from here)

HOST = "127.0.0.1"


@dataclass
class Task:
    """One process of the cluster."""

    job: str  # Lingvo job: controller, trainer or ps
    index: int
    command: list[str]
    server: bool = False  # async trainers and ps serve until stopped
    proc: subprocess.Popen | None = field(default=None, repr=False)
    host: int | None = None  # with --hosts: the host (namespace) it runs on

    @property
    def name(self) -> str:
        return f"{self.job}:{self.index}"


def cluster_spec(workers: int, ps: int, ports: Sequence[int], host: str = HOST) -> str:
    """Lingvo's ``--cluster_spec`` for ``workers`` trainers (and a controller and ``ps`` ps if ps > 0)."""
    ports = list(ports)
    jobs = []
    if ps:
        jobs.append(f"controller={host}:{ports.pop(0)}")
    jobs.append("trainer=" + ",".join(f"{host}:{ports.pop(0)}" for _ in range(workers)))
    if ps:
        jobs.append("ps=" + ",".join(f"{host}:{ports.pop(0)}" for _ in range(ps)))
    return "@".join(jobs)


def tasks(
    workers: int, ps: int, trainer_flags: Sequence[str], python: str = sys.executable, mesh: bool = False
) -> list[Task]:
    """Every process of the cluster, with its full command line (``mesh``: of a mesh across processes)."""
    if workers < 1 or ps < 0 or (mesh and ps):
        raise ValueError(f"--workers must be >= 1 and --ps >= 0 (0 with --mesh), got {workers} and {ps}")
    spec = cluster_spec(workers, ps, free_ports(workers + ps + (1 if ps else 0)))
    mode = "mesh" if mesh else "async" if ps else "sync"
    jobs = ([("controller", 0)] if ps else []) + [("trainer", i) for i in range(workers)]
    jobs += [("ps", i) for i in range(ps)]
    base = [python, "-m", "trainer", f"--mode={mode}", f"--cluster_spec={spec}"]
    return [
        Task(
            job,
            i,
            [*base, f"--job={job}", f"--task_index={i}", *trainer_flags],
            server=bool(ps) and job != "controller",
        )
        for job, i in jobs
    ]


STAGE_JOB_OVERRIDE = "cluster.stage_job : 'worker'"


def stage_tasks(
    stages: int, trainer_flags: Sequence[str], python: str = sys.executable, controller: bool = False
) -> list[Task]:
    """The trainer and ``stages`` stage tasks of a cross-process pipeline, with their command lines.
    ``controller``: the spec names the trainer's own address too (``controller=``), for stage tasks
    on other hosts (else they reach the trainer as localhost)."""
    if stages < 1:
        raise ValueError(f"--stages must be >= 1, got {stages}")
    ports = free_ports(stages + int(controller))
    spec = "worker=" + ",".join(f"{HOST}:{p}" for p in ports[:stages])
    if controller:
        spec = f"controller={HOST}:{ports[-1]}@{spec}"
    flags = with_override(trainer_flags, STAGE_JOB_OVERRIDE)
    base = [python, "-m", "trainer", f"--cluster_spec={spec}"]
    trainer = Task("trainer", 0, [*base, *flags])
    servers = [
        Task("stage", k, [*base, "--mode=stages", f"--task_index={k}", *flags], server=True)
        for k in range(stages)
    ]
    return [trainer, *servers]


def with_override(flags: Sequence[str], override: str) -> list[str]:
    """``flags`` with ``override`` appended to their --params_override (one flag: absl keeps the last)."""
    out, texts = [], []
    for flag in flags:
        if flag.startswith("--params_override="):
            texts.append(flag.split("=", 1)[1])
        else:
            out.append(flag)
    return [*out, "--params_override=" + "; ".join([*texts, override])]


def _spec_job(task: Task) -> str:
    return "worker" if task.job == "stage" else task.job


def place(cluster: list[Task], hosts: local_hosts.Hosts) -> None:
    """Puts ``cluster``'s tasks on ``hosts`` round-robin (stage tasks first, the trainer of a
    cross-process pipeline last) and rewrites every ``--cluster_spec`` with each task's host address."""
    order = [t for t in cluster if t.job == "stage"] + [t for t in cluster if t.job != "stage"]
    if hosts.count > len(cluster):
        raise ValueError(f"--hosts={hosts.count} is more than the cluster's {len(cluster)} tasks")
    for position, task in enumerate(order):
        task.host = position % hosts.count
    where = {(_spec_job(t), t.index): hosts.address(t.host) for t in cluster}
    if any(t.job == "stage" for t in cluster):  # the pipeline's trainer is its spec's controller
        where[("controller", 0)] = where[("trainer", 0)]
    for task in cluster:
        task.command = [
            "--cluster_spec=" + _readdressed(a.split("=", 1)[1], where)
            if a.startswith("--cluster_spec=")
            else a
            for a in task.command
        ]


def _readdressed(spec: str, where: dict[tuple[str, int], str]) -> str:
    jobs = []
    for part in spec.split("@"):
        job, addresses = part.split("=", 1)
        moved = [
            f"{where.get((job, i), a.rsplit(':', 1)[0])}:{a.rsplit(':', 1)[1]}"
            for i, a in enumerate(addresses.split(","))
        ]
        jobs.append(f"{job}={','.join(moved)}")
    return "@".join(jobs)


def _die_with_parent() -> None:
    """In a task's process before it starts: the kernel kills it when the tool dies (even by SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pump(task: Task, lock: threading.Lock) -> None:
    assert task.proc is not None and task.proc.stdout is not None
    for line in task.proc.stdout:
        with lock:
            sys.stdout.write(f"[{task.name}] {line}")
            sys.stdout.flush()


def run(cluster: list[Task], grace_seconds: float, hosts: local_hosts.Hosts | None = None) -> int:
    """Starts every task (on ``hosts`` as ``place`` put them), relays their output, and returns the
    cluster's exit status."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)  # each process gets its cluster from --cluster_spec
    lock = threading.Lock()
    pumps = []
    for task in cluster:
        where = "" if hosts is None else f" on {hosts.name(task.host)} ({hosts.address(task.host)})"
        print(f"local_cluster: {task.name}{where}: {shlex.join(task.command)}", flush=True)
    received: list[int] = []  # signals forwarded: then the cluster's status is the signal's, in one line
    killed: list[str] = []  # the tasks still running ``grace_seconds`` after a failure or a signal

    def forward(signum: int, frame: object) -> None:
        del frame
        received.append(signum)
        for t in cluster:
            if t.proc is not None and t.proc.poll() is None:
                t.proc.send_signal(signum)

    # forwarded from before the first task starts: a signal while they start is not lost, and a
    # task started after it gets it too
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    status = 0
    try:
        for task in cluster:
            _start(task, env, hosts, lock, pumps)
            if received:
                task.proc.send_signal(received[0])
        status = _wait(cluster, grace_seconds, received, killed)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for t in cluster:  # nothing outlives the tool
            if t.proc is not None and t.proc.poll() is None:
                t.proc.kill()
                t.proc.wait()
        for pump in pumps:
            pump.join(timeout=5)
    if received:
        what = "terminated by SIGTERM" if received[0] == signal.SIGTERM else "interrupted"
        late = f"; killed {', '.join(killed)} {grace_seconds:g} s after it" if killed else ""
        print(f"local_cluster: {what}; forwarded to every process{late}", file=sys.stderr, flush=True)
        return 128 + received[0]
    return status


def _start(task: Task, env: dict, hosts: local_hosts.Hosts | None, lock: threading.Lock, pumps: list) -> None:
    """Starts ``task``'s process (on its host) and the thread relaying its output."""
    command = task.command if hosts is None else hosts.command(task.host, task.command)
    task.proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        preexec_fn=None if hosts is None else _die_with_parent,
    )
    pump = threading.Thread(target=_pump, args=(task, lock), daemon=True)
    pump.start()
    pumps.append(pump)


def _wait(cluster: list[Task], grace_seconds: float, received: Sequence[int], killed: list[str]) -> int:
    """Waits for every task; returns the cluster's status. The tasks still running ``grace_seconds``
    after the first failure or forwarded signal are killed and their names added to ``killed``."""
    status, deadline = 0, None
    stopping = False
    while True:
        running = [t for t in cluster if t.proc.poll() is None]
        if not stopping and running and all(t.server for t in running):
            stopping = True  # the controller is done: the servers have nothing left to serve
            for t in running:
                t.proc.terminate()
        if received and deadline is None:
            deadline = time.monotonic() + grace_seconds
        for t in cluster:
            code = t.proc.returncode
            if code not in (None, 0) and status == 0 and not (stopping and t.server):
                status = code if code > 0 else 128 - code
                if received:  # stopped by the forwarded signal: run() says so in one line
                    continue
                print(f"local_cluster: {t.name} exited with status {code}", file=sys.stderr, flush=True)
                deadline = time.monotonic() + grace_seconds
        if not running:
            return status
        if deadline is not None and time.monotonic() > deadline:
            killed.extend(t.name for t in running)
            if not received:  # after a signal, run()'s one line names them
                names = ", ".join(killed)
                after = f"{grace_seconds:g} s after the failure"
                print(f"local_cluster: stopping {names} ({after})", file=sys.stderr)
            for t in running:
                t.proc.kill()
            deadline = float("inf")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.local_cluster",
        description="Run a training cluster on 127.0.0.1. Flags after '--' go to every trainer process.",
    )
    parser.add_argument("--workers", type=int, default=2, help="Trainer replicas (TensorFlow workers).")
    parser.add_argument("--ps", type=int, default=0, help="Parameter servers; > 0 trains async.")
    parser.add_argument(
        "--mesh",
        action="store_true",
        help="Spread the experiment's DTensor mesh (cluster.mesh_shape) over the --workers processes.",
    )
    parser.add_argument(
        "--stages",
        type=int,
        default=0,
        help="> 0: a cross-process pipeline instead: this many stage tasks and one trainer (--workers, "
        "--ps and --mesh are not used).",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="> 0: run the tasks on this many hosts apart, network namespaces on one bridge (root, ip "
        "and tc needed); tasks are spread round-robin, stage tasks first.",
    )
    parser.add_argument(
        "--link_mbit",
        type=float,
        default=None,
        help="With --hosts: each host's link limited to this many Mbit/s in each direction (default: "
        "no limit).",
    )
    parser.add_argument("--model", required=True, help="Registry key of the experiment.")
    parser.add_argument("--logdir", required=True, help="The run's shared logdir.")
    parser.add_argument(
        "--grace_seconds",
        type=float,
        default=60.0,
        help="After one process fails, or Ctrl-C / SIGTERM is forwarded, wait this long for the rest, "
        "then kill them.",
    )
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    if args.workers < 1 or args.ps < 0:
        parser.error(f"--workers must be >= 1 and --ps >= 0, got {args.workers} and {args.ps}")
    if args.mesh and args.ps:
        parser.error("--mesh and --ps: a mesh's processes are all trainers; leave --ps out")
    flags = [f"--model={args.model}", f"--logdir={args.logdir}", *rest]
    if args.stages:
        if args.stages < 0 or args.ps or args.mesh:
            parser.error(
                f"--stages must be >= 1 and without --ps or --mesh, got {args.stages}, --ps={args.ps}"
                f"{' and --mesh' if args.mesh else ''}"
            )
        cluster = stage_tasks(args.stages, flags, controller=bool(args.hosts))
    else:
        cluster = tasks(args.workers, args.ps, flags, mesh=args.mesh)
    if not args.hosts and args.link_mbit is None:
        return run(cluster, args.grace_seconds)
    return _run_on_hosts(parser, args, cluster)


def _run_on_hosts(parser: argparse.ArgumentParser, args: argparse.Namespace, cluster: list[Task]) -> int:
    if args.hosts < 1:
        parser.error(f"--link_mbit needs --hosts >= 1, got --hosts={args.hosts}")
    if args.hosts > len(cluster):
        parser.error(f"--hosts={args.hosts} is more than the cluster's {len(cluster)} tasks")
    if args.link_mbit is not None and not args.link_mbit > 0:
        parser.error(f"--link_mbit must be > 0, got {args.link_mbit:g}")
    reason = local_hosts.unavailable()
    if reason:
        print(f"local_cluster: error: {reason}", file=sys.stderr, flush=True)
        return 2
    try:
        hosts = local_hosts.Hosts(args.hosts, args.link_mbit)
    except local_hosts.HostsError as e:
        print(f"local_cluster: error: cannot make the hosts: {e}", file=sys.stderr, flush=True)
        return 2
    with hosts:
        if hosts.leftovers:
            print(f"local_cluster: removed what a killed run left: {', '.join(hosts.leftovers)}", flush=True)
        print(f"local_cluster: {hosts.describe()}", flush=True)
        place(cluster, hosts)
        return run(cluster, args.grace_seconds, hosts)


if __name__ == "__main__":
    sys.exit(main())
