"""GPipe stages in other processes, as JSON lines: ``python -m tools.benchmark remote [--quick]``.

The pipeline is the dense stack of ``tools.benchmark gpipe`` (``gpipe.py``'s model and step: a
GPipeLayer of dense layers, the squared error computed per micro-batch in the last stage, plain SGD).
A cross-process side is a client process (the trainer's role: it builds the model with stage k on
``/job:worker/task:k/device:CPU:0``, connected with ``tf.config.experimental_connect_to_cluster``) and
K stage processes (``tf.distribute.Server``, as ``python -m trainer --mode=stages`` runs), each with
1 intra-op and 2 inter-op threads (a stage process also answers ``reset`` and ``peak`` lines on its
stdin with its allocator's numbers: ``tools.benchmark schedules`` reads each device's peak so). The
batch and its targets are made on the first and last stage's devices once (what the stages exchange
is measured, not the trainer's input pipeline); each SGD update runs on its variable's device.

The speed figures take three comma-separated options, and every combination runs in the same
alternating rounds (one line each per figure, naming its ``schedule``, ``stage_cpus`` and ``precision``):

- ``--schedule`` (default ``fill_drain``, GPipe's; also ``one_f_one_b``, ``zb_h1``, ``zb_h2``): the
  pipeline's schedule, the same on both pipelined sides (one process and across processes). Its
  unit-time speedup (F = I = W = 1, B = I + W, no hand-off cost) is ``theory`` in the
  remote_speedup_k2 line: 2M/(M+K-1) = 1.78 for fill-drain and 1F1B, 1.92 for ZB-H1 (its bubble
  (K-1)(F+I-W) is a third of fill-drain's at K=2, and a stage hands its input gradient on before it
  computes its weight gradients).
- ``--precision`` (default ``float32``; also ``mixed_bfloat16``): ``task.precision`` of every side
  (the model built as a task's child: bfloat16 computation and hand-offs over float32 weights).
- ``--stage_cpus`` (default ``own``): ``own`` pins each stage process to its own core; ``shared``
  lets both stage processes run on the pipeline's two cores, as the one-process side's logical
  devices do (a stage alone, in the fill and drain, then runs its independent ops on the idle core).

- remote_speed_vs_local_k2: the step seconds of K=2 on logical devices in one process (gpipe.py's
  pipeline side: the same 2 cores, 1 intra-op and 2 inter-op threads) over the step seconds of K=2
  across processes. Higher is better; below 1 is the price of gRPC hand-offs (and, with
  ``--stage_cpus=own``, of stages bound to their cores).
- remote_speedup_k2: the plain stack (no GPipe layer, no remat) on one core, 1 intra-op thread, over
  the K=2 cross-process step. Speed model: 16 dense layers of width 1024, relu, global batch 4096,
  M=8, remat never. With it, from the best remote step: ``stage_cpu_s``, each stage process's CPU
  seconds, and ``stage_busy``, those over the step's seconds (1 - the stage's idle share). On this
  machine the stages cost about 1.06 and 1.11 times half the plain step's CPU seconds (512-row
  matmuls are about 5% slower than 4096-row ones; the first stage needs no gradient for its input,
  the last one computes it and the loss), so, by the schedule's timeline with those costs, an ideal
  fill-drain step reads about 1.6 and an ideal ZB-H1 step about 1.73, before any hand-off cost.
  ``bytes_per_step``: the TCP payload bytes the client and stage processes sent in a step, the
  median over the rounds (``ss``'s per-connection ``bytes_sent``).
- remote_client_cpu_share_k2: the client process's CPU seconds over wall seconds in the timed steps
  of that K=2 run: near 0 when the stages' forward, backward and updates run in the stage processes.
- remote_rss_ratio_k2, remote_rss_ratio_k4: the peak resident memory (VmHWM) of the largest process
  of the K-process pipeline (client or stage) over the peak of the same model trained in one process
  on K logical devices; same global batch, M and remat (always). Memory model: 16 dense layers of
  width 8192 (4 GiB of weights and 4 GiB of gradients per step; the one-process side peaks near
  9.4 GiB), batch 64, M=4: TensorFlow's own footprint (about 0.6 GiB resident per process here,
  measured with a tiny model) is then a sixteenth of the one-process peak, so the model decides the
  ratio. An ideal K-stage split is about (0.6 + 8/K) / (0.6 + 8) GiB: 0.54 for K=2, 0.30 for K=4.
  (At 8 layers, 2 GiB, TensorFlow's share made 0.35 the ideal at K=4 and 0.38 was measured.)

Every process of every side (stage processes, client, one-process and plain sides) takes its tensors
from malloc, as the trainer binary's processes do (``trainer/tf_startup.py``: TensorFlow's oneDNN
allocator otherwise keeps freed tensors in a pool that never shrinks, and that pool's fragmentation,
not the model, made the K=4 stages' peaks spread by 300 MiB from run to run); ``--allocator=pool``
measures the pool instead, on every side alike.

The speed sides run together and step in alternating rounds (the best step counts); the memory sides
run one after the other, a warm-up and ``--steps`` steps each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from tools.benchmarks import gpipe, harness

NAME = "remote"
FIGURES = ("speed", "rss")
SPEED_SCHEDULES = ("fill_drain", "one_f_one_b", "zb_h1", "zb_h2")  # K=2 without virtual stages
STAGE_CPUS = ("own", "shared")
PRECISIONS = ("float32", "mixed_bfloat16")  # mixed_float16's loss scaling runs in one process only


# ------------------------------------------------------------------------------------------ workers
def run_stage(spec: dict) -> int:
    """A stage process: pinned and threaded as ``spec`` says, serves until its stdin closes. Meanwhile
    it answers each ``reset`` or ``peak`` line (``MemoryProbe``): the client cannot ask another
    process's allocator."""
    harness.prepare_process(spec)  # its threads go in the server's config below
    server = start_server(spec, spec["task"])
    probe = MemoryProbe(trace=bool(spec.get("trace_allocations")))
    print(json.dumps({"ready": True, "target": server.target}), flush=True)
    for line in sys.stdin:  # the driver closes it: then this process ends
        if line.strip() in MEMORY_REQUESTS:
            print(json.dumps(probe.answer(line.strip())), flush=True)
    end_serving()


