"""A tiny experiment for the trainer's tests: linear regression on generated data in .npz files.

The model has everything the trainer must get right for an exact resume: Adam slots, stateless input
dropout keyed by step, a moving statistic applied through ``ctx.add_update``, a shuffled input.
``nan_at_step`` makes the training loss NaN at one step (for the divergence test).
"""

from __future__ import annotations

import io

import numpy as np
import tensorflow as tf

from layers.base_layer import FPropContext, weight_init_params, weight_params
from params import registry
from params.errors import UserError
from params.experiment import Experiment
from tasks.base_input import BaseInput
from tasks.base_task import AverageMetric, BaseTask

INPUT_DIM = 4
TRUE_W = np.array([1.5, -2.0, 0.5, 3.0], np.float32)
TRUE_B = 0.5


def write_data(path: str, num_examples: int, seed: int) -> None:
    """Writes x [n, 4] and y = x . TRUE_W + TRUE_B + noise to an .npz file."""
    rng = np.random.RandomState(seed)
    x = rng.normal(size=(num_examples, INPUT_DIM)).astype(np.float32)
    y = (x @ TRUE_W + TRUE_B + 0.1 * rng.normal(size=num_examples)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buf.getvalue())


class LinearInput(BaseInput):
    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("data_file", "", "An .npz file with arrays x and y.")
        return p

    def examples(self) -> tf.data.Dataset:
        path = self.params.data_file
        if not tf.io.gfile.exists(path):
            raise UserError(f"input {self.params.name}: data_file {path!r} does not exist")
        with tf.io.gfile.GFile(path, "rb") as f:
            data = np.load(io.BytesIO(f.read()))
            x, y = data["x"], data["y"]
        return tf.data.Dataset.from_tensor_slices({"x": x, "y": y})


class LinearTask(BaseTask):
    @classmethod
    def Params(cls):
        p = super().Params()
        p.define("input_dim", INPUT_DIM, "Features per example.")
        p.define("keep_prob", 0.9, "Input dropout keep probability in training.")
        p.define("nan_at_step", -1, "Make the training loss NaN at this step (-1: never).")
        return p

    def __init__(self, params, parent=None) -> None:
        super().__init__(params, parent)
        p = self.params
        self.create_variable("w", weight_params([p.input_dim, 1]))
        self.create_variable("b", weight_params([1], init=weight_init_params("constant", 0.0)))
        self.create_variable(
            "moving_mean_y", weight_params([], init=weight_init_params("constant", 0.0), trainable=False)
        )

    def compute_predictions(self, ctx: FPropContext, batch):
        x = batch["x"][:, : self.params.input_dim]  # fewer features than the data: a smaller model
        keep = self.params.keep_prob
        if ctx.training and keep < 1.0:
            noise = tf.random.stateless_uniform(tf.shape(x), self.dropout_seed(ctx))
            x = tf.where(noise < keep, x / keep, tf.zeros_like(x))
        return {"prediction": tf.squeeze(x @ self.vars["w"], -1) + self.vars["b"]}

    def compute_loss(self, ctx: FPropContext, predictions, batch):
        y = batch["y"]
        error = predictions["prediction"] - y
        weight = tf.cast(tf.shape(y)[0], tf.float32)
        loss = tf.reduce_mean(tf.square(error))
        if self.params.nan_at_step >= 0 and ctx.training:
            bad = tf.equal(tf.cast(ctx.step, tf.int64), self.params.nan_at_step)
            loss += tf.where(bad, tf.constant(np.nan, tf.float32), 0.0)
        ctx.add_update(self, "moving_mean_y", tf.reduce_mean(y), weight)
        return {"loss": (loss, weight), "mae": (tf.reduce_mean(tf.abs(error)), weight)}

    def apply_update(self, name: str, value: tf.Tensor) -> None:
        var = self.vars[name]
        var.assign(0.9 * var + 0.1 * value)

    def model_analysis(self) -> str:
        return f"linear regression on {self.params.input_dim} features"

    def decode(self, ctx: FPropContext, batch):
        return {"prediction": self.compute_predictions(ctx, batch)["prediction"], "target": batch["y"]}

    def create_decoder_metrics(self):
        return {"decode_mae": AverageMetric()}

    def post_process_decode_out(self, decode_out, metrics):
        records = []
        for pred, target in zip(decode_out["prediction"], decode_out["target"]):
            metrics["decode_mae"].update(abs(float(pred) - float(target)))
            records.append({"prediction": float(pred), "target": float(target)})
        return records


@registry.register
class LinearRegression(Experiment):
    """Linear regression; data files are set with input.<ds>.data_file."""

    def task(self):
        p = LinearTask.Params()
        p.train.set(
            learning_rate=0.05,
            max_steps=30,
            save_interval_steps=10,
            summary_interval_steps=5,
            log_interval_steps=10,
            save_max_to_keep=5,
        )
        p.eval.poll_interval_seconds = 0.2
        return p

    def _input(self, name: str, batch_size: int, train: bool):
        p = LinearInput.Params()
        p.set(name=name, batch_size=batch_size, repeat=train, shuffle_seed=7 if train else None)
        return p

    def train(self):
        return self._input("train", 16, True)

    def dev(self):
        return self._input("dev", 16, False)

    def test(self):
        return self._input("test", 8, False)
