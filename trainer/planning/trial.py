"""A plan tried for real: its processes started on this host (stage tasks as ``tools.local_cluster
--stages=K`` starts them, and the trainer), a few training steps timed, every process's peak read.

``measure_plan`` runs one; each process is ``python -m trainer.planning.trial --worker=JSON``. The
planner's calibration (``calibrate``) and ``tools.benchmark plan`` use it. A step is the median of the
last 3 (the first traces the step; the calibration asks for more); a process's peak is its VmHWM
(Linux's high-water mark of its resident memory: ``ru_maxrss`` would carry over the parent's across
exec).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def peak_rss_bytes(pid: int) -> int:
    """Process ``pid``'s peak resident memory (VmHWM of /proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on this host now (all held open until every one is chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _resolve(spec: dict):
    from params import experiment

    override = spec["plan_text"] + ("cluster.stage_job : 'worker'\n" if spec["mode"] == "stages" else "")
    return experiment.resolve(spec["model"], gin_bindings=spec["bindings"], params_override=override)


def run_worker(spec: dict) -> int:
    """One process of a plan: a stage task (serves until killed) or the trainer (prints its steps)."""
    from trainer import tf_startup

    tf_startup.use_system_allocator()  # as the trainer binary's processes
    tf_startup.import_tensorflow()
    from params import experiment
    from trainer import tf_settings
    from trainer.distributed import remote_stages
    from trainer.distributed.mesh_placement import make_train_step
    from trainer.train_step import TrainStep

    root = _resolve(spec)
    if spec.get("stage"):
        return remote_stages.serve(root, spec["cluster_spec"], spec["task_index"], log=lambda _: None)
    task_params = experiment.task_params_for(root, "train")
    if spec["mode"] == "stages":
        stages = remote_stages.stage_cluster(root.cluster, spec["cluster_spec"])
        tf_settings.configure(root.cluster.copy().set(num_logical_cpu_devices=1))
        step = TrainStep(task_params, root.input.train, remote_stages.placement(stages, log=lambda _: None))
    else:
        tf_settings.configure(root.cluster)
        step = make_train_step(root.cluster, task_params, root.input.train)
    times = []
    for _ in range(spec["train_steps"]):
        start = time.perf_counter()
        finite, _ = step.run(1)
        step.placement.host(finite).numpy()
        times.append(time.perf_counter() - start)
    peak = peak_rss_bytes(os.getpid()) / 2**20
    print(json.dumps({"times": times, "peak_rss_mib": peak}), flush=True)
    os._exit(0)


# ------------------------------------------------------------------------------------------ driver
def timed_steps(steps: int) -> int:
    """How many of ``steps`` a measured step is the median of where the step must stand for a long
    run's (the calibration's trials, the plan benchmark's plans): all but the first two (the first
    traces the step, the second still warms it), at least one."""
    return max(steps - 2, 1)


def measure_plan(
    model: str,
    bindings: list[str],
    plan_text: str,
    stages: int,
    train_steps: int,
    timeout: float,
    timed_steps: int = 3,
) -> dict:
    """Trains experiment ``model`` (with gin ``bindings``) under the params of ``plan_text`` with
    ``stages`` stage processes (0: in one process): {"ok", "step_s" (the median of the last
    ``timed_steps``), "step_times_s" (every step, the first tracing), "peaks_mib" (trainer first)},
    or {"ok": False, "why"}."""
    spec = {
        "model": model,
        "bindings": bindings,
        "plan_text": plan_text,
        "mode": "stages" if stages else "in_process",
        "train_steps": train_steps,
    }
    specs = []
    if stages:
        ports = free_ports(stages)
        spec["cluster_spec"] = "worker=" + ",".join(f"127.0.0.1:{p}" for p in ports)
        specs = [dict(spec, stage=True, task_index=k) for k in range(stages)]
    procs = []
    with tempfile.TemporaryDirectory(prefix="plan_bench_") as tmp:
        try:
            for i, s in enumerate(specs + [spec]):
                with open(f"{tmp}/{i}.out", "w") as out, open(f"{tmp}/{i}.err", "w") as err:
                    procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "trainer.planning.trial", f"--worker={json.dumps(s)}"],
                            cwd=REPO_ROOT,
                            stdout=out,
                            stderr=err,
                        )
                    )
            trainer = procs[-1]
            stage_peaks = [0.0] * len(specs)
            deadline = time.monotonic() + timeout
            while trainer.poll() is None:
                for k, proc in enumerate(procs[:-1]):
                    if proc.poll() is None:
                        stage_peaks[k] = max(stage_peaks[k], _peak_mib(proc.pid))
                if time.monotonic() > deadline:
                    return {"ok": False, "why": f"not done within {timeout:g} s"}
                time.sleep(0.3)
            lines = [x for x in open(f"{tmp}/{len(specs)}.out").read().splitlines() if x.startswith("{")]
            if trainer.returncode != 0 or not lines:
                tail = (open(f"{tmp}/{len(specs)}.err").read().strip().splitlines() or ["(no output)"])[-1]
                return {"ok": False, "why": f"exited {trainer.returncode}: {tail[:200]}"}
            for k, proc in enumerate(procs[:-1]):
                stage_peaks[k] = max(stage_peaks[k], _peak_mib(proc.pid))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    result = json.loads(lines[-1])
    times = result["times"]
    return {
        "ok": True,
        "step_s": statistics.median(times[-timed_steps:]),
        "step_times_s": [round(t, 6) for t in times],
        "peaks_mib": [round(result["peak_rss_mib"], 1)] + [round(p, 1) for p in stage_peaks],
    }


def _peak_mib(pid: int) -> float:
    try:
        return peak_rss_bytes(pid) / 2**20
    except (OSError, RuntimeError):
        return 0.0


if __name__ == "__main__":
    if len(sys.argv) != 2 or not sys.argv[1].startswith("--worker="):
        sys.exit("usage: python -m trainer.planning.trial --worker=JSON (started by measure_plan)")
    sys.exit(run_worker(json.loads(sys.argv[1].partition("=")[2])))