def end_serving() -> NoReturn:
    """Ends a process that served a cluster, now that its driver is done with it: at once, its output
    flushed, without the interpreter's teardown of TensorFlow's server and remote contexts (about 0.7
    CPU seconds a process here, which the driver waits for)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


MEMORY_REQUESTS = ("reset", "peak")


def start_server(spec: dict, task: int) -> Any:
    """Stage ``task``'s ``tf.distribute.Server`` (of the cluster at ``spec["addresses"]``), with the
    spec's threads."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=spec["intra_op_threads"],
        inter_op_parallelism_threads=spec["inter_op_threads"],
    )
    cluster = tf.train.ClusterSpec({"worker": spec["addresses"]})
    return tf.distribute.Server(cluster, job_name="worker", task_index=task, config=config)


class MemoryProbe:
    """Answers ``reset`` and ``peak`` about this process's allocator
    (``tf.config.experimental.get_memory_info("CPU:0")``: the server's devices and the process's own
    share the one CPU allocator; meaningful under the BFC allocator). With ``trace``, ``reset`` also
    starts recording the allocator's events (``tools.memory_trace.AllocatorTrace``) and ``peak``
    stops it and adds the tensors' own peak in between, without the BFC chunks' rounding."""

    def __init__(self, trace: bool = False) -> None:
        self.trace: Any = None
        if trace:
            from tools.memory_trace import AllocatorTrace

            self.trace = AllocatorTrace()

    def answer(self, request: str) -> dict:
        """``{"peak_bytes": ..., "current_bytes": ...}`` after ``request`` (``reset`` restarts the
        peak first, ``peak`` only reads), and ``"live_peak_bytes"`` for ``peak`` when tracing."""
        import tensorflow as tf

        live = {}
        if request == "reset":
            tf.config.experimental.reset_memory_stats("CPU:0")
            if self.trace is not None:
                self.trace.start()
        elif self.trace is not None:
            live = {"live_peak_bytes": self.trace.stop()["live_peak_bytes"]}
        info = tf.config.experimental.get_memory_info("CPU:0")
        return {"peak_bytes": int(info["peak"]), "current_bytes": int(info["current"]), **live}


