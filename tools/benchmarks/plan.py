"""``python -m tools.benchmark plan``: the planner (``tools.plan``) checked against measured runs.

On the capacity benchmark's Transformer LM family (``lm_family.LADDER``, ``lm_family.BASE``: 8 layers,
sequences of 128, batch 8) at two sizes (``SIZES``: a small one, one near a 2 GiB per-process
budget), the planner measures its costs (cached, as ``tools.plan`` does, with its default one
thread per op, ``CORES_PER_PROCESS``, which every plan trained here sets too), enumerates its plans
for ``--processes`` processes and predicts each one; ``pick`` takes ``--plans`` of them (24)
covering in-process GPipe, stage processes at K = 2 and K = 4, M from K to 4K, three schedules,
remat never and always (fewer asked for: an even spread of that set), plus the planner's choice and
the naive plan (GPipe K = N - 1 stage processes, uniform cuts, M = K, fill-drain, remat never). The
family's stage-mesh form (``MESH_MODEL``: untied softmax, separate q/k/v) at ``--mesh_sizes``
(8 x 128) adds mesh and pipeline x mesh plans (``pick_mesh``: one stage on a mesh of 2 and of 4,
pipeline 2 x mesh 2, M = K to 4K, three schedules, remat never and always) and two on plain
devices, planned for one process (its placements; stage processes are checked on the family
itself). Each is trained ``--train_steps`` steps (8) in worker processes placed as the plan says
(``trainer.planning.trial``: stage processes and their trainer as ``tools.local_cluster --stages=K``
would start them), its step the median of all but the first two (``trial.timed_steps``: the first
traces the step, the second still warms it; one step of a set of processes on this 2-core machine
varied by up to 44% from another of the same set, so a median of 6 steps, as the calibration takes,
lands nearer the steps a long run takes than one of 3), every process's peak its VmHWM. Replicas are
left out of the enumeration here (measuring them needs the sync cluster ``tools.local_cluster
--workers=R`` starts, which these workers do not). Before predicting, the planner's calibrations
(``trainer.planning.calibrate``: one process at one micro-batch, two K = 2 stage-process plans and
one K = 4, one process at M = 8, one K = 2 plan on logical devices, per mesh size two one-stage
mesh plans and two two-stage ones, trained and cached with the costs) run where the cache has none.
Figures, one JSON line each:

    plan_step_rank_corr       Spearman's rank correlation of predicted and measured steps
    plan_step_error_median    median |measured / predicted - 1| of the step
    plan_step_error_max       the largest
    plan_memory_error_median  median |measured / predicted - 1| of every process's peak
    plan_memory_under_max     the most a process peaked above its prediction (measured / predicted - 1)
    plan_choice_vs_best       the planner's choice's measured step over the best measured step among
                              the plans that fit (--budget_mib): the choice and every plan measured
                              no slower than it are trained --choice_trials times in all (3), in
                              turns, and take their median (``choice_steps``)
    plan_choice_vs_naive      the naive plan's measured step over the choice's
    plan_seconds              the planner's own time for one experiment, costs cached

and ``plan_run`` per plan (predicted and measured step and peaks; its first run), ``plan_choice`` per
size (the choice's step as the figure takes it, the best plan's). ``--quick``: one tiny size, two
plans for 3 processes (K = 2 on logical devices, K = 2 stage processes), 3 steps (a smoke test of
the whole path; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

from tools.benchmarks import harness, lm_family

SIZES = [(8, 128), (8, 512)]
MESH_SIZES = [(8, 128)]
QUICK_SIZES = [(2, 32)]
QUICK_PROCESSES = 3  # --quick plans K = 2 at most: no deeper calibration run
MODEL = "lm.synthetic.GPipeTransformerLM"
MESH_MODEL = "lm.synthetic.StageMeshTransformerLM"  # the family with stage meshes (untied, unfused)
CORES_PER_PROCESS = 1  # tools.plan's default --cores_per_process: each op's threads, costs and plans alike


def bindings(layers: int, width: int, short: bool | None = None, model: str = MODEL) -> list[str]:
    """The capacity family's gin bindings at one size (``short``, default below 8 layers: sequences
    of 16, the quick form's) for ``model`` (the family, or its stage-mesh form ``MESH_MODEL``)."""
    knobs = dict(lm_family.BASE, num_layers=layers, model_dim=width, hidden_dim=4 * width)
    if short or (short is None and layers < 8):
        knobs["seq_length"] = 16
    return [f"{model.rsplit('.', 1)[-1]}.{k} = {v}" for k, v in knobs.items()]


