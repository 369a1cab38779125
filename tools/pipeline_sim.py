"""Simulates a pipelined step: step time, bubble and micro-batches in flight per stage, and a picture.

    .venv/bin/python -m tools.pipeline_sim --num_stages=8 --num_micro_batches=32 --forward_ms=2
    .venv/bin/python -m tools.pipeline_sim --num_stages=2 --num_micro_batches=8 \\
        --forward_ms=3.1,2.4 --backward_ms=6.0,4.9 --remat=always --png=/tmp/k2

Prints one JSON line per schedule (every one in layers/parallel/pipeline/schedule.py, interleaved_1f1b only
when M is a multiple of K, dualpipe_v only when M >= 2K; or those named by --schedule,
comma-separated). Stage costs are one
micro-batch's time on each stage: give one value for every stage alike or one per stage; the
backward defaults to twice the forward, the recompute to the forward, and the zero-bubble
schedules' input and weight halves of the backward to half the backward each. Interleaving cuts
each stage into --virtual_stages chunks of equal cost; the V schedules (zbv, dualpipe_v) cut each
device's cost into two stages of a V (device d holds stages d and 2K - 1 - d). The model: each
stage owns its device and runs one op at a time (unless --alone_speedup says a lone stage runs
faster); --transfer_ms is added to every hand-off between stages. With --link_mbit the stages are
hosts joined by links of that rate (layers/parallel/pipeline/network.py): each hand-off of
--bytes_per_handoff bytes then also takes bytes / rate, one at a time in each direction, while the
sender goes on with its next unit. With --png=PREFIX it also writes
PREFIX_<schedule>.png, one row per stage, and with --trace=PREFIX PREFIX_<schedule>.trace.json,
the simulated step as Chrome/Perfetto trace events, and with --csv=PREFIX PREFIX_<schedule>.csv,
its order in torch.distributed.pipelining's CSV (compute only, one row per device; a schedule_file
loads it back).
"""

from __future__ import annotations

import argparse
import json
import sys

from layers.parallel.pipeline import network, simulator, torch_format
from layers.parallel.pipeline import schedule as schedules

NAMES = schedules.SCHEDULES + schedules.V_SCHEDULES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.pipeline_sim",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--num_stages", type=int, required=True, help="K, the number of stages")
    p.add_argument("--num_micro_batches", type=int, required=True, help="M, micro-batches per step")
    p.add_argument(
        "--schedule",
        default="all",
        help=f"all, or some of {', '.join(NAMES)} (comma-separated)",
    )
    p.add_argument("--virtual_stages", type=int, default=2, help="v, chunks per device for interleaved_1f1b")
    p.add_argument("--remat", choices=schedules.REMAT_POLICIES, default="never")
    p.add_argument("--forward_ms", required=True, help="forward time of one micro-batch: one value or K")
    p.add_argument("--backward_ms", default=None, help="backward time: one value or K (default 2x forward)")
    p.add_argument("--recompute_ms", default=None, help="recompute time: one value or K (default forward)")
    p.add_argument(
        "--backward_input_ms", default=None, help="zero bubble: input-gradient time (default half B)"
    )
    p.add_argument(
        "--backward_weight_ms", default=None, help="zero bubble: weight-gradient time (default half B)"
    )
    p.add_argument("--transfer_ms", type=float, default=0.0, help="time of each hand-off between stages")
    p.add_argument(
        "--link_mbit",
        type=float,
        default=None,
        help="stages on hosts joined by links of this rate (Mbit/s each way); --transfer_ms is then "
        "each hand-off's latency",
    )
    p.add_argument(
        "--bytes_per_handoff",
        type=float,
        default=0.0,
        help="with --link_mbit: bytes of one hand-off (a micro-batch's activation or its gradient)",
    )
    p.add_argument(
        "--alone_speedup",
        type=float,
        default=1.0,
        help="how many times faster a stage works while no other stage is busy (1: each stage owns its "
        "device; more where stages share cores, e.g. logical CPU devices: tools.benchmark gpipe measures it)",
    )
    p.add_argument("--png", default=None, help="write PREFIX_<schedule>.png for each simulated schedule")
    p.add_argument("--trace", default=None, help="write PREFIX_<schedule>.trace.json for each schedule")
    p.add_argument("--csv", default=None, help="write PREFIX_<schedule>.csv (PyTorch's format) for each one")
    return p