def connect(spec: dict) -> tuple[list[str], Any]:
    """Sets the client process up (``harness.configure``) and connects it to the stage processes at
    ``spec["addresses"]``; returns their devices, stage k's first, and the server of stage 0 when the
    client hosts it (``spec["client_hosts_stage"]``; keep it referenced), else None."""
    tf = harness.configure(spec)
    server = start_server(spec, 0) if spec.get("client_hosts_stage") else None
    cluster = tf.train.ClusterSpec({"worker": spec["addresses"]})
    tf.config.experimental_connect_to_cluster(cluster, make_master_device_default=False)
    return [f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(len(spec["addresses"]))], server


def client_step(spec: dict, devices: list[str]) -> tuple[Any, Any]:
    """The client's compiled step over the stage processes' ``devices`` (gpipe.py's model and head,
    ``spec["schedule"]`` and ``spec["virtual_stages"]`` if given: device d runs stages d, d + K, ...)."""
    import tensorflow as tf

    from layers.base_layer import FPropContext
    from layers.parallel import device_choice as pipeline_devices
    from layers.parallel.pipeline import schedule as schedules

    with pipeline_devices.parts_on(devices, "the benchmark's stage processes"):
        model = gpipe._model({**spec, "model": "gpipe"})
    shape = [spec["batch"], spec["width"]]
    with tf.device(devices[0]):
        x = tf.random.stateless_normal(shape, [1, 2])
    last = devices[0] if spec.get("schedule") in schedules.V_SCHEDULES else devices[-1]
    with tf.device(last):  # the targets beside the last stage (device 0 in a V)
        target = tf.random.stateless_normal(shape, [3, 4])
    variables = model.trainable_variables

    def squared_errors(ctx: Any, y: Any, t: Any) -> Any:
        return tf.reduce_sum(gpipe._squared(tf, y, t), axis=-1)

    @tf.function(autograph=False)
    def step() -> Any:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            per_example = model(ctx, x, head=squared_errors, head_inputs=target)
            loss = tf.reduce_sum(per_example) / float(spec["batch"] * spec["width"])
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            with tf.device(v.device):
                v.assign_sub(0.01 * g)
        return loss

    return step, variables


def run_client(spec: dict) -> int:
    devices, _ = connect(spec)
    step, _ = client_step(spec, devices)
    return harness.serve(spec, step)


