"""``python -m tools.benchmark input``: milliseconds a step of an experiment's training input costs.

The sides, each the experiment's ``input.train`` (shuffled, repeated, batched, prefetched) read batch
after batch in this process, pinned to one core with one intra- and one inter-op thread, as a trainer
of ``tools.benchmark multiworker`` runs: ``one``, the global batch (what a single trainer process
reads); ``worker_elements``, worker 0 of ``--workers``, each example walking the pipeline (how a sync
worker reads an input without ``in_memory()``); ``worker``, worker 0 of ``--workers``
as the input reads it (row numbers shuffled and sharded, rows gathered a batch at a time, for an
input with ``in_memory()``; the same as ``worker_elements`` otherwise). The two worker sides yield the
same batches; the benchmark checks that first. The sides take turns for ``--rounds`` rounds of
``--steps`` batches; each side's best round counts (load only ever adds time). Prints one JSON line
per side and one with the ratios. An experiment whose training input packs a text corpus
(lm.text.TextTransformerLM) gets ``tools.benchmarks.text_input``'s figures instead: packing
efficiency, the input's tokens/s and CPU time a batch, and the input-bound fraction of the trainer's
step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from params import experiment
from params.errors import UserError


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark input")
    parser.add_argument("--model", default="image.digits.ConvNet", help="Experiment whose input is read.")
    parser.add_argument(
        "--batch_size",
        type=int,
        default=None,
        help="Global batch (default: 2048, tools.benchmark multiworker's; a text corpus: the experiment's).",
    )
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="A gin binding of the experiment's knobs, as the trainer's (repeatable), e.g. "
        "\"TextTransformerLM.train_files='my/shards/train-*.tfrecord'\": a corpus of your own.",
    )
    parser.add_argument("--params_override", default=None, help="Params text applied last, as the trainer's.")
    parser.add_argument("--workers", type=int, default=2, help="Workers the global batch is shared by.")
    parser.add_argument("--steps", type=int, default=200, help="Batches timed per side and round.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds; each side's best counts.")
    return parser.parse_args(argv[1:])


def _resolve(args: argparse.Namespace):
    """The experiment with the user's --gin_param and --params_override, then --batch_size."""
    overrides = [
        args.params_override or "",
        f"input.train.batch_size : {args.batch_size}" if args.batch_size else "",
    ]
    return experiment.resolve(
        args.model, gin_bindings=args.gin_param, params_override="; ".join(o for o in overrides if o) or None
    )


def _text_corpus_root(args: argparse.Namespace):
    """The resolved Params when the experiment's training input packs a text corpus (else None)."""
    root = _resolve(args)
    return root if "batching" in root.input.train else None


def _reader(input_params, shard: tuple[int, int], by_row: bool):
    inp = input_params.instantiate()
    inp.shard(*shard)
    return iter(inp.dataset(by_row=by_row))


def _time(iterator, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
    return (time.perf_counter() - start) / steps


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.steps < 1 or args.rounds < 1:
        print("input: error: --steps and --rounds must be >= 1", file=sys.stderr)
        return 2
    try:
        text_root = _text_corpus_root(args)
    except UserError as e:
        print(f"input: error: {e}", file=sys.stderr)
        return e.exit_code
    if text_root is not None:
        from tools.benchmarks import text_input

        return text_input.run(text_root, args.model, min(args.steps, 50), args.rounds)
    args.batch_size = args.batch_size or 2048
    if args.steps < 1 or args.rounds < 1 or args.workers < 2:
        print("input: error: --steps and --rounds must be >= 1 and --workers >= 2", file=sys.stderr)
        return 2
    if args.batch_size % args.workers:
        print(f"input: error: --batch_size must be a multiple of --workers ({args.workers})", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    root = _resolve(args)
    shard = (0, args.workers)
    sides = {
        "one": _reader(root.input.train, (0, 1), by_row=True),
        "worker_elements": _reader(root.input.train, shard, by_row=False),
        "worker": _reader(root.input.train, shard, by_row=True),
    }
    for _ in range(3):  # the two worker sides read the same batches (untimed, both from the start)
        a, b = next(sides["worker_elements"]), next(sides["worker"])
        if any(not np.array_equal(a[k].numpy(), b[k].numpy()) for k in a):
            print("input: error: the worker sides read different batches", file=sys.stderr)
            return 1
    best: dict[str, float] = {}
    for it in sides.values():
        _time(it, 20)  # warm-up: tracing, buffers filled
    for _ in range(args.rounds):
        for name, it in sides.items():
            best[name] = min(best.get(name, float("inf")), _time(it, args.steps))
    load = round(os.getloadavg()[0], 2)
    for name, seconds in best.items():
        figure = {"side": name, "ms_per_step": round(seconds * 1e3, 3), "loadavg_1m": load}
        print(json.dumps({"benchmark": "input", **figure}), flush=True)
    ratios = {
        "benchmark": "input",
        "worker_over_worker_elements": round(best["worker"] / best["worker_elements"], 3),
        "worker_elements_over_one": round(best["worker_elements"] / best["one"], 3),
        "worker_over_one": round(best["worker"] / best["one"], 3),
        "model": args.model,
        "global_batch": args.batch_size,
        "workers": args.workers,
        "loadavg_1m": load,
    }
    print(json.dumps(ratios), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
