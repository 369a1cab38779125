"""``python -m tools.benchmark train_overhead``: the trainer job's steps/sec against a plain loop.

Launcher side: the real ``TrainLoop`` (the function the trainer job runs: compiled multi-step calls,
train summaries at the experiment's interval, progress lines, the NaN check and the save-due check,
with saving itself switched off so no checkpoint I/O is timed). Plain side: a ``tf.function`` of one
step (same model, data, batch and learner) called from a Python loop. Both are built in this process
and measured in alternating rounds, so both see the same machine load. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

from params import experiment


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark train_overhead")
    parser.add_argument("--model", default="image.digits.ConvNet", help="Experiment to train.")
    parser.add_argument("--steps", type=int, default=50, help="Steps per side in each round.")
    parser.add_argument("--rounds", type=int, default=20, help="Alternating measurement rounds.")
    parser.add_argument("--warmup_steps", type=int, default=50, help="Untimed steps per side first.")
    parser.add_argument("--params_override", default="", help="Extra 'key : value' overrides.")
    return parser.parse_args(argv[1:])


class PlainLoop:
    """The baseline: one compiled step per Python call, nothing else."""

    def __init__(self, root) -> None:
        import tensorflow as tf

        from layers.base_layer import FPropContext
        from tasks.learner import Learner

        task_params = experiment.task_params_for(root, "train")
        self.task = task_params.instantiate()
        self.iterator = iter(root.input.train.instantiate().dataset())
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        variables = self.task.trainable_variables
        self.learner = Learner(task_params.train, variables)
        seed = self.task.params.random_seed

        @tf.function(autograph=False)
        def train_step():
            batch = next(self.iterator)
            step = self.step.read_value()
            ctx = FPropContext(training=True, step=step, seed=seed)
            with tf.GradientTape() as tape:
                loss = self.task.fprop(ctx, batch)["loss"][0]
            grads = tape.gradient(loss, variables)
            self.learner.apply_gradients(zip(grads, variables), step)
            ctx.apply_updates()
            self.step.assign_add(1)
            return loss

        self._train_step = train_step

    def run(self, num_steps: int) -> None:
        loss = None
        for _ in range(num_steps):
            loss = self._train_step()
        loss.numpy()  # wait for the last step


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.steps < 1 or args.rounds < 1:
        print("train_overhead: error: --steps and --rounds must be >= 1", file=sys.stderr)
        return 2
    total = args.warmup_steps + args.steps * args.rounds
    override = "task.train.save_interval_steps : 0; task.train.save_interval_seconds : 0"
    root = experiment.resolve(args.model, params_override=override)
    if root.task.train.max_steps <= total:
        override += f"; task.train.max_steps : {total + 1}"
    if args.params_override:
        override += "; " + args.params_override
    root = experiment.resolve(args.model, params_override=override)

    from absl import logging as absl_logging

    from trainer import tf_settings
    from trainer.train_job import TrainLoop

    tf_settings.configure(root.cluster)
    absl_logging.set_verbosity(absl_logging.WARNING)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    plain = PlainLoop(root)
    launcher_seconds = plain_seconds = 0.0
    with (
        tempfile.TemporaryDirectory(prefix="train_overhead-") as logdir,
        TrainLoop(root, logdir, log=log) as loop,
    ):
        loop.run(until_step=args.warmup_steps)
        plain.run(args.warmup_steps)
        for _ in range(args.rounds):
            start = time.perf_counter()
            loop.run(until_step=loop.step + args.steps)
            launcher_seconds += time.perf_counter() - start
            start = time.perf_counter()
            plain.run(args.steps)
            plain_seconds += time.perf_counter() - start
    steps = args.steps * args.rounds
    launcher_rate, plain_rate = steps / launcher_seconds, steps / plain_seconds
    record = {
        "name": "train_overhead",
        "ratio": round(launcher_rate / plain_rate, 4),
        "launcher_steps_per_sec": round(launcher_rate, 2),
        "plain_steps_per_sec": round(plain_rate, 2),
        "model": args.model,
        "steps": steps,
        "rounds": args.rounds,
        "batch_size": int(root.input.train.batch_size),
        "summary_interval_steps": int(root.task.train.summary_interval_steps),
        "log_interval_steps": int(root.task.train.log_interval_steps),
    }
    print(json.dumps(record), flush=True)
    return 0