# ------------------------------------------------------------------------------------------ driver
class Pipeline:
    """K stage processes (one core each) and the client worker (``tools.benchmarks.<client>``'s, a
    ``harness.Worker``), on free loopback ports. With ``spec["stage_peaks"]`` the stage processes take
    their tensors from the BFC allocator (``ask_stages`` reads it). With ``spec["client_hosts_stage"]``
    (a smoke test: one TensorFlow start less) the client process serves stage 0 itself, on stage 0's
    core and threads, and answers its ``reset`` and ``peak`` lines."""

    def __init__(self, spec: dict, cpus: list[int], client: str = NAME) -> None:
        from tools.local_cluster import HOST, free_ports

        k = spec["stages"]
        addresses = [f"{HOST}:{p}" for p in free_ports(k)]
        self.stages: list[subprocess.Popen] = []
        self.hosted = bool(spec.get("client_hosts_stage"))
        # What every stage process is, the client too when it serves stage 0.
        peaks = bool(spec.get("stage_peaks"))
        inter_op = spec.get("stage_inter_op_threads", 2)  # 1: a device runs one op at a time
        settings = {"intra_op_threads": 1, "inter_op_threads": inter_op, "bfc_allocator": peaks}
        try:
            for task in range(1 if self.hosted else 0, k):
                stage = {
                    "addresses": addresses,
                    "task": task,
                    "cpus": stage_cpus(spec, cpus, task),
                    "system_allocator": spec.get("system_allocator", False),
                    "trace_allocations": spec.get("trace_allocations", False),
                    **settings,
                }
                proc = subprocess.Popen(
                    [sys.executable, "-m", "tools.benchmarks.remote", f"--stage={json.dumps(stage)}"],
                    cwd=harness.REPO_ROOT,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                self.stages.append(proc)
            for proc in self.stages:
                line = proc.stdout.readline()
                if not line.startswith("{"):
                    raise RuntimeError(f"a stage process failed to start ({proc.poll()})")
            client_spec = {**spec, "addresses": addresses, "client": True}
            if self.hosted:  # the client is stage 0's process too
                client_spec.update(cpus=stage_cpus(spec, cpus, 0), **settings)
            self.client = harness.Worker(client, client_spec)
        except BaseException:
            self.close()
            raise

    def ask_stages(self, line: str) -> list[dict]:
        """Sends ``line`` (``reset`` or ``peak``) to every stage process; returns their answers, stage
        0's first: ``{"peak_bytes": ..., "current_bytes": ...}`` of each one's allocator."""
        hosted = [self.client.ask(line)] if self.hosted else []
        for proc in self.stages:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
        answers = []
        for proc in self.stages:
            answer = proc.stdout.readline()
            if not answer.startswith("{"):
                raise RuntimeError(f"a stage process did not answer {line!r} ({proc.poll()})")
            answers.append(json.loads(answer))
        return hosted + answers

    def stage_cpu_seconds(self) -> list[float]:
        """Each stage process's CPU seconds so far (user and system, from /proc/<pid>/stat)."""
        return [process_cpu_seconds(p.pid) for p in self.stages]

    def bytes_sent(self) -> int:
        """The TCP payload bytes every process of the pipeline (client and stages) has sent so far on
        its open connections (``ss``'s ``bytes_sent``): what crossed the network, headers of gRPC's
        messages included, not TCP's own."""
        pids = {self.client.pid, *(p.pid for p in self.stages)}
        return socket_bytes_sent(pids)

    def peak_rss(self) -> dict[str, int]:
        peaks = {f"stage_{k}": harness.peak_rss_bytes(p.pid) for k, p in enumerate(self.stages)}
        return {"client": self.client.peak_rss_bytes(), **peaks}

    def close(self) -> None:
        if hasattr(self, "client"):
            self.client.close()
        for proc in self.stages:
            if proc.poll() is None:
                proc.stdin.close()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def socket_bytes_sent(pids: set[int]) -> int:
    """The ``bytes_sent`` of every TCP connection that a process of ``pids`` holds (``ss -tinpH``)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    total, owned = 0, False
    for line in out.splitlines():
        if not line[:1].isspace():  # a connection's line; its details follow, indented
            owned = any(f"pid={pid}," in line for pid in pids)
            continue
        if owned:
            for field in line.split():
                if field.startswith("bytes_sent:"):
                    total += int(field.split(":", 1)[1])
    return total


def stage_cpus(spec: dict, cpus: list[int], task: int) -> list[int]:
    """The CPUs stage process ``task`` may run on: its own core (``stage_cpus="own"``, the default),
    or all of the pipeline's ``stages`` cores (``"shared"``: as the logical devices of one process
    share them)."""
    if spec.get("stage_cpus", "own") == "shared":
        return cpus[: spec["stages"]]
    return [cpus[task % len(cpus)]]


def process_cpu_seconds(pid: int) -> float:
    """Process ``pid``'s user and system CPU seconds (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _theory(schedule: str, k: int, m: int) -> float:
    """The schedule's speedup over one device in unit time (F = 1, B = 2 = I + W, no hand-off cost):
    fill-drain and 1F1B 2M/(M+K-1), ZB-H1 and ZB-H2 less (their bubble is (K-1)(F+I-W))."""
    from layers.parallel.pipeline import timeline

    return k * m * 3 / timeline.step_time(timeline.events(schedule, k, m))


