"""``python -m tools.benchmark capacity``: GPipe's Table 1 for this machine, the largest Transformer LM
each placement trains a few steps with every process under a memory budget.

The family: pre-norm Transformer LMs of 8 layers x ``width`` (hidden 4 x width, 4 heads, tied
softmax over the synthetic 36-token vocabulary, Adam), trained on sequences of 128 tokens, batch 8
(1024 tokens a step), climbed along ``LADDER`` (widths 128 to 2048, each rung about 1.4x the
parameters of the one below) until a size fails: a process ends with an error, or the peak
resident memory (VmHWM, ``ru_maxrss``) of one of the row's processes passes ``--budget_mib``. Why
this family: at 1024 tokens a step the activations the backward keeps outweigh the weights with
their gradient and Adam's two slots, as in real LM training, so re-materialization has something to
save (measured on oneDNN's pool: plain 8 x 512 peaks at 1983 MiB, of which those 16 bytes a
parameter are ~385 MiB and TensorFlow's own footprint ~0.85 GiB; the ~0.7 GiB left is activations
and temporaries). With the first family (sequences of 32, batch 8: 256 tokens) they were a few
percent, remat had nothing to save and K stage processes could at most divide the weights (~4x at
K=4): 6 was out of reach.
Why the depth is fixed: a GPipe row's trainer process traces and optimizes the whole unrolled
pipeline (every stage's forward, recompute and backward for every micro-batch: 27,012 nodes at 8
layers), and its peak grows with the number of layers (measured: 1705 MiB at 8 x 128 here, above 2.6
GiB at 16 x 128 with sequences of 512, while each stage process stayed under 0.9 GiB); deeper rungs
would measure the trainer's graph, not where the model's memory lives. Since the trainer frees the
Python graphs of its traces (``RemoteStages.compile``, layers/tf_compat.py), its peak at 8 x 128 is
1216 MiB instead of 1617 (1424 instead of 1811 at 8 x 640; ``trial``, on the commit before the
step was traced once; docs/benchmark_results.md has the figures since).
The default budget (2000 MiB) leaves room above the ~0.85 GiB every TensorFlow process takes and
that trainer; at 1200 MiB no GPipe row fit even its smallest size of the first family (the trainer
alone peaked at 1244 MiB with 4 x 128).

The climb (``climb``, ``lm_family.gallop``): rungs 1, 2, 4, 8, ... above the largest that fitted until one
fails, then bisection between the two (the ladder's memory grows with its rungs); a watchdog ends a
trial as soon as a process's peak passes the budget. A row of the table is one ``Row``: a name
(``placement`` in the JSON line), the number of processes, and the experiment and gin bindings of
one size; each process is a worker (``--worker=JSON``) that builds the experiment's ``TrainStep``
where its placement says, trains ``--train_steps`` steps (3), and prints its peak and the
parameters. Its tensors come from malloc, as in the trainer binary's processes
(``tf_startup.use_system_allocator``) and the planner's (``trainer.planning.trial``): the peaks are
the ones a user's run has (oneDNN's pool, ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=0``, keeps less at this
family's sizes: at 8 x 1280, gpipe_k4's stage processes about 250 MiB lower after 3 steps). Every
row trains the same model on the same global batch of 8 x 128 tokens:

    one_process_plain   lm.synthetic.TransformerLM, one process, no micro-batches, no remat; the
                        loss over the whole batch
    one_process_remat   lm.synthetic.GPipeTransformerLM, one process, 1 stage, 4 micro-batches of 2
                        sequences, remat always (a micro-batch keeps only the stack's input until
                        its backward recomputes the forward); the loss per micro-batch in the stage
    gpipe_k2, gpipe_k4  lm.synthetic.GPipeTransformerLM, K stages (8 / K layers each) in K stage
                        processes (``cluster.stage_job : 'worker'``, the RemoteStages placement),
                        4 micro-batches, remat always, fill-drain; the loss (tied softmax) per
                        micro-batch in the last stage process. The trainer process (input,
                        embedding, the traced step) is a process of the row too, so K + 1
                        processes must each stay under the budget
    mesh_k2, mesh_k4    lm.synthetic.MeshTransformerLM on a [1, K] mesh over K processes (--mode=mesh's
                        placement), no micro-batches, no remat: the feed-forward hidden units,
                        attention heads and vocabulary cut across the processes, the rest replicated

So one_process_plain and gpipe_k4 differ only in the placement (K stage processes and a trainer)
and in micro-batches with remat. A placement across processes of another kind is one more ``Row``
in ``ROWS`` whose worker builds its ``TrainStep`` in ``build_step``. Figures: ``capacity_params`` per
row (with ``placement``, ``stopped_by`` and every process's peak), and ``capacity_ratio_gpipe_k4``
(gpipe_k4's parameters over one_process_plain's); then the table a person reads.

The row ``planned_k4`` is not a ``Row``: the planner (``tools.plan``; ``planned_largest`` in
tools/benchmarks/plan.py) climbs the ladder (``lm_family.gallop``) by its predictions alone, calibrating each
size it visits as ``tools.plan`` does (each calibration run trained ``--calibration_trials`` times;
cached in ``TENSORPIPE_CACHE_DIR``), then its plan for the largest size it says fits 5 processes
(gpipe_k4's) is trained through the trainer's processes (``trainer.planning.trial``);
``capacity_ratio_planned_k4`` is that size's parameters over one_process_plain's (0 parameters when
a process of the run passed the budget).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from tools.benchmarks import harness, lm_family
from tools.benchmarks.lm_family import BASE, LADDER, QUICK_LADDER


@dataclasses.dataclass(frozen=True)
class Row:
    """One placement of the table: ``processes`` workers train ``model`` with ``bindings(layers, width)``
    (gin knobs), the worker's ``mode`` saying how it places the step."""

    placement: str
    processes: int
    model: str
    knobs: Callable[[int, int], dict]
    mode: str  # "one_process", "mesh" or "stages" (the trainer of K stage processes)


