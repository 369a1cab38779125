"""Trains a registered experiment in this process and prints what its defaults reach, as JSON lines.

    python -m tools.measure mt.algorithmic.ReverseTransformer [--steps N] [--eval_every N]
    python -m tools.measure lm.synthetic.TransformerLM --steps 200

Prints one JSON line per evaluation (training seconds so far, the last step's loss, the dev metrics)
and, for tasks that decode, the test set's decoder metrics and three decoded examples at the end.
Nothing is written: it is for tuning an experiment's defaults (each experiment's docstring reports
what they reach). It runs the trainer's own pieces without a logdir: the ``TrainStep`` on this
process's device, the evaler's weighted means and the decoder's decode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from params import experiment  # noqa: E402
from params.errors import UserError  # noqa: E402
from trainer import tf_settings  # noqa: E402
from trainer.decoder_job import compiled_decode, decode_all, implements_decode  # noqa: E402
from trainer.evaler_job import compiled_batch_metrics, weighted_means  # noqa: E402
from trainer.train_step import TrainStep  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.measure", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="A registered experiment, e.g. mt.algorithmic.ReverseTransformer.")
    parser.add_argument("--steps", type=int, default=0, help="Train steps (0: task.train.max_steps).")
    parser.add_argument("--eval_every", type=int, default=250, help="Steps between dev evaluations.")
    parser.add_argument("--params_override", default=None, help="Params text applied last.")
    parser.add_argument("--decode_dataset", default="test", help="The data set decoded at the end.")
    return parser


def measure(args: argparse.Namespace) -> None:
    root = experiment.resolve(args.model, params_override=args.params_override)
    tf_settings.configure(root.cluster)
    step_fn = TrainStep(experiment.task_params_for(root, "train"), root.input.train)
    task = step_fn.task
    dev = root.input.dev.instantiate().dataset()
    eval_batch = compiled_batch_metrics(task)
    steps = args.steps or int(root.task.train.max_steps)
    print(json.dumps({"model": args.model, "parameters": task.num_parameters(), "steps": steps}), flush=True)
    train_seconds, done = 0.0, 0
    while done < steps:
        chunk = min(args.eval_every, steps - done)
        start = time.perf_counter()
        finite, outputs = step_fn.run(chunk)
        loss = float(outputs["task"]["loss"])
        train_seconds += time.perf_counter() - start
        done = int(step_fn.global_step.numpy())
        if not bool(finite):
            raise UserError(f"the loss is not finite at step {done}")
        line = {"step": done, "train_seconds": round(train_seconds, 1), "train_loss": round(loss, 4)}
        dev_metrics = weighted_means(eval_batch, dev, done)
        line.update({f"dev_{k}": round(v, 4) for k, v in dev_metrics.items()})
        print(json.dumps(line), flush=True)
    if implements_decode(type(task)):
        name = args.decode_dataset
        eval_task = experiment.task_params_for(root, name).instantiate()
        for v_from, v_to in zip(task.variables, eval_task.variables):
            v_to.assign(v_from)
        start = time.perf_counter()
        batches = root.input.get(name).instantiate().dataset()
        values, records = decode_all(eval_task, compiled_decode(eval_task), batches, done)
        out = {f"{name}_{k}": round(v, 4) for k, v in values.items()}
        out["decode_seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(out), flush=True)
        print(json.dumps({"example": records[:3]}, default=str), flush=True)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv[1:])
    try:
        measure(args)
    except UserError as e:  # ConfigError too: one line, its exit status
        print(f"measure: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