def _speed(
    args: argparse.Namespace, cpus: list[int], hosted: bool = False
) -> dict[tuple[str, str, str], dict]:
    """The speed figures' sides for every schedule, stage_cpus and precision, in alternating rounds;
    prints their lines and returns each remote side's ``{"speedup", "plain_step_s", "remote_step_s",
    "bytes_per_step"}`` by ``(schedule, stage_cpus, precision)``. ``hosted``: the client process
    serves stage 0 (``Pipeline``'s ``client_hosts_stage``)."""
    dense = dict(width=args.width, depth=args.depth, batch=args.batch, activation="relu", warmup=args.warmup)
    dense.update(measure="time", system_allocator=args.allocator == "system")
    pipeline = dict(dense, stages=2, micro_batches=args.micro_batches, remat="never")
    if hosted:  # the client serves stage 0 itself: one TensorFlow start less (a smoke test)
        pipeline.update(client_hosts_stage=True)
    remotes: dict[tuple[str, str, str], Pipeline] = {}
    workers: dict[Any, harness.Worker] = {}
    try:
        for policy in args.precision:
            plain_spec = dict(dense, model="plain", cpus=cpus[:1], intra_op_threads=1, inter_op_threads=1)
            workers[("plain", policy)] = harness.Worker("gpipe", _with_precision(plain_spec, policy))
            for schedule in args.schedule:
                local_spec = dict(
                    pipeline, model="gpipe_head", logical_devices=2, cpus=cpus[:2], schedule=schedule
                )
                local_spec.update(intra_op_threads=1, inter_op_threads=2)
                workers[("local", schedule, policy)] = harness.Worker(
                    "gpipe", _with_precision(local_spec, policy)
                )
                for where in args.stage_cpus:
                    client_spec = dict(pipeline, cpus=cpus[:2], intra_op_threads=1, inter_op_threads=2)
                    client_spec.update(schedule=schedule, stage_cpus=where)
                    side = (schedule, where, policy)
                    remotes[side] = Pipeline(_with_precision(client_spec, policy), cpus)
                    workers[side] = remotes[side].client
        for worker in workers.values():
            worker.read()  # ready
        times: dict[Any, list[float]] = {side: [] for side in workers}
        cpu_share: dict[Any, list[float]] = {side: [] for side in remotes}
        stage_cpu: dict[Any, list[list[float]]] = {side: [] for side in remotes}
        sent: dict[Any, list[int]] = {side: [] for side in remotes}
        for _ in range(args.steps):
            for side, worker in workers.items():
                before = remotes[side].stage_cpu_seconds() if side in remotes else []
                bytes_before = remotes[side].bytes_sent() if side in remotes else 0
                result = worker.step_result()
                times[side].append(result["step_s"])
                if side in remotes:
                    sent[side].append(remotes[side].bytes_sent() - bytes_before)
                    cpu_share[side].append(result["cpu_s"] / result["step_s"])
                    after = remotes[side].stage_cpu_seconds()
                    stage_cpu[side].append([a - b for a, b in zip(after, before)])
    finally:
        for side, worker in workers.items():
            if side not in remotes:
                worker.close()
        for remote in remotes.values():
            remote.close()
    best = {side: min(t) for side, t in times.items()}
    sizes = dict(width=args.width, depth=args.depth, batch=args.batch, micro_batches=args.micro_batches)
    results = {}
    for (schedule, where, policy), remote_s in ((side, best[side]) for side in remotes):
        local_s, plain_s = best[("local", schedule, policy)], best[("plain", policy)]
        steps = dict(
            remote_step_s=round(remote_s, 4), local_step_s=round(local_s, 4), plain_step_s=round(plain_s, 4)
        )
        variant = dict(schedule=schedule, stage_cpus=where, precision=policy)
        side = (schedule, where, policy)
        in_best = stage_cpu[side][times[side].index(remote_s)]
        stages = dict(  # the best step's: each stage process's CPU seconds, and over the step's seconds
            stage_cpu_s=[round(c, 3) for c in in_best], stage_busy=[round(c / remote_s, 3) for c in in_best]
        )
        bytes_per_step = int(statistics.median(sent[side]))
        harness.emit("remote_speed_vs_local_k2", local_s / remote_s, **variant, **steps, **sizes)
        theory = round(_theory(schedule, 2, args.micro_batches), 4)
        harness.emit(
            "remote_speedup_k2", plain_s / remote_s, **variant, theory=theory, **steps, **stages,
            bytes_per_step=bytes_per_step, **sizes,
        )  # fmt: skip
        harness.emit(
            "remote_client_cpu_share_k2",
            statistics.median(cpu_share[side]),
            **variant,
            per_step=[round(c, 3) for c in cpu_share[side]],
            **sizes,
        )
        results[side] = dict(
            speedup=plain_s / remote_s, plain_step_s=plain_s, remote_step_s=remote_s,
            bytes_per_step=bytes_per_step,
        )  # fmt: skip
    return results


def _with_precision(spec: dict, policy: str) -> dict:
    """``spec`` under ``task.precision = policy`` (float32: unchanged, as the figures always ran)."""
    return spec if policy == "float32" else dict(spec, precision=policy)


