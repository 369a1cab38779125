"""A tiny pipelined experiment for the cross-process tests: a GPipe stack of dense layers regressing
a fixed random function of its input, the loss computed per micro-batch in the last stage (a head).

Its cluster splits the CPU into ``num_stages`` logical devices (how evalers, and the one-process
reference, run it); ``cluster.stage_job : 'worker'`` moves the stages onto the worker tasks.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline.gpipe import GPipeLayer
from params import registry
from params.experiment import Experiment, cluster_params
from tasks.base_input import BaseInput
from tasks.base_task import BaseTask

WIDTH = 8


class RandomRegressionInput(BaseInput):
    """``num_examples`` rows x ~ N(0, 1) [WIDTH], y = tanh(x @ A) for a fixed A (seeded)."""

    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("num_examples", 256, "Rows in the data set.")
        p.define("data_seed", 1, "Seed of the rows (A is fixed).")
        return p

    def examples(self) -> tf.data.Dataset:
        a = np.random.RandomState(0).normal(size=(WIDTH, WIDTH)).astype(np.float32) / np.sqrt(WIDTH)
        x = np.random.RandomState(self.params.data_seed).normal(size=(self.params.num_examples, WIDTH))
        x = x.astype(np.float32)
        return tf.data.Dataset.from_tensor_slices({"x": x, "y": np.tanh(x @ a).astype(np.float32)})


class PipelinedRegressionTask(BaseTask):
    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("pipeline", GPipeLayer.Params(), "The GPipe stack.")
        return p

    def __init__(self, params, parent=None) -> None:
        super().__init__(params, parent)
        self.create_child("pipeline", self.params.pipeline)

    def compute_predictions(self, ctx: FPropContext, batch):
        def head(ctx: FPropContext, y: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
            return tf.reduce_sum(tf.square(tf.cast(y, target.dtype) - target), axis=-1)

        return self.pipeline.fprop(ctx, batch["x"], head=head, head_inputs=batch["y"])

    def compute_loss(self, ctx: FPropContext, predictions, batch):
        weight = tf.cast(tf.shape(batch["y"])[0], tf.float32)
        return {"loss": (tf.reduce_sum(predictions) / (weight * WIDTH), weight)}


@registry.register
class PipelinedRegression(Experiment):
    """``depth`` dense tanh layers of width 8 in ``num_stages`` GPipe stages, 4 micro-batches."""

    def __init__(self, num_stages: int = 2, depth: int = 4) -> None:
        self.num_stages = num_stages
        self.depth = depth

    def task(self):
        layers = [
            core.ProjectionLayer.Params().set(
                name=f"fc{i}", input_dim=WIDTH, output_dim=WIDTH, activation="tanh"
            )
            for i in range(self.depth)
        ]
        p = PipelinedRegressionTask.Params()
        p.pipeline = GPipeLayer.Params().set(
            name="pipeline", layers=layers, num_stages=self.num_stages, num_micro_batches=4, remat="always"
        )
        p.train.set(
            optimizer="sgd",
            lr_schedule="constant",
            learning_rate=0.1,
            max_steps=20,
            save_interval_steps=10,
            summary_interval_steps=10,
            log_interval_steps=10,
            save_max_to_keep=10,
        )
        p.eval.poll_interval_seconds = 0.2
        return p

    def cluster(self):
        return cluster_params().set(
            num_logical_cpu_devices=self.num_stages, intra_op_threads=1, inter_op_threads=2
        )

    def train(self):
        return RandomRegressionInput.Params().set(name="train", batch_size=16, repeat=True, shuffle_seed=3)

    def dev(self):
        return RandomRegressionInput.Params().set(name="dev", batch_size=16, num_examples=64, data_seed=2)
