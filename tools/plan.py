"""Plans a pipelined experiment over the processes you have: which placement, cuts, micro-batches,
schedule and remat policy, what each process will hold and how fast a step will be (docs/plan.md).

    .venv/bin/python -m tools.plan --model=lm.synthetic.GPipeTransformerLM --processes=4 --memory_mib=2000
    .venv/bin/python -m tools.plan --model=lm.synthetic.GPipeTransformerLM --current

Measures the experiment's per-layer costs on this host once (cached: trainer/planning/costs.py says
where), enumerates the plans the trainer accepts (trainer/planning/candidates.py), predicts each
one's step time, every process's peak memory and the bytes it sends, prints the best that fit and the
nearest that do not, and writes the best as a params file, ``plan_<model>.txt`` in the current
directory, that ``python -m trainer --model=EXP --params_file_override=PLAN`` runs unchanged (the
printed command; ``tools.local_cluster`` for stage processes and replicas). The chosen plan is first
checked by the trainer's own preflight (``--mode=inspect_params`` in a fresh process). ``--json``:
one JSON line per plan, best first. No plan fitting, an unknown experiment or a bad budget: one line,
exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from params.errors import ConfigError, UserError  # noqa: E402

SHOWN_FITTING = 10
SHOWN_OVER = 3
REPO_ROOT = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"plan: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tools.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the experiment's registry key")
    p.add_argument("--processes", type=int, default=1, help="N, the processes you have")
    p.add_argument("--memory_mib", type=float, default=0.0, help="each process's memory budget (0: none)")
    p.add_argument("--cores_per_process", type=int, default=1, help="CPU cores (threads) of each process")
    p.add_argument(
        "--devices_per_process", type=int, default=0, help="logical devices a process may hold (0: any)"
    )
    p.add_argument(
        "--link_mbit", type=float, default=0.0, help="the link between processes (0: measured on loopback)"
    )
    p.add_argument(
        "--host_cores",
        type=int,
        default=None,
        help="the cores all the processes share on one host (0: each process has its own; default: "
        "this host's usable cores with --link_mbit=0, the processes all here; 0 with a link)",
    )
    p.add_argument(
        "--calibration_trials",
        type=int,
        default=3,
        help="times each calibration run is trained (the step the median, each process's peak the "
        "highest; the first plan of an experiment)",
    )
    p.add_argument("--objective", choices=("step_time", "largest"), default="step_time")
    p.add_argument("--current", action="store_true", help="predict the experiment as configured")
    p.add_argument("--json", action="store_true", help="one JSON line per plan")
    return p


def _check(args: argparse.Namespace) -> None:
    if args.processes < 1:
        raise ConfigError(f"--processes must be >= 1, got {args.processes}")
    if not args.memory_mib >= 0 or args.memory_mib != args.memory_mib or args.memory_mib == float("inf"):
        raise ConfigError(f"--memory_mib must be a number of MiB >= 0 (0: no budget), got {args.memory_mib}")
    if args.cores_per_process < 1:
        raise ConfigError(f"--cores_per_process must be >= 1, got {args.cores_per_process}")
    if args.devices_per_process < 0:
        raise ConfigError(f"--devices_per_process must be >= 0 (0: any), got {args.devices_per_process}")
    if args.host_cores is not None and args.host_cores < 0:
        raise ConfigError(f"--host_cores must be >= 0 (0: each process its own), got {args.host_cores}")
    if not args.link_mbit >= 0 or args.link_mbit == float("inf"):
        raise ConfigError(f"--link_mbit must be >= 0 (0: measured), got {args.link_mbit}")
    if args.calibration_trials < 1:
        raise ConfigError(f"--calibration_trials must be >= 1, got {args.calibration_trials}")


def _progress(message: str) -> None:
    print(f"plan: {message}", file=sys.stderr, flush=True)


def current_plan(root, costs, prefix: str):  # noqa: ANN001, ANN201
    """The experiment's own placement as a Plan."""
    from trainer.planning import candidates
    from trainer.planning.pipeline_api import partition

    node = root.task
    for part in prefix.split("."):
        node = node.get(part)
    v = int(node.virtual_stages)
    k = int(node.num_stages) or max(1, (len(list(node.split_points)) + 1) // v)
    batch = costs.batch_size
    m = int(node.num_micro_batches) if not node.micro_batch_size else batch // int(node.micro_batch_size)
    if list(node.split_points):
        cut = tuple(int(s) for s in node.split_points)
    elif node.partition_method == "uniform":
        cut = tuple(partition.uniform_bounds(costs.num_layers, k * v)[1:-1])
    else:
        cut = candidates.split_points(costs, batch // m, k * v)
    if root.cluster.stage_job:
        placement = "stage_processes"
    elif list(node.stage_mesh_shape):
        placement = "pipeline_mesh"
    else:
        placement = "logical" if k > 1 else "one_process"
    mesh = int(list(node.stage_mesh_shape)[-1]) if list(node.stage_mesh_shape) else 1
    return candidates.Plan(placement, k, m, str(node.schedule), str(node.remat), cut, v, 1, mesh)


def _table(rows: list, budget: float, title: str) -> None:
    print(title)
    print(f"  {'#':>3} {'plan':<66} {'step ms':>8} {'peak MiB':>9} {'procs':>5}  over by")
    for i, pred in enumerate(rows, 1):
        over = ""
        if budget and not pred.fits(budget):
            who, item, mib = pred.overflow(budget)
            over = f"{mib:.0f} MiB in {who} (largest item: {item})"
        print(
            f"  {i:>3} {pred.plan.name():<66} {pred.step_s * 1e3:>8.1f} {pred.peak_mib:>9.0f} "
            f"{pred.plan.processes:>5}  {over}"
        )


def _show(pred, budget: float) -> None:  # noqa: ANN001
    print(f"plan: {pred.plan.name()}")
    print(f"  step: {pred.step_s * 1e3:.1f} ms predicted (bubble {pred.bubble:.0%})")
    for proc, sent in zip(pred.processes, pred.bytes_sent + [0.0] * len(pred.processes)):
        items = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in proc.items.items() if v)
        print(
            f"  {proc.name}: peak {proc.total / 2**20:.0f} MiB ({items}); sends {sent / 2**20:.1f} MiB a step"
        )
    if budget:
        print(f"  fits {budget:g} MiB per process: {'yes' if pred.fits(budget) else 'no'}")


def rank_key(pred, objective: str) -> tuple:  # noqa: ANN001
    """Best first: by step (or peak, for ``largest``) to a tenth of a millisecond (a MiB), then the
    simpler plan (fewer processes, fewer devices, fewer micro-batches), then the other figure."""
    plan = pred.plan
    simpler = (plan.processes, plan.devices_per_process, plan.num_micro_batches)
    if objective == "largest":
        return (round(pred.peak_mib), *simpler, pred.step_s)
    return (round(pred.step_s, 4), *simpler, pred.peak_mib)


def preflight(model: str, path: Path) -> str | None:
    """None if the trainer's preflight accepts ``path`` (a fresh ``--mode=inspect_params``), else
    its one line."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            f"--model={model}",
            f"--params_file_override={path}",
            "--mode=inspect_params",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode == 0:
        return None
    return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]


def plan(args: argparse.Namespace) -> int:
    _check(args)
    start = time.monotonic()
    from params import experiment
    from trainer import preflight as trainer_preflight
    from trainer.planning import calibrate, candidates, costs, plan_file, predict

    root = experiment.resolve(args.model)
    prefix = costs.pipeline_prefix(root)
    if prefix is None:
        raise ConfigError(
            f"--model={args.model} has no GPipe pipeline to plan (a stack with params.pipeline, e.g. "
            "lm.synthetic.GPipeTransformerLM)"
        )
    trainer_preflight.check(root, build=False)
    root = root.copy()
    root.cluster.set(intra_op_threads=args.cores_per_process)
    batch = int(root.input.train.batch_size)
    sizes = candidates.micro_batch_sizes(batch, args.processes)
    model_costs, path, measured = costs.load_or_measure(
        root, f"{args.model}-c{args.cores_per_process}", sizes, _progress
    )
    if not measured:
        _progress(f"costs from {path}")
    link = args.link_mbit * 1e6 / 8 if args.link_mbit else model_costs.link_bytes_per_s
    latency = model_costs.link_latency_s
    host_cores = args.host_cores
    if host_cores is None:
        host_cores = 0 if args.link_mbit else len(os.sched_getaffinity(0))
    current = current_plan(root, model_costs, prefix) if args.current else None
    stage_mesh = bool(root.task.get(prefix).get("stage_layout_rules"))
    if current is None:
        plans = list(
            candidates.enumerate_plans(model_costs, args.processes, args.devices_per_process, stage_mesh)
        )
    # what the plans' placements cost beyond their layers: a few short trainings, once (cached)
    considered = [current] if current else plans
    target = calibrate.Target(args.model, [], prefix, host_cores, _progress, args.calibration_trials)
    calibrate.ensure(target, model_costs, path, considered)
    budget = args.memory_mib
    if current is not None:
        pred = predict.predict(model_costs, current, link, latency, host_cores)
        if args.json:
            print(json.dumps(pred.to_json(budget or None)))
        else:
            _show(pred, budget)
        return 0
    _progress(f"predicting {len(plans)} plans")
    preds = [predict.predict(model_costs, p, link, latency, host_cores) for p in plans]
    preds.sort(key=lambda p: rank_key(p, args.objective))
    fitting = [p for p in preds if not budget or p.fits(budget)]
    over = sorted((p for p in preds if budget and not p.fits(budget)), key=lambda p: p.peak_mib)
    if args.json:
        for p in preds:
            print(json.dumps(p.to_json(budget or None)))
    if not fitting:
        who, item, mib = over[0].overflow(budget)
        raise ConfigError(
            f"no plan of {args.model} fits {args.processes} process(es) of {budget:g} MiB: the nearest, "
            f"{over[0].plan.name()}, needs {mib:.0f} MiB more in {who} (largest item: {item})"
        )
    out_path = Path.cwd() / f"plan_{args.model}.txt"
    chosen = None
    for pred in fitting[:3]:
        out_path.write_text(plan_file.text(pred.plan, prefix, batch, args.cores_per_process))
        _progress(f"checking {pred.plan.name()} with the trainer's preflight")
        refusal = preflight(args.model, out_path)
        if refusal is None:
            chosen = pred
            break
        _progress(f"the trainer refuses it: {refusal}")
    if chosen is None:
        out_path.unlink(missing_ok=True)
        raise ConfigError(f"the trainer refused the {min(3, len(fitting))} best plans (above); none written")
    if not args.json:
        _table(
            fitting[:SHOWN_FITTING],
            budget,
            f"best plans of {args.model} ({len(fitting)} of {len(preds)} fit):",
        )
        if over:
            _table(over[:SHOWN_OVER], budget, "nearest that do not fit:")
        _show(chosen, budget)
    print(f"plan: wrote {out_path}; train it with:", file=sys.stderr)
    logdir = f"runs/{args.model.rsplit('.', 1)[-1]}-plan"
    print(f"  {plan_file.command(chosen.plan, args.model, str(out_path), logdir)}", file=sys.stderr)
    _progress(f"planned in {time.monotonic() - start:.1f} s")
    return 0


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv[1:])
    try:
        return plan(args)
    except UserError as e:
        print(f"plan: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