def _rss(args: argparse.Namespace, cpus: list[int]) -> None:
    for k in (2, 4):
        spec = dict(
            width=args.memory_width,
            depth=args.memory_depth,
            batch=args.memory_batch,
            activation="relu",
            stages=k,
            micro_batches=args.memory_micro_batches,
            remat="always",
            warmup=args.warmup,
            measure="time",
            system_allocator=args.allocator == "system",
        )
        one = harness.Worker("gpipe", dict(spec, model="gpipe_head", logical_devices=k, cpus=cpus))
        try:
            one.read()
            for _ in range(args.steps):
                one.step()
            one_peak = one.peak_rss_bytes()
        finally:
            one.close()
        remote = Pipeline(dict(spec, cpus=cpus, intra_op_threads=1, inter_op_threads=2), cpus)
        try:
            remote.client.read()
            for _ in range(args.steps):
                remote.client.step()
            peaks = remote.peak_rss()
        finally:
            remote.close()
        mib = {name: round(b / 2**20, 1) for name, b in peaks.items()}
        harness.emit(
            f"remote_rss_ratio_k{k}",
            max(peaks.values()) / one_peak,
            one_process_peak_mib=round(one_peak / 2**20, 1),
            pipeline_peak_mib=mib,
            width=args.memory_width,
            depth=args.memory_depth,
            batch=args.memory_batch,
            weight_mib=round(args.memory_depth * args.memory_width**2 * 4 / 2**20, 1),
        )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark remote", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--figures", default=",".join(FIGURES), help=f"Comma-separated subset of {FIGURES}.")
    parser.add_argument("--width", type=int, default=1024, help="Dense width (speed figures).")
    parser.add_argument("--depth", type=int, default=16, help="Dense layers (speed figures).")
    parser.add_argument("--batch", type=int, default=4096, help="Global batch (speed figures).")
    parser.add_argument("--micro_batches", type=int, default=8, help="M (speed figures).")
    parser.add_argument(
        "--schedule",
        default="fill_drain",
        help=f"Comma-separated pipeline schedules of the speed figures, from {SPEED_SCHEDULES}: each "
        "runs on both pipelined sides (local and remote), all in the same alternating rounds.",
    )
    parser.add_argument(
        "--stage_cpus",
        default="own",
        help="Comma-separated, from own (each stage process pinned to its own core) and shared (each "
        "may run on the pipeline's two cores, as the local side's logical devices do).",
    )
    parser.add_argument(
        "--precision",
        default="float32",
        help="Comma-separated task.precision policies of the speed figures, from float32 and "
        "mixed_bfloat16: each on every side (plain, local and remote), all in the same rounds.",
    )
    parser.add_argument("--memory_width", type=int, default=8192, help="Dense width (memory figures).")
    parser.add_argument("--memory_depth", type=int, default=16, help="Dense layers (memory figures).")
    parser.add_argument("--memory_batch", type=int, default=64, help="Global batch (memory figures).")
    parser.add_argument("--memory_micro_batches", type=int, default=4, help="M (memory figures).")
    parser.add_argument(
        "--allocator",
        choices=("system", "pool"),
        default="system",
        help="Where every process of every side takes its tensors from: system (malloc, as the "
        "trainer binary's processes do: trainer/tf_startup.py) or pool (TensorFlow's default under "
        "oneDNN, a pool that never shrinks).",
    )
    harness.add_run_flags(parser, steps=4, warmup=1)
    parser.add_argument("--stage", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.schedule = _choices(parser, "--schedule", args.schedule, SPEED_SCHEDULES)
    args.stage_cpus = _choices(parser, "--stage_cpus", args.stage_cpus, STAGE_CPUS)
    args.precision = _choices(parser, "--precision", args.precision, PRECISIONS)
    if args.quick:
        args.width, args.depth, args.batch = 64, 8, 64
        args.memory_width, args.memory_depth, args.memory_batch = 256, 8, 16
        args.steps, args.warmup = 2, 1
    return args


def _choices(parser: argparse.ArgumentParser, flag: str, text: str, known: tuple[str, ...]) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(known))
    if unknown or not chosen:
        parser.error(f"{flag}: unknown {unknown or 'empty list'}; choose from {', '.join(known)}")
    return list(dict.fromkeys(chosen))


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.stage:
        return run_stage(json.loads(args.stage))
    if args.worker:
        spec = json.loads(args.worker)
        return run_client(spec) if spec.get("client") else 1
    figures = harness.chosen_figures(NAME, args.figures, FIGURES)
    if figures is None:
        return 2
    cpus = harness.usable_cpus(NAME)
    started = time.monotonic()
    if "speed" in figures:
        _speed(args, cpus)
    if "rss" in figures:
        _rss(args, cpus)
    print(f"remote benchmark: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
