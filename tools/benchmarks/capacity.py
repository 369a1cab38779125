"""``python -m tools.benchmark capacity``: GPipe's Table 1 for this machine, the largest Transformer LM
each placement trains a few steps with every process under a memory budget.

The family: pre-norm Transformer LMs of ``layers x width`` (hidden 4 x width, 4 heads, the synthetic
36-token vocabulary, sequences of 32, batch 8, Adam), climbed in the order of ``LADDER`` until a size
fails: a process ends with an error (out of memory), or the peak resident memory (``ru_maxrss``) of
one of the row's processes is over ``--budget_mib``. A row of the table is one ``Row``: a name
(``placement`` in the JSON line), the number of processes, and the experiment and gin bindings of
one size; each process is a worker (``--worker=JSON``) that builds the experiment's ``TrainStep``
where its placement says, trains ``--train_steps`` steps, and prints its peak and the parameters.

    one_process_plain   lm.synthetic.TransformerLM in one process
    one_process_remat   lm.synthetic.GPipeTransformerLM, 1 stage, 4 micro-batches, remat always
    mesh_k2, mesh_k4    lm.synthetic.MeshTransformerLM on a [1, K] mesh over K processes (--mode=mesh's
                        placement): every split weight cut across the processes

A placement across processes of another kind (GPipe stages in K processes) is one more ``Row`` in
``ROWS`` whose worker builds its ``TrainStep`` in ``build_step``. Figures: ``capacity_params`` per row
(with ``placement``), and ``capacity_ratio_gpipe_k4`` (its parameters over plain's) when such a row
exists; then the table a person reads.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable

from tools.benchmarks import harness

LADDER = [(2, 128), (4, 256), (8, 256), (8, 512), (16, 512), (16, 768), (24, 1024), (32, 1024), (48, 1024)]
QUICK_LADDER = [(1, 32), (2, 64)]
BASE = {"num_heads": 4, "seq_length": 32, "batch_size": 8, "warmup_steps": 1, "max_steps": 10}


@dataclasses.dataclass(frozen=True)
class Row:
    """One placement of the table: ``processes`` workers train ``model`` with ``bindings(layers, width)``
    (gin knobs), the worker's ``mode`` saying how it places the step."""

    placement: str
    processes: int
    model: str
    knobs: Callable[[int, int], dict]
    mode: str  # "one_process" or "mesh"


def _mesh_knobs(k: int) -> Callable[[int, int], dict]:
    return lambda layers, width: {"data_parallel": 1, "model_parallel": k}


ROWS = [
    Row("one_process_plain", 1, "lm.synthetic.TransformerLM", lambda layers, width: {}, "one_process"),
    Row(
        "one_process_remat",
        1,
        "lm.synthetic.GPipeTransformerLM",
        lambda layers, width: {"num_stages": 1, "num_micro_batches": 4, "remat": "'always'"},
        "one_process",
    ),
    Row("mesh_k2", 2, "lm.synthetic.MeshTransformerLM", _mesh_knobs(2), "mesh"),
    Row("mesh_k4", 4, "lm.synthetic.MeshTransformerLM", _mesh_knobs(4), "mesh"),
]


def bindings(row: Row, layers: int, width: int) -> list[str]:
    name = row.model.rpartition(".")[2]
    knobs = dict(BASE, num_layers=layers, model_dim=width, hidden_dim=4 * width, **row.knobs(layers, width))
    return [f"{name}.{k} = {v}" for k, v in knobs.items()]


# ------------------------------------------------------------------------------------------ worker
def build_step(spec: dict):
    """The worker's ``TrainStep``, placed as its row says (TensorFlow set up first)."""
    from params import experiment
    from trainer import cluster
    from trainer.distributed import mesh_cluster
    from trainer.distributed.mesh_placement import make_train_step
    from trainer.train_step import TrainStep

    root = experiment.resolve(spec["model"], gin_bindings=spec["bindings"])
    task_params = experiment.task_params_for(root, "train")
    if spec["mode"] == "mesh":
        role = mesh_cluster.resolve_role(spec["cluster_spec"], spec["task_index"])
        per_process = mesh_cluster.devices_per_process(root.cluster, len(role.cluster["worker"]))
        cluster.configure(root.cluster.copy().set(num_logical_cpu_devices=per_process))
        mesh = mesh_cluster.connect(role, root.cluster)
        return TrainStep(task_params, root.input.train, mesh_cluster.MeshAcrossProcesses(mesh, role))
    cluster.configure(root.cluster)
    return make_train_step(root.cluster, task_params, root.input.train)


