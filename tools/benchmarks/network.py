"""Pipeline or replicas over a link, as JSON lines: ``python -m tools.benchmark network [--quick]``.

One model, the dense stack of ``tools.benchmark gpipe`` (16 layers of width 1024, relu, squared
error, plain SGD, global batch 4096), trained on two hosts apart (``tools/local_hosts.py``: network
namespaces on one bridge, root needed) in two placements, one core per process:

- ``pipeline``: GPipe K=2, M=8, fill-drain, remat never (``remote.py``'s cross-process pipeline: the
  client process serves stage 0 on host 0, stage 1 serves on host 1). Per step, M activations cross
  the link forward and M gradients backward, (batch / M) x width x 4 bytes each.
- ``replicas``: two sync replicas (``MultiWorkerMirroredStrategy``, ring all-reduce), one per host,
  each on half the batch. Per step, each replica sends and receives the gradient's bytes.

For each link rate (``--rates``: 100, 1000 and 10000 Mbit/s each way, and ``unlimited``) the links'
``tbf`` is set, a bulk TCP transfer from host 0 to host 1 measures what the link carries
(``measured_link_mbit``), and both placements step in alternating rounds (the best step counts).
``bytes_per_step`` is what crossed host 0's link in the best step, both directions, headers included.

``predicted_step_s`` is ``layers/parallel/pipeline/network.py``'s, at the measured link rate, from
costs measured without any network in the same rounds as that rate's steps (``Costs``: the root
namespace, one core, one intra-op thread, the best of the rounds): the pipeline's from one stage's
layers at the micro-batch size (forward; forward and backward), through the simulator with the
link; the replicas' from one replica's whole step on half the batch, plus the ring all-reduce of the
gradient; each with ``host_mbit``, the hosts' own work per byte (gRPC's copies and serialization, the
ring's sums: ``Link.host_mbit``; a hand-off streams, so the slower of host and link counts, while a
ring hop's sum comes between its receive and its send, so the two add), fitted for each placement
on its step over the unlimited link (``host_fitted_here``: that line's prediction is the fit, not a
test of the model; without an unlimited rate in ``--rates``, none). Then ``network_crossover_mbit``:
the rate below which the pipeline's step is the shorter, predicted (the model's, bisected, from the
best costs of all rounds) and measured (interpolated in log rate between the measured points);
where there is none (null), ``predicted_faster_everywhere`` and ``measured_faster_everywhere`` name
the placement that wins at every rate. Lines carry the 1-minute load average.

``--quick`` (a smoke test: 4 layers of width 128, batch 256, M=4, rates 20 and unlimited, 2 rounds;
the figures mean little). Where hosts cannot be made (not root, no ``ip``/``tc``), one line
``{"name": "network", "skipped": REASON}`` and exit 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from tools.benchmarks import harness, remote

NAME = "network"
LINK_TEST_PORT = 5201


# ------------------------------------------------------------------------------------------ workers
def run_pipeline_client(spec: dict) -> int:
    """The pipeline's client, serving stage 0 too; connected as the cluster's chief at its host's
    address (the stage on the other host must reach it)."""
    tf = harness.configure(spec)
    server = remote.start_server({**spec, "addresses": spec["addresses"]}, 0)
    cluster = tf.train.ClusterSpec({"worker": spec["addresses"], "chief": [spec["client_address"]]})
    tf.config.experimental_connect_to_cluster(cluster, job_name="chief", make_master_device_default=False)
    devices = [f"/job:worker/replica:0/task:{k}/device:CPU:0" for k in range(len(spec["addresses"]))]
    step, _ = remote.client_step(spec, devices)
    code = harness.serve(spec, step)
    del server
    remote.end_serving()
    return code


def run_replica(spec: dict) -> int:
    """One of the sync replicas: the plain stack on its half of the batch, gradients all-reduced."""
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": spec["addresses"]}, "task": {"type": "worker", "index": spec["task"]}}
    )
    tf = harness.configure(spec)
    from layers.base_layer import FPropContext
    from tools.benchmarks import gpipe

    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    shape = [spec["batch"] // len(spec["addresses"]), spec["width"]]
    with strategy.scope():
        model = gpipe._model({**spec, "model": "plain"})
    variables = model.trainable_variables
    x = tf.random.stateless_normal(shape, [1, spec["task"]])
    target = tf.random.stateless_normal(shape, [3, spec["task"]])

    def replica_step() -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(FPropContext(training=True), x) - target))
        grads = tape.gradient(loss, variables)
        grads = tf.distribute.get_replica_context().all_reduce("mean", grads)
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)
        return loss

    @tf.function(autograph=False)
    def step() -> Any:
        return strategy.reduce("mean", strategy.run(replica_step), axis=None)

    code = harness.serve(spec, step)
    remote.end_serving()
    return code


LINK_RECEIVER = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1); s.settimeout(60)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(60)
first = c.recv(1 << 20); start = time.perf_counter(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n * 8 / (time.perf_counter() - start) / 1e6, flush=True)
"""
LINK_SENDER = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
data = b"x" * (1 << 20); end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    c.sendall(data)
c.close()
"""


# ------------------------------------------------------------------------------------------ driver
class HostWorker(harness.Worker):
    """A ``harness.Worker`` on one of ``hosts`` (its command run in that host's namespace)."""

    def __init__(self, hosts: Any, host: int, spec: dict) -> None:
        self._key = json.dumps(spec, sort_keys=True)
        self._log = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, "-m", f"tools.benchmarks.{NAME}", f"--worker={self._key}"]
        self._proc = subprocess.Popen(
            hosts.command(host, command),
            cwd=harness.REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )

    def send(self, line: str) -> None:
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()