def _mesh_knobs(k: int) -> Callable[[int, int], dict]:
    return lambda layers, width: {"data_parallel": 1, "model_parallel": k}


def _gpipe_knobs(k: int) -> Callable[[int, int], dict]:
    return lambda layers, width: {"num_stages": k, "num_micro_batches": 4, "remat": "'always'"}


ROWS = [
    Row("one_process_plain", 1, "lm.synthetic.TransformerLM", lambda layers, width: {}, "one_process"),
    Row(
        "one_process_remat",
        1,
        "lm.synthetic.GPipeTransformerLM",
        lambda layers, width: {"num_stages": 1, "num_micro_batches": 4, "remat": "'always'"},
        "one_process",
    ),
    Row("gpipe_k2", 2, "lm.synthetic.GPipeTransformerLM", _gpipe_knobs(2), "stages"),
    Row("gpipe_k4", 4, "lm.synthetic.GPipeTransformerLM", _gpipe_knobs(4), "stages"),
    Row("mesh_k2", 2, "lm.synthetic.MeshTransformerLM", _mesh_knobs(2), "mesh"),
    Row("mesh_k4", 4, "lm.synthetic.MeshTransformerLM", _mesh_knobs(4), "mesh"),
]


# The row the planner places (tools.plan): the largest size for which it has a plan on gpipe_k4's
# processes (4 stage processes and the trainer) under the budget, that plan trained as the others.
PLANNED = "planned_k4"
PLANNED_PROCESSES = 5


def bindings(row: Row, layers: int, width: int) -> list[str]:
    name = row.model.rpartition(".")[2]
    knobs = dict(BASE, num_layers=layers, model_dim=width, hidden_dim=4 * width, **row.knobs(layers, width))
    return [f"{name}.{k} = {v}" for k, v in knobs.items()]


# ------------------------------------------------------------------------------------------ worker
def resolve(spec: dict):
    """The row's experiment at the trial's size; a ``stages`` row's parts on the stage job."""
    from params import experiment

    override = "cluster.stage_job : 'worker'" if spec["mode"] == "stages" else None
    return experiment.resolve(spec["model"], gin_bindings=spec["bindings"], params_override=override)


def build_step(spec: dict):
    """The worker's ``TrainStep``, placed as its row says (TensorFlow set up first)."""
    from params import experiment
    from trainer import tf_settings
    from trainer.distributed import mesh_cluster
    from trainer.distributed.mesh_placement import make_train_step
    from trainer.train_step import TrainStep

    root = resolve(spec)
    task_params = experiment.task_params_for(root, "train")
    if spec["mode"] == "stages":
        from trainer.distributed import remote_stages

        stages = remote_stages.stage_cluster(root.cluster, spec["cluster_spec"])
        tf_settings.configure(root.cluster.copy().set(num_logical_cpu_devices=1))
        return TrainStep(task_params, root.input.train, remote_stages.placement(stages, log=lambda _: None))
    if spec["mode"] == "mesh":
        role = mesh_cluster.resolve_role(spec["cluster_spec"], spec["task_index"])
        per_process = mesh_cluster.devices_per_process(root.cluster, len(role.cluster["worker"]))
        tf_settings.configure(root.cluster.copy().set(num_logical_cpu_devices=per_process))
        mesh = mesh_cluster.connect(role, root.cluster)
        return TrainStep(task_params, root.input.train, mesh_cluster.MeshAcrossProcesses(mesh, role))
    tf_settings.configure(root.cluster)
    return make_train_step(root.cluster, task_params, root.input.train)