def resolve(model: str, gin: list[str]):  # noqa: ANN201
    """The experiment's Params as ``tools.plan`` plans it (``CORES_PER_PROCESS`` threads per op)."""
    from params import experiment

    root = experiment.resolve(model, gin_bindings=gin).copy()
    root.cluster.set(intra_op_threads=CORES_PER_PROCESS)
    return root


def cost_name(model: str, layers: int, width: int) -> str:
    """The costs' cache name of ``model`` at one size, planned at ``CORES_PER_PROCESS``."""
    return f"{model}-{layers}x{width}-c{CORES_PER_PROCESS}"


def planned_largest(
    ladder: list,
    budget_mib: float,
    processes: int,
    train_steps: int,
    timeout: float,
    verbose: bool,
    calibration_trials: int = 3,
) -> dict:
    """The capacity benchmark's ``planned_k4`` row: the largest size of ``ladder`` for which the
    planner has a plan on ``processes`` processes under ``budget_mib`` (``lm_family.gallop``: the
    family's memory grows with the rungs), each size's calibration runs trained ``calibration_trials``
    times where the cache has none, then that plan trained ``train_steps`` steps with every process's
    peak (VmHWM) read."""
    from tools import plan as tool
    from trainer.planning import calibrate, candidates, costs, plan_file, predict, trial

    def say(message: str) -> None:
        if verbose:
            print(f"capacity benchmark: planned_k4: {message}", file=sys.stderr, flush=True)

    def best_plan(layers: int, width: int):  # noqa: ANN202
        gin = bindings(layers, width, short=False)
        root = resolve(MODEL, gin)
        sizes = candidates.micro_batch_sizes(int(root.input.train.batch_size), processes)
        model_costs, cache, _ = costs.load_or_measure(root, cost_name(MODEL, layers, width), sizes, say)
        link, latency = model_costs.link_bytes_per_s, model_costs.link_latency_s
        cores = len(os.sched_getaffinity(0))  # every process of the plan runs on this host
        prefix = costs.pipeline_prefix(root)
        plans = list(candidates.enumerate_plans(model_costs, processes))
        target = calibrate.Target(MODEL, gin, prefix, cores, say, calibration_trials)
        calibrate.ensure(target, model_costs, cache, plans)
        preds = [predict.predict(model_costs, p, link, latency, cores) for p in plans]
        fitting = sorted(
            (p for p in preds if p.fits(budget_mib)), key=lambda p: tool.rank_key(p, "step_time")
        )
        say(f"{layers}x{width}: {fitting[0].plan.name() if fitting else 'no plan fits'}")
        return (fitting[0], prefix, model_costs) if fitting else None

    found: dict[int, tuple] = {}

    def attempt(i: int) -> str | None:
        best = best_plan(*ladder[i])
        if best is None:
            return f"{ladder[i][0]}x{ladder[i][1]}: no plan fits"
        found[i] = best
        return None

    fits, failure = lm_family.gallop(len(ladder), attempt)
    if fits < 0:
        return {"params": 0, "layers": 0, "width": 0, "peak_rss_mib": None, "stopped_by": failure}
    pred, prefix, model_costs = found[fits]
    layers, width = ladder[fits]
    text = plan_file.text(pred.plan, prefix, model_costs.batch_size, model_costs.intra_op_threads)
    stages = pred.plan.num_stages if pred.plan.placement == "stage_processes" else 0
    # replicas: one replica's process is trained (each of the R the trainer starts is alike)
    m = trial.measure_plan(MODEL, bindings(layers, width, short=False), text, stages, train_steps, timeout)
    peak = max(m["peaks_mib"]) if m.get("ok") else None
    trained = bool(m.get("ok")) and peak <= budget_mib
    return {
        "params": model_costs.total_params if trained else 0,
        "layers": layers,
        "width": width,
        "plan": pred.plan.name(),
        "predicted_peak_mib": round(pred.peak_mib, 1),
        "peak_rss_mib": peak,
        "peaks_mib": m.get("peaks_mib"),
        "stopped_by": failure or "the ladder's largest size fits: extend LADDER",
        "trained_under_budget": trained,
        "why": m.get("why"),
    }


