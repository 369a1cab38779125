"""``python -m tools.benchmark multiworker``: training examples/s of a cluster over one process.

Runs, one after the other on this machine, the real binary (``python -m trainer``) with the same
experiment (by default ``image.digits.WideConvNet``: a trainer's share of the batch takes about 140 ms
on one core, against about 50 ms for the 32-filter ConvNet, and each step waits on the same 5
all-reduces either way) and global batch: one trainer process pinned to one core (``--mode=train``); a
sync cluster of one trainer (``--mode=sync``, pinned to one core: what the strategy costs with no peer
to exchange with); two independent trainer processes at once (``--mode=train``, each pinned to its own
core, each with half the global batch: what a sync trainer computes, without the all-reduces; the sum of
their rates is the most two sync trainers could reach on this machine, whose two cores share caches,
memory bandwidth and a host with other tenants); 2 sync trainers (``--mode=sync``, each pinned to its
own core); and async (``--mode=async``: 2 trainers, a controller and a ps). Each process runs with one
intra- and one inter-op thread. Each reads the experiment's input as that mode does: the single
processes (one and the independent pair) through the element pipeline their checkpoints hold, sync
trainers their shards by row number where the input is in memory (``tools.benchmark input`` measures
both: on the digits, 2.5 to 2.6 ms a step for one process's 2048 examples against 1.3 ms for a sync
trainer's share, of a step of about 280 ms for the WideConvNet, 100 ms for the ConvNet). (In the async
run nothing is pinned: pinned to one core each, the async trainers never ran a step on this TF 2.21
build; the controller waited on them until the timeout.) The figure of a run is the median of the
examples/s its chief prints between log lines (the first ``--skip_lines`` lines, which include tracing,
are left out; for the independent pair, the sum of both processes' medians). The sides take turns for
``--rounds`` rounds, and each side's figure is its best round: a side's run cannot be alternated step by
step with the others' (each is a cluster of processes), and load only ever slows a run, so the best
round is the least disturbed. Prints one JSON line per run (with its round) and one with the ratios of
the best rounds, each with the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from tools import local_cluster

RATE = re.compile(r"step (\d+)/\d+ .* ([\d.]+) examples/s")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark multiworker")
    parser.add_argument(
        "--model",
        default="image.digits.WideConvNet",
        help="Experiment to train (image.digits.ConvNet: the 32-filter net, half the compute per step).",
    )
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="A knob binding for every process, e.g. 'ConvNet.num_layers = 3' (repeatable).",
    )
    parser.add_argument(
        "--batch_size",
        type=int,
        default=2048,
        help="Global batch (all workers together). Large, so that a step's compute outweighs its 5 "
        "all-reduces (~0.75 ms each between 2 processes on loopback); the 1257 training digits repeat "
        "within a batch.",
    )
    parser.add_argument("--steps", type=int, default=200, help="Steps of each run.")
    parser.add_argument("--log_every", type=int, default=25, help="Steps between the rates read.")
    parser.add_argument("--skip_lines", type=int, default=2, help="First rate lines left out (warm-up).")
    parser.add_argument("--no_async", action="store_true", help="Skip the async run.")
    parser.add_argument(
        "--no_sync1", action="store_true", help="Skip the run of a sync cluster of 1 worker (1 core)."
    )
    parser.add_argument(
        "--no_independent",
        action="store_true",
        help="Skip the run of 2 independent processes (1 core and half the batch each).",
    )
    parser.add_argument("--timeout", type=float, default=300, help="Seconds a run may take.")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="Times each side runs, in turn (one, sync1, independent, sync, async, then again); its best "
        "round counts.",
    )
    return parser.parse_args(argv[1:])


def _override(args: argparse.Namespace, batch_size: int) -> str:
    return "; ".join(
        [
            f"task.train.max_steps : {args.steps}",
            f"task.train.log_interval_steps : {args.log_every}",
            "task.train.summary_interval_steps : 0",
            "task.train.save_interval_steps : 0",
            "task.train.save_interval_seconds : 0",
            f"input.train.batch_size : {batch_size}",
            "cluster.intra_op_threads : 1",
            "cluster.inter_op_threads : 1",
        ]
    )


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _run(tasks: list[local_cluster.Task], pins: dict[str, int], timeout: float) -> list[list[float]]:
    """Runs the processes of a side; returns the rates each one that ends by itself printed (in a
    cluster only the chief prints them)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    procs = []
    chief = next(t for t in tasks if not t.server)
    try:
        for t in tasks:
            core = pins.get(t.name)
            preexec = (lambda c=core: os.sched_setaffinity(0, {c})) if core is not None else None
            out = tempfile.TemporaryFile(mode="w+")
            proc = subprocess.Popen(
                t.command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, preexec_fn=preexec
            )
            procs.append((t, proc, out))
        chief_proc = next(p for t, p, _ in procs if t is chief)
        try:
            chief_proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tails = []
            for t, _, o in procs:
                o.seek(0)
                tails.append(f"[{t.name}] " + o.read()[-1500:])
            tail = "\n".join(tails)
            raise RuntimeError(f"{chief.name} still running after {timeout} s:\n{tail}") from None
        if not chief.server and len(procs) > 1:
            deadline = time.monotonic() + 30
            for t, p, _ in procs:  # sync workers end on their own; async servers are stopped
                if t.server:
                    p.terminate()
                else:
                    p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    rates = []
    for t, p, out in procs:
        out.seek(0)
        text = out.read()
        out.close()
        if t.server:
            continue
        if p.returncode != 0:
            raise RuntimeError(f"{t.name} failed ({p.returncode}):\n{text[-2000:]}")
        rates.append([float(m.group(2)) for m in RATE.finditer(text)])
    return rates


