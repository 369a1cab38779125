"""``python -m tools.benchmark input --model=lm.text.TextTransformerLM``: a text corpus input's figures.

For an experiment whose training input packs text (``CorpusLmInput``), prints JSON lines:

- ``packing_efficiency``: real tokens / slots over one epoch of ``input.train`` as configured (packed),
  with ``padding_efficiency`` beside it: the same epoch one sentence per row (``batching = 'pad'``).
- ``input_tokens_per_sec``: real tokens the input pipeline alone yields a second over a whole epoch
  read from scratch (files opened, sentences tokenized and packed; a corpus small enough to be cached
  is tokenized inside the timing; nothing else running).
- ``input_cpu_ms_per_step``: CPU time (user + system, every thread of the process) the input pipeline
  alone spends a batch of ``input.train`` as the trainer reads it (shuffled, repeated, prefetched),
  after a warm-up, nothing else running; the best of the rounds of ``--steps`` x 8 batches. What the
  input takes from the cores the trainer's step runs on.
- ``input_bound_fraction``: the share of a training step spent waiting for input. The trainer's own
  compiled steps (``trainer.train_step.TrainStep``, ``--steps`` a call) run twice in alternating rounds:
  on the real input, and on one batch held in memory (the same model, no input work); the fraction is
  ``1 - compute / real`` of the best rounds (0 when input never delays a step). Threads: what
  ``trainer.tf_settings.configure`` gives the trainer on this machine (``os.cpu_count()`` cores).
"""

from __future__ import annotations

import json
import os
import resource
import time

import numpy as np

from params.hyperparams import Params


def _epoch_efficiency(train: Params, batching: str) -> float:
    p = train.copy().set(batching=batching, repeat=False, shuffle_seed=None, drop_remainder=False)
    paddings = np.concatenate([b["paddings"].numpy().ravel() for b in p.instantiate().dataset()])
    return float(1.0 - paddings.mean())


def _tokens_per_sec(train: Params, rounds: int) -> float:
    """Real tokens a second over whole epochs of the input alone, each read from scratch (files opened,
    sentences tokenized and packed), unshuffled; the best of ``rounds``."""
    p = train.copy().set(repeat=False, shuffle_seed=None, drop_remainder=False)
    best = 0.0
    for _ in range(rounds):
        start, tokens = time.perf_counter(), 0.0
        for batch in p.instantiate().dataset():
            tokens += float((batch["paddings"].numpy() == 0).sum())
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_per_step(train: Params, steps: int, rounds: int) -> float:
    """CPU seconds of the process a batch of ``train`` (as configured) costs, the best of ``rounds``."""
    iterator = iter(train.instantiate().dataset())
    for _ in range(20):  # tracing, the first windows packed, buffers filled
        next(iterator)
    best = float("inf")
    for _ in range(rounds):
        start = _cpu_seconds()
        for _ in range(steps):
            next(iterator)
        best = min(best, (_cpu_seconds() - start) / steps)
    return best


def _input_bound_fraction(root: Params, steps: int, rounds: int) -> tuple[float, float, float]:
    """(fraction, seconds a step on the real input, seconds a step on a batch in memory)."""
    import tensorflow as tf

    from params import experiment
    from trainer.train_step import TrainStep

    task_params = experiment.task_params_for(root, "train")
    real = TrainStep(task_params, root.input.train)
    held = TrainStep(task_params, root.input.train)
    batch = next(iter(root.input.train.instantiate().dataset()))
    held.iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())  # before its step is traced
    best = {"real": float("inf"), "held": float("inf")}
    for step in (real, held):
        step.run(steps)  # tracing, buffers filled
    for _ in range(rounds):
        for name, step in (("real", real), ("held", held)):
            start = time.perf_counter()
            finite, _ = step.run(steps)
            bool(finite.numpy())
            best[name] = min(best[name], (time.perf_counter() - start) / steps)
    return max(0.0, 1.0 - best["held"] / best["real"]), best["real"], best["held"]


def run(root: Params, model: str, steps: int, rounds: int) -> int:
    from trainer import tf_settings

    tf_settings.configure(root.cluster)
    train = root.input.train
    load = lambda: round(os.getloadavg()[0], 2)  # noqa: E731
    base = {"benchmark": "input", "model": model}
    packed, padded = _epoch_efficiency(train, train.batching), _epoch_efficiency(train, "pad")
    print(
        json.dumps(
            {
                **base,
                "name": "packing_efficiency",
                "value": round(packed, 4),
                "batching": train.batching,
                "padding_efficiency": round(padded, 4),
                "seq_length": train.seq_length,
                "loadavg_1m": load(),
            }
        ),
        flush=True,
    )
    rate = _tokens_per_sec(train, rounds)
    print(json.dumps({**base, "name": "input_tokens_per_sec", "value": round(rate), "loadavg_1m": load()}))
    cpu = _cpu_per_step(train, steps * 8, rounds)
    print(
        json.dumps(
            {**base, "name": "input_cpu_ms_per_step", "value": round(cpu * 1e3, 3), "loadavg_1m": load()}
        ),
        flush=True,
    )
    fraction, real, held = _input_bound_fraction(root, steps, rounds)
    figure = {
        **base,
        "name": "input_bound_fraction",
        "value": round(fraction, 4),
        "ms_per_step_real_input": round(real * 1e3, 2),
        "ms_per_step_batch_in_memory": round(held * 1e3, 2),
        "batch_size": train.batch_size,
        "cpu_count": os.cpu_count(),
        "loadavg_1m": load(),
    }
    print(json.dumps(figure), flush=True)
    return 0