def naive_plan(processes: int, costs):  # noqa: ANN001, ANN201
    """GPipe K = N - 1 stage processes (K = N stage processes need N + 1 with the trainer), uniform cuts,
    M = K, fill-drain, remat never."""
    from trainer.planning import candidates
    from trainer.planning.pipeline_api import partition

    k = max(2, min(processes - 1, costs.num_layers))
    cut = tuple(partition.uniform_bounds(costs.num_layers, k)[1:-1])
    return candidates.Plan("stage_processes", k, k, "fill_drain", "never", cut)


def _taker(preds: list, chosen: list):  # noqa: ANN202
    """``take(test, n)``: adds the n best-predicted plans of ``preds`` passing ``test`` to ``chosen``."""
    by_step = sorted(preds, key=lambda p: p.step_s)

    def take(test, n: int = 1) -> None:  # noqa: ANN001
        for p in by_step:
            if n == 0:
                return
            if test(p.plan) and p not in chosen:
                chosen.append(p)
                n -= 1

    return take


def pick_mesh(preds: list) -> list:
    """The stage-mesh family's plans: one stage on a mesh of 2 (M = 1, 2, 4; remat never and
    always) and of 4, pipeline 2 x mesh 2 (M = 2, 4, 8; three schedules), and two on plain devices."""
    chosen: list = []
    take = _taker(preds, chosen)
    for k, s, m, sched, remat in [
        (1, 2, 1, "fill_drain", "never"), (1, 2, 2, "fill_drain", "never"), (1, 2, 4, "fill_drain", "always"),
        (1, 4, 1, "fill_drain", "never"), (1, 4, 4, "fill_drain", "never"),
        (2, 2, 2, "fill_drain", "never"), (2, 2, 4, "one_f_one_b", "never"), (2, 2, 4, "zb_h1", "always"),
        (2, 2, 8, "one_f_one_b", "never"), (2, 2, 8, "fill_drain", "always"),
    ]:  # fmt: skip
        take(
            lambda q, k=k, s=s, m=m, sched=sched, remat=remat: (
                q.placement == "pipeline_mesh"
                and (q.num_stages, q.stage_mesh, q.num_micro_batches, q.schedule, q.remat)
                == (k, s, m, sched, remat)
            )
        )
    take(lambda q: q.placement == "one_process")
    take(lambda q: q.placement == "logical" and q.num_stages == 2)
    return chosen


def pick(preds: list, count: int, quick: bool) -> list:
    """Plans covering the figures' ground (module doc), best-predicted first within each group."""
    chosen: list = []
    take = _taker(preds, chosen)
    if quick:
        take(lambda q: q.placement == "logical" and q.num_stages == 2)
        take(lambda q: q.placement == "stage_processes" and q.num_stages == 2)
        return chosen
    for k in (2, 4):
        for m in (k, 2 * k, 4 * k):
            for sched in ("fill_drain", "one_f_one_b", "zb_h1"):
                take(
                    lambda q, k=k, m=m, s=sched: (
                        q.placement == "stage_processes"
                        and q.num_stages == k
                        and q.num_micro_batches == m
                        and q.schedule == s
                        and q.remat == ("never" if m != 2 * k else "always")
                    )
                )
    take(lambda q: q.placement == "one_process", 2)
    take(lambda q: q.placement == "logical" and q.num_stages in (2, 4), 3)
    while len(chosen) < count and len(chosen) < len(preds):
        take(lambda q: True)
    if len(chosen) > count:  # fewer asked for than the ground needs: an even spread of it
        chosen = [chosen[round(i * len(chosen) / count)] for i in range(count)]
    return chosen


