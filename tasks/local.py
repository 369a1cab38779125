"""What a task with a LocalParallelLayer adds to its metrics: the local training signal and the aux
heads' metrics (one ``block<k>_aux_<name>`` summary per block)."""

from __future__ import annotations

import tensorflow as tf

from layers.parallel import local as local_parallel
from tasks.base_task import Metrics


def with_local_losses(metrics: Metrics, out: local_parallel.LocalOutput) -> Metrics:
    """``metrics`` (the task's, on the last block's output) with the aux heads' metrics added and the
    ``loss`` entry carrying the local gradient: its value is still the task's loss, but a trainer that
    differentiates it steps each block on the losses of its window only (see
    ``local_parallel.loss_with_local_gradient``). While the pipeline fills, the task's own metrics
    describe no real batch: their weight is 0."""
    task_loss, weight = metrics["loss"]
    valid = out.valid[-1]  # float32; a metric's weight may be float64 (task.dtype)
    merged = {name: (value, w * tf.cast(valid, w.dtype)) for name, (value, w) in metrics.items()}
    loss = local_parallel.loss_with_local_gradient(task_loss, out)
    merged["loss"] = (tf.cast(loss, task_loss.dtype), weight * tf.cast(valid, weight.dtype))
    merged.update(local_parallel.aux_metrics(out))
    return merged
