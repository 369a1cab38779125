"""``decoder_<ds>``: decodes a data set with each checkpoint once.

``task.decode`` runs per batch inside ``tf.function``; ``task.post_process_decode_out`` runs eagerly on
the NumPy outputs and returns the records written to ``logdir/decoder_<ds>/decoded-<step>.jsonl``,
updating the task's decoder metrics, which go to TensorBoard and ``scores.jsonl``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import tensorflow as tf

from layers.base_layer import FPropContext
from params.errors import ConfigError
from tasks.base_task import BaseTask
from trainer import files, tracing
from trainer.checkpoint_job import CheckpointJob


def implements_decode(task_cls: type) -> bool:
    """Whether a task class overrides ``BaseTask.decode``."""
    return getattr(task_cls, "decode", None) is not BaseTask.decode


class Decoder(CheckpointJob):
    kind = "decoder"
    settings = "decode"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not implements_decode(type(self.task)):
            raise ConfigError(f"{self.name}: task {type(self.task).__name__} does not implement decode()")
        self._decode_batch = self.shared.function(self.task, "decode", compiled_decode)

    def process(self, step: int) -> dict[str, float]:
        values, records = decode_all(self.task, self._decode_batch, self.batches(), step)
        files.write_jsonl_atomic(files.join(self.directory, f"decoded-{step}.jsonl"), records)
        return values


def compiled_decode(task: BaseTask) -> Callable[[dict, tf.Tensor], dict]:
    """``(batch, step) -> task.decode's outputs``, compiled."""

    def decode(batch: dict[str, tf.Tensor], step: tf.Tensor) -> dict[str, tf.Tensor]:
        ctx = FPropContext(training=False, step=step, seed=task.params.random_seed)
        return task.decode(ctx, batch)

    return tracing.graph_function(decode)


def decode_all(
    task: BaseTask, decode_batch: Callable, batches: Iterable[dict], step: int
) -> tuple[dict[str, float], list[dict]]:
    """Decodes every batch: (the decoder metrics and ``num_decoded``, the post-processed records)."""
    metrics = task.create_decoder_metrics()
    records = []
    step_t = tf.constant(step, tf.int64)
    for batch in batches:
        with tracing.user_errors():
            out = decode_batch(batch, step_t)
        records.extend(task.post_process_decode_out({k: v.numpy() for k, v in out.items()}, metrics))
    values = {name: float(metric.value) for name, metric in metrics.items()}
    values["num_decoded"] = float(len(records))
    return values, records