def run_stage(spec: dict) -> int:
    """A stage task of a ``stages`` row: serves until the trial kills it."""
    from trainer.distributed import remote_stages

    root = resolve(spec)
    cluster = root.cluster.copy().set(intra_op_threads=1, inter_op_threads=2)
    return remote_stages.serve(
        root.copy().set(cluster=cluster), spec["cluster_spec"], spec["task_index"], log=lambda _: None
    )


def run_worker(spec: dict) -> int:
    harness.prepare_process({"system_allocator": True})  # malloc, as the trainer's processes
    if spec.get("stage"):
        return run_stage(spec)
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
def _peak_mib(pid: int) -> float:
    try:
        return harness.peak_rss_bytes(pid) / 2**20
    except (OSError, RuntimeError):  # the process has just ended
        return 0.0


def trial(row: Row, layers: int, width: int, train_steps: int, timeout: float, budget_mib: float) -> dict:
    """One size on one row: every process's result, or why it failed. A watchdog reads every
    process's peak (VmHWM) twice a second and ends the trial as soon as one is over ``budget_mib``:
    the size is over the budget whatever the remaining steps do, so a size that does not fit costs
    only the time until its peak crosses the budget."""
    from tools import local_cluster

    spec_base = {"model": row.model, "bindings": bindings(row, layers, width), "mode": row.mode}
    spec_base["train_steps"] = train_steps
    if row.mode == "mesh":
        spec_base["cluster_spec"] = local_cluster.cluster_spec(
            row.processes, 0, local_cluster.free_ports(row.processes)
        )
    stage_specs = []
    if row.mode == "stages":  # K stage tasks, then the trainer (the one that reports)
        ports = local_cluster.free_ports(row.processes)
        spec_base["cluster_spec"] = "worker=" + ",".join(f"127.0.0.1:{p}" for p in ports)
        stage_specs = [dict(spec_base, stage=True, task_index=k) for k in range(row.processes)]
    reporting = 1 if row.mode == "stages" else row.processes
    procs = []
    with tempfile.TemporaryDirectory(prefix="capacity_") as tmp:
        try:
            for i, spec in enumerate(stage_specs + [dict(spec_base, task_index=i) for i in range(reporting)]):
                with open(f"{tmp}/{i}.out", "w") as out, open(f"{tmp}/{i}.err", "w") as err:
                    procs.append(
                        subprocess.Popen(
                            [
                                sys.executable,
                                "-m",
                                "tools.benchmarks.capacity",
                                f"--worker={json.dumps(spec)}",
                            ],
                            cwd=harness.REPO_ROOT,
                            stdout=out,
                            stderr=err,
                        )
                    )
            deadline = time.monotonic() + timeout
            reporters = procs[len(stage_specs) :]
            while any(proc.poll() is None for proc in reporters):
                peak, who = max(
                    (_peak_mib(proc.pid), k) for k, proc in enumerate(procs) if proc.poll() is None
                )
                if peak > budget_mib:
                    name = f"process {who - len(stage_specs)}" if who >= len(stage_specs) else f"stage {who}"
                    name = "the trainer" if stage_specs and who == len(stage_specs) else name
                    return {"ok": True, "over": True, "why": f"{name}'s peak passed {peak:.0f} MiB"}
                if time.monotonic() > deadline:
                    return {"ok": False, "why": f"not done within {timeout:g} s"}
                time.sleep(0.5)
            results = []
            for i, proc in enumerate(reporters, start=len(stage_specs)):
                lines = [line for line in open(f"{tmp}/{i}.out").read().splitlines() if line.startswith("{")]
                if proc.returncode != 0 or not lines:
                    tail = (open(f"{tmp}/{i}.err").read().strip().splitlines() or ["(no output)"])[-1][:200]
                    return {"ok": False, "why": f"process exited {proc.returncode}: {tail}"}
                results.append(json.loads(lines[-1]))
            for proc in procs[: len(stage_specs)]:  # stage tasks serve until killed: their peak so far
                if proc.poll() is not None:
                    return {"ok": False, "why": f"a stage task exited {proc.returncode}"}
                results.append({"peak_rss_mib": _peak_mib(proc.pid), "finite": True})
        finally:
            for proc in procs:  # every process ends with the trial
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    peaks = [round(r["peak_rss_mib"], 1) for r in results]  # the reporting processes', then stages'
    return {
        "ok": all(r["finite"] for r in results),
        "over": max(peaks) > budget_mib,
        "peak_rss_mib": max(peaks),
        "peaks_mib": peaks,
        "params": results[0]["params"],
    }