def train_plan(  # noqa: ANN001
    model: str, gin: list[str], prefix: str, costs, steps: int, timeout_s: float, pred
) -> dict:
    """``pred``'s plan of ``model`` trained ``steps`` steps in worker processes (``trial.measure_plan``)."""
    from trainer.planning import plan_file, trial

    text = plan_file.text(pred.plan, prefix, costs.batch_size, costs.intra_op_threads)
    stages = pred.plan.num_stages if pred.plan.placement == "stage_processes" else 0
    return trial.measure_plan(model, gin, text, stages, steps, timeout_s, trial.timed_steps(steps))


def choice_steps(choice, ok_fitting: list, train, trials: int) -> dict[int, float]:  # noqa: ANN001
    """The measured step of every plan of ``ok_fitting`` ((prediction, run) pairs) by ``id`` of its
    prediction, for the choice figure: the choice and every plan measured no slower than it are
    trained again (``train``) until each has ``trials`` runs, in turns, and take their median (one set
    of processes measures a plan 10 to 15% apart from the next); the others keep their one run."""
    steps = {id(p): [m["step_s"]] for p, m in ok_fitting}
    mine = steps[id(choice)][0]
    contenders = [p for p, m in ok_fitting if m["step_s"] <= mine]
    if len(contenders) > 1:
        for _ in range(trials - 1):
            for pred in contenders:
                m = train(pred)
                if m["ok"]:
                    steps[id(pred)].append(m["step_s"])
    return {k: statistics.median(v) for k, v in steps.items()}


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    if n < 2:
        return 1.0
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else 1.0