def _per_stage(flag: str, text: str | None, k: int) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) / 1e3 for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{flag}={text!r}: expected numbers separated by commas") from None
    if len(values) == 1:
        values = values * k
    if len(values) != k:
        raise ValueError(f"--{flag} has {len(values)} values; give one, or one per stage ({k})")
    return values


def _schedule_names(text: str, k: int, m: int) -> list[str]:
    if text == "all":
        return [
            s for s in NAMES if (s != "interleaved_1f1b" or m % k == 0) and (s != "dualpipe_v" or m >= 2 * k)
        ]
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in NAMES:
            raise ValueError(f"--schedule={n!r}: expected all or some of {', '.join(NAMES)}")
    return names


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv[1:])
    k = args.num_stages
    try:
        if k < 1 or args.num_micro_batches < 1:
            raise ValueError("--num_stages and --num_micro_batches must be >= 1")
        costs = simulator.StageCosts.given(
            _per_stage("forward_ms", args.forward_ms, k),
            _per_stage("backward_ms", args.backward_ms, k),
            _per_stage("recompute_ms", args.recompute_ms, k),
            args.transfer_ms / 1e3,
            args.alone_speedup,
            _per_stage("backward_input_ms", args.backward_input_ms, k),
            _per_stage("backward_weight_ms", args.backward_weight_ms, k),
        )
        names = _schedule_names(args.schedule, k, args.num_micro_batches)
        if args.virtual_stages < 1:
            raise ValueError("--virtual_stages must be >= 1")
        link = None
        if args.link_mbit is not None:
            if args.alone_speedup != 1.0:
                raise ValueError("--link_mbit puts each stage on its own host: leave --alone_speedup out")
            if not args.bytes_per_handoff >= 0:
                raise ValueError(f"--bytes_per_handoff must be >= 0, got {args.bytes_per_handoff:g}")
            link = network.Link(args.link_mbit)
        elif args.bytes_per_handoff:
            raise ValueError("--bytes_per_handoff needs --link_mbit")
    except ValueError as e:
        print(f"pipeline_sim: error: {e}", file=sys.stderr)
        return 2
    for name in names:
        v = args.virtual_stages if name == "interleaved_1f1b" else 2 if name in schedules.V_SCHEDULES else 1
        placement = schedules.v_placement(k) if name in schedules.V_SCHEDULES else ()
        try:
            prediction = simulator.simulate(
                name,
                args.num_micro_batches,
                args.remat,
                costs.chunked(v, placement),
                v,
                link,
                args.bytes_per_handoff,
            )
        except schedules.ScheduleError as e:
            print(f"pipeline_sim: error: {e}", file=sys.stderr)
            return 2
        line = prediction.summary()
        if link is not None:
            line.update(link_mbit=args.link_mbit, bytes_per_handoff=args.bytes_per_handoff)
        if args.trace:
            from trainer.pipeline_views import trace as pipeline_trace

            path = f"{args.trace}_{name}.trace.json"
            pipeline_trace.write(
                path, pipeline_trace.trace_events(prediction.events, k, f"{name} (simulated)")
            )
            line["trace"] = path
        if args.csv:
            path = f"{args.csv}_{name}.csv"
            sched = schedules.build(name, k, args.num_micro_batches, "never", v)
            with open(path, "w") as f:
                f.write(torch_format.write_csv(torch_format.to_actions(sched)))
            line["csv"] = path
        if args.png:
            from trainer.pipeline_views import picture as pipeline_picture

            path = f"{args.png}_{name}.png"
            title = f"{name}: K={k}, M={args.num_micro_batches}, remat={args.remat} (simulated)"
            with open(path, "wb") as f:
                f.write(pipeline_picture.draw_png(prediction.events, title))
            line["png"] = path
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