def measure_link(hosts: Any, seconds: float) -> float:
    """Mbit/s a bulk TCP transfer from host 0 to host 1 gets, over ``seconds``."""
    receiver = subprocess.Popen(
        hosts.command(1, [sys.executable, "-c", LINK_RECEIVER, str(LINK_TEST_PORT)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if receiver.stdout.readline().strip() != "ready":
            raise RuntimeError("the link test's receiver did not start")
        sender = [sys.executable, "-c", LINK_SENDER, hosts.address(1), str(LINK_TEST_PORT), str(seconds)]
        subprocess.run(hosts.command(0, sender), check=True, timeout=seconds + 60)
        out, _ = receiver.communicate(timeout=60)
        return float(out.strip())
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


class Costs:
    """The network-free costs, measured in the root namespace on one core with one intra-op thread,
    in the same rounds as the placements' steps (so both see the same machine load): one stage's layers
    at the micro-batch size (forward; forward and backward) and one replica's step on half the batch.
    Under ``--quick`` the three share one worker process."""

    SIDES = ("stage_forward", "stage_gradients", "replica")

    def __init__(self, args: argparse.Namespace, cpus: list[int]) -> None:
        base = dict(width=args.width, activation="relu", warmup=args.warmup, measure="time", model="plain")
        base.update(cpus=cpus[:1], intra_op_threads=1, inter_op_threads=1, logical_devices=1)
        base.update(stages=1, micro_batches=1, remat="never")
        stage = dict(base, depth=args.depth // 2, batch=args.batch // args.micro_batches)
        specs = {
            "stage_forward": dict(stage, step="forward"),
            "stage_gradients": dict(stage, step="gradients"),
            "replica": dict(base, depth=args.depth, batch=args.batch // 2),
        }
        self.shared = args.quick
        if self.shared:
            group = {k: v for k, v in base.items() if k in harness.PROCESS_SETTINGS}
            self.workers = {"all": harness.Worker("gpipe", {**group, "sides": specs})}
        else:
            self.workers = {side: harness.Worker("gpipe", spec) for side, spec in specs.items()}

    def ready(self) -> None:
        for worker in self.workers.values():
            worker.read()

    def round(self) -> dict[str, float]:
        """One step of each side: their seconds."""
        if self.shared:
            return {side: self.workers["all"].ask(f"step {side}")["step_s"] for side in self.SIDES}
        return {side: self.workers[side].step() for side in self.SIDES}

    @staticmethod
    def best(rounds: list[dict[str, float]]) -> dict[str, float]:
        """The model's costs from the best step of each side over ``rounds``."""
        forward = min(r["stage_forward"] for r in rounds)
        return {
            "forward": forward,
            "backward": max(0.0, min(r["stage_gradients"] for r in rounds) - forward),
            "replica": min(r["replica"] for r in rounds),
        }

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()


def _models(args: argparse.Namespace, costs: dict[str, float]) -> dict[str, Any]:
    """The model's step seconds of each placement, as functions of the link rate (Mbit/s) and the
    hosts' own rate (``Link.host_mbit``; None: free)."""
    from layers.parallel.pipeline import network, simulator

    stage_costs = simulator.StageCosts.given([costs["forward"]] * 2, [costs["backward"]] * 2)
    handoff = args.batch // args.micro_batches * args.width * 4
    gradient = args.depth * (args.width * args.width + args.width) * 4

    def pipeline(rate: float, host: float | None) -> float:
        link = network.Link(rate, host_mbit=host)
        return simulator.simulate(
            "fill_drain", args.micro_batches, "never", stage_costs, 1, link, handoff
        ).step_time

    def replicas(rate: float, host: float | None) -> float:
        return network.replicas_step(costs["replica"], gradient, 2, network.Link(rate, host_mbit=host))

    return {"pipeline": pipeline, "replicas": replicas}


def _line(name: str, **fields: Any) -> None:
    print(json.dumps({"name": name, **fields, "loadavg_1m": round(os.getloadavg()[0], 2)}), flush=True)


def _run(args: argparse.Namespace, cpus: list[int]) -> None:
    from layers.parallel.pipeline import network
    from tools import local_cluster, local_hosts

    cost_workers = Costs(args, cpus)
    every_round: list[dict[str, float]] = []
    dense = dict(width=args.width, depth=args.depth, batch=args.batch, activation="relu")
    dense.update(warmup=args.warmup, measure="time", system_allocator=True)
    results: list[tuple[float | None, float, str, float, int, dict[str, float]]] = []
    with local_hosts.Hosts(2) as hosts:
        ports = local_cluster.free_ports(5)
        stage_addresses = [f"{hosts.address(k)}:{ports[k]}" for k in range(2)]
        replica_addresses = [f"{hosts.address(k)}:{ports[2 + k]}" for k in range(2)]
        threads = {"intra_op_threads": 1, "inter_op_threads": 2}
        stage = dict(addresses=stage_addresses, task=1, cpus=cpus[1:2], system_allocator=True, **threads)
        stage_proc = subprocess.Popen(
            hosts.command(
                1, [sys.executable, "-m", "tools.benchmarks.remote", f"--stage={json.dumps(stage)}"]
            ),
            cwd=harness.REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        workers: dict[str, list[HostWorker]] = {}
        try:
            if not stage_proc.stdout.readline().startswith("{"):
                raise RuntimeError(f"the pipeline's stage 1 failed to start ({stage_proc.poll()})")
            client = dict(dense, stages=2, micro_batches=args.micro_batches, remat="never", **threads)
            client.update(role="pipeline_client", addresses=stage_addresses, cpus=cpus[:1])
            client.update(client_address=f"{hosts.address(0)}:{ports[4]}")
            workers["pipeline"] = [HostWorker(hosts, 0, client)]
            workers["replicas"] = [
                HostWorker(
                    hosts,
                    k,
                    dict(
                        dense,
                        role="replica",
                        addresses=replica_addresses,
                        task=k,
                        cpus=cpus[k : k + 1],
                        intra_op_threads=1,
                        inter_op_threads=1,
                    ),
                )  # fmt: skip
                for k in range(2)
            ]
            for group in workers.values():
                for worker in group:
                    worker.read()  # ready
            cost_workers.ready()
            for rate in args.rates:
                hosts.set_rate(rate)
                link_mbit = measure_link(hosts, args.link_test_s)
                best: dict[str, tuple[float, int]] = {}
                rounds = []
                for _ in range(args.steps):
                    rounds.append(cost_workers.round())
                    for placement, group in workers.items():
                        before = hosts.link_bytes(0)
                        for worker in group:
                            worker.send("step")
                        step_s = min(worker.read()["step_s"] for worker in group[:1])
                        for worker in group[1:]:
                            worker.read()
                        moved = hosts.link_bytes(0) - before
                        if placement not in best or step_s < best[placement][0]:
                            best[placement] = (step_s, moved)
                every_round += rounds
                for placement, (step_s, moved) in best.items():
                    results.append((rate, link_mbit, placement, step_s, moved, Costs.best(rounds)))
        finally:
            cost_workers.close()
            for group in workers.values():
                for worker in group:
                    worker.close()
            if stage_proc.poll() is None:
                stage_proc.stdin.close()
                try:
                    stage_proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    stage_proc.kill()
                    stage_proc.wait()
    # The hosts' own rate of each placement, fitted on its step over the unlimited link (if run).
    host: dict[str, float | None] = {"pipeline": None, "replicas": None}
    for rate, link_mbit, placement, step_s, _, costs in results:
        if rate is None:
            model = _models(args, costs)[placement]
            host[placement] = network.fit_host_mbit(lambda h: model(link_mbit, h), step_s)  # noqa: B023
    steps: dict[str, list[tuple[float, float]]] = {"pipeline": [], "replicas": []}
    for rate, link_mbit, placement, step_s, moved, costs in results:
        predicted = _models(args, costs)[placement](link_mbit, host[placement])
        steps[placement].append((link_mbit, step_s))
        _line(
            "network_step", placement=placement, link_mbit=rate, step_s=round(step_s, 4),
            predicted_step_s=round(predicted, 4), bytes_per_step=moved,
            measured_link_mbit=round(link_mbit, 1), error=round(abs(predicted - step_s) / step_s, 4),
            host_mbit=None if host[placement] is None else round(host[placement], 1),
            host_fitted_here=rate is None,
        )  # fmt: skip
    crossing = network.interpolated_crossover(
        [r for r, _ in steps["pipeline"]],
        [s for _, s in steps["pipeline"]],
        [s for _, s in steps["replicas"]],
    )
    costs = Costs.best(every_round)
    models = _models(args, costs)
    predicted = network.crossover_mbit(
        lambda r: models["pipeline"](r, host["pipeline"]), lambda r: models["replicas"](r, host["replicas"])
    )
    model_gaps = [
        models["pipeline"](r, host["pipeline"]) - models["replicas"](r, host["replicas"]) for r in (1.0, 1e6)
    ]
    measured_gaps = [p - r for (_, p), (_, r) in zip(steps["pipeline"], steps["replicas"], strict=True)]
    _line(
        "network_crossover_mbit",
        predicted=None if predicted is None else round(predicted, 1),
        measured=None if crossing is None else round(crossing, 1),
        predicted_faster_everywhere=_faster_everywhere(model_gaps) if predicted is None else None,
        measured_faster_everywhere=_faster_everywhere(measured_gaps) if crossing is None else None,
        stage_forward_s=round(costs["forward"], 5),
        stage_backward_s=round(costs["backward"], 5),
        replica_compute_s=round(costs["replica"], 4),
        host_mbit={k: None if v is None else round(v, 1) for k, v in host.items()},
    )


def _faster_everywhere(gaps: list[float]) -> str | None:
    """The placement faster at every rate, from the pipeline's step less the replicas' at each."""
    if all(g < 0 for g in gaps):
        return "pipeline"
    if all(g > 0 for g in gaps):
        return "replicas"
    return None


def _rates(text: str) -> list[float | None]:
    error = ValueError(f"--rates={text!r}: expected Mbit/s > 0 or 'unlimited', comma-separated")
    rates: list[float | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            rates.append(None if part == "unlimited" else float(part))
        except ValueError:
            raise error from None
    if not rates or any(r is not None and not r > 0 for r in rates):
        raise error
    return rates


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark network", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rates", default="100,1000,10000,unlimited", help="Link rates, Mbit/s each way.")
    parser.add_argument("--width", type=int, default=1024, help="Dense width.")
    parser.add_argument("--depth", type=int, default=16, help="Dense layers (even: two stages).")
    parser.add_argument("--batch", type=int, default=4096, help="Global batch.")
    parser.add_argument("--micro_batches", type=int, default=8, help="M of the pipeline.")
    parser.add_argument("--link_test_s", type=float, default=2.0, help="Seconds of each link test.")
    harness.add_run_flags(parser, steps=3, warmup=1)
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.depth, args.batch, args.micro_batches = 128, 4, 256, 4
        args.rates, args.steps, args.warmup, args.link_test_s = "20,unlimited", 2, 1, 0.3
    try:
        args.rates = _rates(args.rates)
    except ValueError as e:
        parser.error(str(e))
    if args.depth % 2 or args.batch % (2 * args.micro_batches):
        parser.error("--depth must be even and --batch a multiple of 2 and of --micro_batches")
    return args


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.worker:
        spec = json.loads(args.worker)
        return run_replica(spec) if spec["role"] == "replica" else run_pipeline_client(spec)
    from tools import local_hosts

    reason = local_hosts.unavailable()
    if reason:
        print(json.dumps({"name": NAME, "skipped": reason}), flush=True)
        return 0
    started = time.monotonic()
    _run(args, harness.usable_cpus(NAME))
    print(f"network benchmark: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