def run(args: argparse.Namespace) -> int:
    from tools import plan as tool
    from trainer.planning import calibrate, candidates, costs, predict

    def parse(sizes: str) -> list[tuple[int, int]]:
        return [(int(a), int(b)) for a, b in (x.split("x") for x in sizes.split(",") if x)]

    families = [(MODEL, size) for size in (QUICK_SIZES if args.quick else parse(args.sizes))]
    families += [] if args.quick else [(MESH_MODEL, size) for size in parse(args.mesh_sizes)]
    steps = 3 if args.quick else args.train_steps
    processes = QUICK_PROCESSES if args.quick else args.processes
    records = []
    plan_seconds = []
    choice_ratio, naive_ratio = [], []
    for model, (layers, width) in families:
        meshed = model == MESH_MODEL
        gin = bindings(layers, width, model=model)
        root = resolve(model, gin)
        prefix = costs.pipeline_prefix(root)
        name = cost_name(model, layers, width)
        sample = candidates.micro_batch_sizes(int(root.input.train.batch_size), processes)
        progress = (
            (lambda m: print(f"plan benchmark: {m}", file=sys.stderr, flush=True))
            if args.verbose
            else (lambda m: None)
        )
        model_costs, cache, _ = costs.load_or_measure(root, name, sample, progress)
        cores = len(os.sched_getaffinity(0))  # every process of the plans runs on this host
        # the stage-mesh form planned for one process (module doc); no replicas here
        ways = {"processes": 1 if meshed else processes, "stage_mesh": meshed, "max_replicas": 1}
        enumerated = candidates.enumerate_plans(model_costs, **ways)
        trials = 1 if args.quick else args.calibration_trials
        target = calibrate.Target(model, gin, prefix, cores, progress, trials)
        calibrate.ensure(target, model_costs, cache, enumerated)
        start = time.monotonic()  # the planner's own time: enumerate and predict, costs cached
        link, latency = model_costs.link_bytes_per_s, model_costs.link_latency_s
        plans = list(candidates.enumerate_plans(model_costs, **ways))
        preds = [predict.predict(model_costs, p, link, latency, cores) for p in plans]
        fitting = sorted(
            (p for p in preds if p.fits(args.budget_mib)), key=lambda p: tool.rank_key(p, "step_time")
        )
        plan_seconds.append(time.monotonic() - start)
        picked = pick_mesh(preds) if meshed else pick(preds, 2 if args.quick else args.plans, args.quick)
        choice = fitting[0] if fitting else None
        if choice is not None and choice not in picked:
            picked.append(choice)
        naive = None
        if not args.quick and not meshed:
            naive = predict.predict(
                model_costs, naive_plan(args.processes, model_costs), link, latency, cores
            )
            picked.append(naive)
        train = functools.partial(train_plan, model, gin, prefix, model_costs, steps, args.timeout_s)
        size = f"{layers}x{width}" + (" stage-mesh form" if meshed else "")
        measured = {}
        for pred in picked:
            m = train(pred)
            measured[id(pred)] = m
            record = {"size": size, **pred.to_json(args.budget_mib), "measured": m}
            harness.emit("plan_run", m.get("step_s"), **record)
            if m["ok"]:
                records.append((pred, m))
        ok_fitting = [(p, measured[id(p)]) for p in fitting if id(p) in measured and measured[id(p)]["ok"]]
        if choice is not None and measured.get(id(choice), {}).get("ok") and ok_fitting:
            steps_of = choice_steps(choice, ok_fitting, train, 1 if args.quick else args.choice_trials)
            best = min(steps_of.values())
            choice_ratio.append(steps_of[id(choice)] / best)
            harness.emit(
                "plan_choice",
                steps_of[id(choice)],
                size=size,
                plan=choice.plan.name(),
                best=min(ok_fitting, key=lambda pm: steps_of[id(pm[0])])[0].plan.name(),
                best_step_s=best,
            )
            if naive is not None and measured[id(naive)]["ok"]:
                naive_ratio.append(measured[id(naive)]["step_s"] / measured[id(choice)]["step_s"])
    predicted = [p.step_s for p, _ in records]
    actual = [m["step_s"] for _, m in records]
    errors = [abs(a / p - 1) for p, a in zip(predicted, actual)]
    mem_pred = [proc.total / 2**20 for p, _ in records for proc in p.processes]
    mem_meas = [x for _, m in records for x in m["peaks_mib"]]
    mem_errors = [abs(a / p - 1) for p, a in zip(mem_pred, mem_meas)]
    under = [a / p - 1 for p, a in zip(mem_pred, mem_meas)]
    n = len(records)
    harness.emit("plan_step_rank_corr", spearman(predicted, actual) if n else None, plans=n)
    harness.emit("plan_step_error_median", statistics.median(errors) if errors else None, plans=n)
    harness.emit("plan_step_error_max", max(errors) if errors else None, plans=n)
    harness.emit("plan_memory_error_median", statistics.median(mem_errors) if mem_errors else None)
    harness.emit("plan_memory_under_max", max(under) if under else None)
    harness.emit("plan_choice_vs_best", max(choice_ratio) if choice_ratio else None)
    harness.emit("plan_choice_vs_naive", min(naive_ratio) if naive_ratio else None)
    harness.emit("plan_seconds", max(plan_seconds) if plan_seconds else None)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark plan", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--processes", type=int, default=5, help="N: the processes the planner may use.")
    parser.add_argument("--budget_mib", type=float, default=2000.0, help="Memory per process.")
    parser.add_argument(
        "--sizes", default=",".join(f"{a}x{b}" for a, b in SIZES), help="Sizes (layers x width) to check."
    )
    parser.add_argument(
        "--plans",
        type=int,
        default=24,
        help="Plans trained per size (the choice and the naive plan besides).",
    )
    parser.add_argument(
        "--train_steps",
        type=int,
        default=8,
        help="Steps each plan trains (its step: all but the first two's median).",
    )
    parser.add_argument(
        "--mesh_sizes",
        default=",".join(f"{a}x{b}" for a, b in MESH_SIZES),
        help="Sizes checked in the family's stage-mesh form (mesh and pipeline x mesh plans); '' for none.",
    )
    parser.add_argument(
        "--calibration_trials",
        type=int,
        default=3,
        help="Times each calibration run is trained: the step the median, each process's peak the "
        "highest (--quick: 1).",
    )
    parser.add_argument(
        "--choice_trials",
        type=int,
        default=3,
        help="Runs of the choice and of each plan measured no slower than it, the median taken "
        "for plan_choice_vs_best (--quick: 1).",
    )
    parser.add_argument("--timeout_s", type=float, default=600.0, help="Seconds one plan may take.")
    parser.add_argument("--quick", action="store_true", help="One tiny size, two plans (a smoke test).")
    parser.add_argument("--verbose", action="store_true", help="Progress on stderr.")
    args = parser.parse_args(argv[1:])
    for flag in ("calibration_trials", "choice_trials"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