def climb(row: Row, ladder: list, budget_mib: float, train_steps: int, timeout: float, verbose: bool) -> dict:
    """The largest size of ``ladder`` that ``row`` trains within the budget (``lm_family.gallop``)."""
    results: dict[int, dict] = {}

    def attempt(i: int) -> str | None:
        layers, width = ladder[i]
        result = results[i] = trial(row, layers, width, train_steps, timeout, budget_mib)
        if verbose:
            print(
                f"capacity benchmark: {row.placement} {layers}x{width}: {result}", file=sys.stderr, flush=True
            )
        if not result["ok"]:
            return f"{layers}x{width}: {result.get('why', 'a loss that is not finite')}"
        if result["over"]:
            why = result.get("why", f"peak {result.get('peak_rss_mib', 0):.0f} MiB")
            return f"{layers}x{width}: {why} over the budget"
        return None

    fits, failure = lm_family.gallop(len(ladder), attempt)
    best = {"params": 0, "layers": 0, "width": 0, "peak_rss_mib": None}
    if fits >= 0:
        result = results[fits]
        best = {
            "params": result["params"],
            "layers": ladder[fits][0],
            "width": ladder[fits][1],
            "peak_rss_mib": result["peak_rss_mib"],
            "peaks_mib": result["peaks_mib"],
        }
    best["stopped_by"] = failure or "the ladder's largest size fits: extend LADDER"
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark capacity", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--budget_mib", type=float, default=2000.0, help="Peak resident memory per process.")
    parser.add_argument("--train_steps", type=int, default=3, help="Steps each size must train.")
    parser.add_argument(
        "--rows", default=",".join([*(r.placement for r in ROWS), PLANNED]), help="Rows to measure."
    )
    parser.add_argument("--timeout_s", type=float, default=600.0, help="Seconds one size may take.")
    parser.add_argument("--quick", action="store_true", help="Two tiny sizes (a smoke test).")
    parser.add_argument(
        "--calibration_trials",
        type=int,
        default=3,
        help=f"{PLANNED}: times each of the planner's calibration runs is trained at a size it has no "
        "cached costs for (the step the median, each process's peak the highest).",
    )
    parser.add_argument("--verbose", action="store_true", help="Each trial on stderr.")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv[1:])
    if args.calibration_trials < 1:
        parser.error(f"--calibration_trials must be >= 1, got {args.calibration_trials}")
    if args.worker:
        return run_worker(json.loads(args.worker))
    known = {r.placement: r for r in ROWS}
    names = harness.chosen_figures("capacity", args.rows, (*known, PLANNED))
    if names is None:
        return 2
    ladder = QUICK_LADDER if args.quick else LADDER
    table = []
    for name in names:
        if name == PLANNED:
            from tools.benchmarks import plan

            best = plan.planned_largest(
                ladder,
                args.budget_mib,
                PLANNED_PROCESSES,
                args.train_steps,
                args.timeout_s,
                args.verbose,
                args.calibration_trials,
            )
        else:
            best = climb(known[name], ladder, args.budget_mib, args.train_steps, args.timeout_s, args.verbose)
        harness.emit("capacity_params", best["params"], placement=name, budget_mib=args.budget_mib, **best)
        table.append((name, best))
    params = {name: best["params"] for name, best in table}
    if "gpipe_k4" in params and params.get("one_process_plain"):
        harness.emit("capacity_ratio_gpipe_k4", params["gpipe_k4"] / params["one_process_plain"])
    if PLANNED in params and params.get("one_process_plain"):
        harness.emit("capacity_ratio_planned_k4", params[PLANNED] / params["one_process_plain"])
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