def run_worker(spec: dict) -> int:
    harness.configure({"intra_op_threads": 1, "inter_op_threads": 2})
    step = build_step(spec)
    params = sum(int(v.shape.num_elements()) for v in step.task.trainable_variables)
    finite, _ = step.run(spec["train_steps"])
    finite = step.placement.host(finite)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"peak_rss_mib": round(peak, 1), "params": params, "finite": bool(finite.numpy())}))
    sys.stdout.flush()
    # Nothing is left to write, and a DTensor client's teardown can wait up to a minute on a
    # coordination service whose host (task 0) already left: end now.
    os._exit(0)


# ------------------------------------------------------------------------------------------ driver
def trial(row: Row, layers: int, width: int, train_steps: int, timeout: float) -> dict:
    """One size on one row: every process's result, or the error of the first that failed."""
    from tools import local_cluster

    spec_base = {"model": row.model, "bindings": bindings(row, layers, width), "mode": row.mode}
    spec_base["train_steps"] = train_steps
    if row.mode == "mesh":
        spec_base["cluster_spec"] = local_cluster.cluster_spec(
            row.processes, 0, local_cluster.free_ports(row.processes)
        )
    procs = []
    try:
        for index in range(row.processes):
            spec = dict(spec_base, task_index=index)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tools.benchmarks.capacity", f"--worker={json.dumps(spec)}"],
                    cwd=harness.REPO_ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + timeout
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                tail = (err.strip().splitlines() or ["(no output)"])[-1][:200]
                return {"ok": False, "why": f"process exited {proc.returncode}: {tail}"}
            results.append(json.loads(lines[-1]))
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"not done within {timeout:g} s"}
    finally:
        for proc in procs:  # every process ends with the trial
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    peak = max(r["peak_rss_mib"] for r in results)
    return {"ok": all(r["finite"] for r in results), "peak_rss_mib": peak, "params": results[0]["params"]}


def climb(row: Row, ladder: list, budget_mib: float, train_steps: int, timeout: float, verbose: bool) -> dict:
    """The largest size of ``ladder`` that ``row`` trains within the budget (ladder order)."""
    best = {"params": 0, "layers": 0, "width": 0, "peak_rss_mib": None}
    for layers, width in ladder:
        result = trial(row, layers, width, train_steps, timeout)
        if verbose:
            print(
                f"capacity benchmark: {row.placement} {layers}x{width}: {result}", file=sys.stderr, flush=True
            )
        if not result["ok"] or result["peak_rss_mib"] > budget_mib:
            break
        best = {
            "params": result["params"],
            "layers": layers,
            "width": width,
            "peak_rss_mib": result["peak_rss_mib"],
        }
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark capacity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--budget_mib", type=float, default=1200.0, help="Peak resident memory per process.")
    parser.add_argument("--train_steps", type=int, default=3, help="Steps each size must train.")
    parser.add_argument("--rows", default=",".join(r.placement for r in ROWS), help="Rows to measure.")
    parser.add_argument("--timeout_s", type=float, default=600.0, help="Seconds one size may take.")
    parser.add_argument("--quick", action="store_true", help="Two tiny sizes (a smoke test).")
    parser.add_argument("--verbose", action="store_true", help="Each trial on stderr.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv[1:])
    if args.worker:
        return run_worker(json.loads(args.worker))
    known = {r.placement: r for r in ROWS}
    names = harness.chosen_figures("capacity", args.rows, tuple(known))
    if names is None:
        return 2
    ladder = QUICK_LADDER if args.quick else LADDER
    table = []
    for name in names:
        best = climb(known[name], ladder, args.budget_mib, args.train_steps, args.timeout_s, args.verbose)
        harness.emit("capacity_params", best["params"], placement=name, budget_mib=args.budget_mib, **best)
        table.append((name, best))
    params = {name: best["params"] for name, best in table}
    if "gpipe_k4" in params and params.get("one_process_plain"):
        harness.emit("capacity_ratio_gpipe_k4", params["gpipe_k4"] / params["one_process_plain"])
    sizes = ", ".join(f"{layers}x{width}" for layers, width in ladder)
    print(f"\nlargest model under {args.budget_mib:g} MiB per process (layers x width: {sizes}):")
    print(f"{'placement':<20} {'layers x width':>14} {'parameters':>12} {'peak MiB':>9}")
    for name, best in table:
        size = f"{best['layers']} x {best['width']}" if best["params"] else "none"
        peak = f"{best['peak_rss_mib']:.0f}" if best["peak_rss_mib"] else "-"
        print(f"{name:<20} {size:>14} {best['params']:>12,} {peak:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
