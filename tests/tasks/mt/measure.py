"""Trains a registered experiment with the tests' plain loop and prints what its defaults reach.

    python -m tests.tasks.mt.measure mt.algorithmic.ReverseTransformer [--steps N] [--eval_every N]
    python -m tests.tasks.mt.measure lm.synthetic.TransformerLM

Prints one JSON line per evaluation (training time so far, dev metrics) and, for tasks that decode,
the test set's decoder metrics at the end. Used to tune the experiments' defaults until the trainer
binary drives them; see the report in each experiment's docstring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from layers.base_layer import FPropContext  # noqa: E402
from params import experiment  # noqa: E402
from tasks.base_task import BaseTask  # noqa: E402
from tasks.learner import Learner  # noqa: E402
from tests.tasks.loop import evaluate  # noqa: E402


def make_train_step(task: BaseTask, learner: Learner):
    """One compiled training step (compiled once, unlike tests.tasks.loop.train_steps per call)."""
    variables = list(task.trainable_variables)
    learner.build(variables)

    @tf.function
    def step_fn(step: tf.Tensor, batch: dict[str, tf.Tensor]) -> tf.Tensor:
        ctx = FPropContext(training=True, step=step)
        with tf.GradientTape() as tape:
            loss = task.fprop(ctx, batch)["loss"][0]
        learner.apply_gradients(zip(tape.gradient(loss, variables), variables), step)
        ctx.apply_updates()
        return loss

    return step_fn


def decode_dataset(task: BaseTask, dataset: tf.data.Dataset) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Runs the task's decode over a data set as a decoder job does: (metric values, records)."""
    decode_fn = tf.function(lambda batch: task.decode(FPropContext(training=False), batch))
    metrics = task.create_decoder_metrics()
    records = []
    for batch in dataset:
        out = {k: v.numpy() for k, v in decode_fn(batch).items()}
        records += task.post_process_decode_out(out, metrics)
    return {name: m.value for name, m in metrics.items()}, records


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=0, help="Train steps (0: task.train.max_steps).")
    parser.add_argument("--eval_every", type=int, default=250)
    parser.add_argument("--params_override", default=None)
    parser.add_argument("--decode_dataset", default="test")
    args = parser.parse_args(argv[1:])

    root = experiment.resolve(args.model, params_override=args.params_override)
    task = experiment.task_params_for(root, "train").instantiate()
    learner = Learner(root.task.train)
    batches = iter(root.input.train.instantiate().dataset())
    dev = root.input.dev.instantiate().dataset()
    steps = args.steps or root.task.train.max_steps
    print(json.dumps({"model": args.model, "parameters": task.num_parameters(), "steps": steps}), flush=True)
    train_step = make_train_step(task, learner)
    train_seconds = 0.0
    done = 0
    while done < steps:
        chunk = min(args.eval_every, steps - done)
        start = time.perf_counter()
        for step in range(done, done + chunk):
            loss = train_step(tf.constant(step, tf.int64), next(batches))
        train_seconds += time.perf_counter() - start
        done += chunk
        dev_metrics = evaluate(task, dev)
        line = {"step": done, "train_seconds": round(train_seconds, 1), "train_loss": round(float(loss), 4)}
        line.update({f"dev_{k}": round(v, 4) for k, v in dev_metrics.items()})
        print(json.dumps(line), flush=True)
    if type(task).decode is not BaseTask.decode:
        name = args.decode_dataset
        eval_task = experiment.task_params_for(root, name).instantiate()
        for v_from, v_to in zip(task.variables, eval_task.variables):
            v_to.assign(v_from)
        start = time.perf_counter()
        values, records = decode_dataset(eval_task, root.input.get(name).instantiate().dataset())
        values = {f"{name}_{k}": round(v, 4) for k, v in values.items()}
        values["decode_seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(values), flush=True)
        print(json.dumps({"example": records[:3]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
