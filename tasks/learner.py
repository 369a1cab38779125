"""The learner: optimizer, learning-rate schedule, gradient clipping and the training-loop settings
a task owns (``task.train.*``).

``Learner(task.params.train)`` is a ``tf.Module``: track it in the ``tf.train.Checkpoint`` next to the
task and its optimizer slots are saved and restored. Per step the trainer computes gradients and calls
``learner.apply_gradients(grads_and_vars, step)``, which adds the L2 term, clips by global norm, and
runs the optimizer with ``learning_rate(step)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import tensorflow as tf

from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError
from params.hyperparams import Params
from tasks import optimizers

LR_SCHEDULES = ("constant", "linear_rsqrt", "linear_cosine", "piecewise")


def train_params() -> Params:
    """``task.train``: how the task is trained and how often the controller saves and summarizes."""
    p = Params()
    p.define("learning_rate", 1e-3, "Peak learning rate; the schedule multiplies it.")
    p.define("optimizer", "adam", "sgd, momentum, adam or adafactor.")
    p.define("momentum", 0.9, "Momentum of the momentum optimizer.")
    p.define("beta1", 0.9, "Adam's first-moment decay.")
    p.define("beta2", 0.999, "Adam's second-moment decay.")
    p.define("epsilon", 1e-7, "Adam's epsilon.")
    p.define("adafactor_decay_rate", 0.8, "Adafactor: second-moment decay is 1 - (step + 1)^-decay_rate.")
    p.define("adafactor_beta1", 0.0, "Adafactor: momentum of the update (0: none, as in the paper).")
    p.define("adafactor_clipping_threshold", 1.0, "Adafactor: clip the update to this RMS (0: off).")
    p.define(
        "adafactor_multiply_by_parameter_scale",
        True,
        "Adafactor: scale the step by max(adafactor_epsilon2, RMS of the weight).",
    )
    p.define("adafactor_epsilon1", 1e-30, "Adafactor: added to squared gradients.")
    p.define("adafactor_epsilon2", 1e-3, "Adafactor: lower bound of the weight RMS in the step size.")
    p.define(
        "lr_schedule",
        "constant",
        "constant, linear_rsqrt (linear warm-up then 1/sqrt decay), linear_cosine (warm-up then "
        "cosine to zero at max_steps) or piecewise (boundaries/values).",
    )
    p.define("warmup_steps", 0, "Steps of linear warm-up (linear_rsqrt, linear_cosine).")
    p.define("lr_boundaries", [], "piecewise: steps at which the multiplier changes.")
    p.define("lr_values", [], "piecewise: multipliers, one more than lr_boundaries.")
    p.define("clip_gradient_norm_to_value", 0.0, "Clip gradients to this global norm (0: off).")
    p.define("l2_regularizer_weight", 0.0, "Weight of 0.5 * sum of squared trainable weights.")
    p.define("max_steps", 1000, "Stop training at this global step.")
    p.define("save_interval_steps", 100, "Save a checkpoint every this many steps (0: only at max_steps).")
    p.define("save_interval_seconds", 0, "Also save when this many seconds passed (0: off).")
    p.define("save_max_to_keep", 5, "Checkpoints kept; older ones are deleted (0: keep all).")
    p.define("summary_interval_steps", 10, "Write train summaries every this many steps (0: off).")
    p.define("log_interval_steps", 50, "Print a progress line every this many steps (0: off).")
    return p


def _check(ok: bool, key: str, expected: str, value: object) -> None:
    if not ok:
        raise ConfigError(f"task.train.{key}: expected {expected}, got {value!r}")


def validate(p: Params) -> None:
    """Raises ConfigError (one line naming the setting) for settings no learner can run."""
    _check(p.learning_rate >= 0, "learning_rate", "a number >= 0", p.learning_rate)
    _check(p.optimizer in optimizers.OPTIMIZERS, "optimizer", " or ".join(optimizers.OPTIMIZERS), p.optimizer)
    _check(0 <= p.momentum < 1, "momentum", "a number in [0, 1)", p.momentum)
    _check(0 <= p.beta1 < 1, "beta1", "a number in [0, 1)", p.beta1)
    _check(0 <= p.beta2 < 1, "beta2", "a number in [0, 1)", p.beta2)
    _check(p.epsilon > 0, "epsilon", "a number > 0", p.epsilon)
    _check(p.adafactor_decay_rate > 0, "adafactor_decay_rate", "a number > 0", p.adafactor_decay_rate)
    _check(0 <= p.adafactor_beta1 < 1, "adafactor_beta1", "a number in [0, 1)", p.adafactor_beta1)
    _check(
        p.clip_gradient_norm_to_value >= 0,
        "clip_gradient_norm_to_value",
        ">= 0 (0: off)",
        p.clip_gradient_norm_to_value,
    )
    _check(p.l2_regularizer_weight >= 0, "l2_regularizer_weight", "a number >= 0", p.l2_regularizer_weight)
    _check(p.max_steps > 0, "max_steps", "an int > 0", p.max_steps)
    for key in (
        "save_interval_steps",
        "save_interval_seconds",
        "summary_interval_steps",
        "log_interval_steps",
    ):
        _check(p.get(key) >= 0, key, "an int >= 0 (0: off)", p.get(key))
    _check(p.lr_schedule in LR_SCHEDULES, "lr_schedule", " or ".join(LR_SCHEDULES), p.lr_schedule)
    _check(p.warmup_steps >= 0, "warmup_steps", "an int >= 0", p.warmup_steps)
    if p.lr_schedule == "linear_rsqrt":
        _check(p.warmup_steps > 0, "warmup_steps", "an int > 0 for lr_schedule linear_rsqrt", p.warmup_steps)
    if p.lr_schedule == "linear_cosine":
        _check(
            p.warmup_steps < p.max_steps,
            "warmup_steps",
            f"fewer than max_steps ({p.max_steps}) for lr_schedule linear_cosine",
            p.warmup_steps,
        )
    if p.lr_schedule == "piecewise":
        bounds, values = list(p.lr_boundaries), list(p.lr_values)
        _check(
            all(isinstance(b, int) and b > 0 for b in bounds) and bounds == sorted(set(bounds)),
            "lr_boundaries",
            "strictly increasing steps > 0",
            bounds,
        )
        _check(
            len(values) == len(bounds) + 1 and all(isinstance(v, (int, float)) and v >= 0 for v in values),
            "lr_values",
            f"{len(bounds) + 1} multipliers >= 0 (one more than lr_boundaries)",
            values,
        )


class Learner(tf.Module):
    """Learning-rate schedule + L2 + gradient clipping + optimizer, built from ``task.train`` Params."""

    # The float32 scalars ``apply_gradients`` returns, in this order.
    SUMMARY_NAMES = ("learning_rate", "grad_norm", "grad_scale")

    def __init__(
        self, params: Params, variables: Sequence[tf.Variable] | None = None, home: object = None
    ) -> None:
        """``home``: the DTensor mesh of the step's scalars (loss, global step, the summaries this
        returns) when the variables lie on several meshes (GPipe stages on meshes of their own)."""
        super().__init__(name="learner")
        self._home = home
        validate(params)
        self._params = params.copy().freeze()
        self.optimizer = optimizers.from_train_params(self._params)
        if variables is not None:
            self.build(variables)

    @property
    def params(self) -> Params:
        return self._params

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Creates the optimizer's slot variables for ``variables`` (the trainable variables, in the
        order ``apply_gradients`` will see them). Call it before ``tf.function`` and before restoring a
        checkpoint; ``apply_gradients`` builds on first use otherwise."""
        self.optimizer.build(list(variables))

    def slot_variables(self) -> list[tf.Variable]:
        """The optimizer's state (also reachable through ``tf.train.Checkpoint(learner=...)``)."""
        return self.optimizer.slot_variables()

    def learning_rate(self, step: tf.Tensor | int) -> tf.Tensor:
        """``learning_rate * multiplier(step)`` as a float32 scalar. With ``s = step``, ``W`` =
        warmup_steps, ``N`` = max_steps, the multiplier is:

        - constant: 1;
        - linear_rsqrt: ``min((s + 1) / W, sqrt(W / (s + 1)))`` (1 at ``s = W - 1``);
        - linear_cosine: ``(s + 1) / W`` while ``s < W``, then
          ``0.5 (1 + cos(pi min(1, (s - W) / (N - W))))`` (cosine from 1 to 0 at ``s = N``);
        - piecewise: ``lr_values[i]`` for ``lr_boundaries[i-1] <= s < lr_boundaries[i]``.
        """
        p = self._params
        s = tf.cast(step, tf.float32)
        warmup = float(p.warmup_steps)
        if p.lr_schedule == "constant":
            multiplier = tf.ones_like(s)
        elif p.lr_schedule == "linear_rsqrt":
            multiplier = tf.minimum((s + 1.0) / warmup, tf.sqrt(warmup / (s + 1.0)))
        elif p.lr_schedule == "linear_cosine":
            progress = tf.clip_by_value((s - warmup) / (float(p.max_steps) - warmup), 0.0, 1.0)
            cosine = 0.5 * (1.0 + tf.cos(math.pi * progress))
            multiplier = tf.where(s < warmup, (s + 1.0) / max(warmup, 1.0), cosine)
        else:  # piecewise
            bounds = tf.constant([float(b) for b in p.lr_boundaries], tf.float32)
            values = tf.constant([float(v) for v in p.lr_values], tf.float32)
            index = tf.reduce_sum(tf.cast(s >= bounds, tf.int32))
            multiplier = tf.gather(values, index)
        return tf.constant(float(p.learning_rate), tf.float32) * multiplier

    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[tf.Tensor | None, tf.Variable]],
        step: tf.Tensor | int,
        finite: tf.Tensor | None = None,
    ) -> dict[str, tf.Tensor]:
        """One training update at global ``step`` (before it is incremented).

        Variables with a None gradient are skipped. The gradient of each trainable variable gets
        ``l2_regularizer_weight * var``; then all gradients are scaled by ``grad_scale = min(1,
        clip_gradient_norm_to_value / grad_norm)`` (1 when clipping is off), where ``grad_norm`` is
        their global norm after the L2 term. Returns float32 scalars ``learning_rate``, ``grad_norm``
        and ``grad_scale`` for summaries. ``finite`` (a bool scalar): each variable and its slots
        change only where it is true, under a condition on the variable's own mesh.
        """
        p = self._params
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("apply_gradients: no variable has a gradient")
        grads, variables = [], []
        for grad, var in pairs:
            grad = tf.convert_to_tensor(grad)  # IndexedSlices (embedding lookups) become dense
            if p.l2_regularizer_weight and var.trainable:
                with tf.device(grad.device):
                    grad = grad + tf.cast(p.l2_regularizer_weight, grad.dtype) * var
            grads.append(grad)
            variables.append(var)
        meshes = [mesh_lib.mesh_of(v) for v in variables]
        across = len({m for m in meshes if m is not None}) > 1
        home = (self._home if self._home is not None else meshes[-1]) if across else None
        if across:  # each square on its variable's mesh, summed on the home mesh
            squares = [
                mesh_lib.scalar_on(tf.reduce_sum(tf.square(g)), home, m) for g, m in zip(grads, meshes)
            ]
            grad_norm = tf.sqrt(tf.add_n(squares))
        else:
            grad_norm = tf.linalg.global_norm(grads)
        if p.clip_gradient_norm_to_value > 0:
            clip = tf.constant(float(p.clip_gradient_norm_to_value), tf.float32)
            grad_scale = tf.minimum(1.0, clip / tf.maximum(grad_norm, 1e-30))
            grads = [
                _scaled(g, mesh_lib.scalar_on(grad_scale, m) if across else grad_scale)
                for g, m in zip(grads, meshes)
            ]
        else:
            grad_scale = mesh_lib.scalar_on(tf.constant(1.0, tf.float32), home)
        lr = mesh_lib.scalar_on(self.learning_rate(step), home)
        self.optimizer.apply(grads, variables, lr, step, across_meshes=across, guard=finite)
        return dict(zip(self.SUMMARY_NAMES, (lr, tf.cast(grad_norm, tf.float32), grad_scale)))


def _scaled(grad: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """``grad * scale`` on ``grad``'s device (a pipeline stage's gradients are made on its device, as
    ``tf.linalg.global_norm`` computes each square where its tensor is): left unplaced, the product
    would run on the caller's device, which for stages on other processes sends every gradient to the
    trainer and back each step. (``tf.device``, not the deprecated ``colocate_with``, whose warning
    every trainer would print.)"""
    with tf.device(grad.device):
        return grad * tf.cast(scale, grad.dtype)