def _figure(name: str, rates: list[list[float]], skip: int, workers: int) -> dict:
    """The sum over the processes that printed rates of each one's median (after ``skip`` lines)."""
    kept = [r[skip:] or r for r in rates if r]
    medians = [statistics.median(r) for r in kept]
    figure = {
        "benchmark": "multiworker",
        "run": name,
        "workers": workers,
        "examples_per_sec": round(sum(medians), 1) if medians else None,
        "rate_lines": sum(len(r) for r in kept),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    if len(medians) > 1:
        figure["per_process"] = [round(m, 1) for m in medians]
    return figure


def _sides(args: argparse.Namespace, cores: list[int], logdir: str) -> list[tuple[str, str, int, list, dict]]:
    """(key, name, workers, tasks, pins) of each side, its logs under ``logdir``."""

    def run_flags(batch_size: int) -> list[str]:
        gin = [f"--gin_param={binding}" for binding in args.gin_param]
        return [f"--model={args.model}", f"--params_override={_override(args, batch_size)}", *gin]

    flags = run_flags(args.batch_size)

    def alone(index: int, name: str, batch_size: int) -> local_cluster.Task:
        command = [sys.executable, "-m", "trainer", "--job=controller,trainer", f"--logdir={logdir}/{name}"]
        return local_cluster.Task("trainer", index, [*command, *run_flags(batch_size)])

    pins = {"trainer:0": cores[0], "trainer:1": cores[1]}
    sides = [("one", "1 process, 1 core", 1, [alone(0, "one", args.batch_size)], pins)]
    if not args.no_sync1:  # the strategy's own cost: collectives with no peer to wait for
        tasks = local_cluster.tasks(1, 0, [f"--logdir={logdir}/sync1", *flags])
        sides.append(("sync1", "1 sync worker, 1 core", 1, tasks, pins))
    if not args.no_independent:  # the machine's own limit: two cores that share caches and memory
        pair = [alone(i, f"independent{i}", args.batch_size // 2) for i in (0, 1)]
        name = "2 independent processes, 1 core and half the batch each"
        sides.append(("independent", name, 2, pair, pins))
    tasks = local_cluster.tasks(2, 0, [f"--logdir={logdir}/sync", *flags])
    sides.append(("sync", "2 sync workers, 1 core each", 2, tasks, pins))
    if not args.no_async:
        # Unpinned: with each trainer pinned to one core, the trainers of TF 2.21 never ran a step.
        tasks = local_cluster.tasks(2, 1, [f"--logdir={logdir}/async", *flags])
        sides.append(("async", "async: 2 trainers, a controller and a ps, all unpinned", 2, tasks, {}))
    return sides


def best_rates(runs: list[tuple[str, dict]]) -> dict[str, float]:
    """Each side's best examples/s over its rounds' figures (a run without rate lines counts none)."""
    best: dict[str, float] = {}
    for key, figure in runs:
        if figure["examples_per_sec"] is not None:
            best[key] = max(best.get(key, 0.0), figure["examples_per_sec"])
    return best


def ratios_of(best: dict[str, float]) -> dict:
    """The ratios of the sides' best rates (``one`` and ``sync`` present); each product of two is
    ``sync_over_one``."""
    ratios: dict = {"sync_over_one": round(best["sync"] / best["one"], 3), "examples_per_sec": best}
    if "sync1" in best:  # sync_over_one = sync1_over_one * sync_over_sync1
        ratios["sync1_over_one"] = round(best["sync1"] / best["one"], 3)
        ratios["sync_over_sync1"] = round(best["sync"] / best["sync1"], 3)
    if "independent" in best:  # sync_over_one = independent_over_one * sync_over_independent
        ratios["independent_over_one"] = round(best["independent"] / best["one"], 3)
        ratios["sync_over_independent"] = round(best["sync"] / best["independent"], 3)
    if "async" in best:
        ratios["async_over_one"] = round(best["async"] / best["one"], 3)
    return ratios


def main(argv: list[str]) -> int:
    args = _parse(argv)
    cores = _cores()
    if len(cores) < 2:
        print("multiworker: needs 2 cores to pin 2 workers", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("multiworker: --rounds must be >= 1", file=sys.stderr)
        return 2
    if args.batch_size < 2 or args.batch_size % 2:
        print(f"multiworker: --batch_size must be even (2 workers), got {args.batch_size}", file=sys.stderr)
        return 2
    runs: list[tuple[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="multiworker-") as tmp:
        for r in range(1, args.rounds + 1):
            for key, name, workers, tasks, pins in _sides(args, cores, f"{tmp}/round{r}"):
                try:
                    rates = _run(tasks, pins, args.timeout)
                except RuntimeError as e:
                    print(f"multiworker: {name}: {e}", file=sys.stderr)
                    return 1
                figure = _figure(name, rates, args.skip_lines, workers)
                print(json.dumps({**figure, "round": r}), flush=True)
                runs.append((key, figure))
    best = best_rates(runs)
    if "one" not in best or "sync" not in best:
        print("multiworker: a run printed no rate lines; use more --steps", file=sys.stderr)
        return 1
    ratios = {"benchmark": "multiworker", **ratios_of(best), "rounds": args.rounds}
    load = round(os.getloadavg()[0], 2)
    ratios.update(model=args.model, gin_param=args.gin_param, global_batch=args.batch_size, steps=args.steps)
    ratios["loadavg_1m"] = load
    print(json.dumps(ratios), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
