"""The GPipe transparency tests' shared pieces: a tiny MLP, its pipeline, SGD training that returns
losses, gradients and weights, and the sequential references the pipeline must equal."""

import functools

import numpy as np
import tensorflow as tf

from layers import core
from layers.base_layer import BaseLayer, FPropContext
from layers.parallel.pipeline import gpipe
from params.hyperparams import InstantiableParams

# OUT_DIM 4: the mean squared error divides by BATCH * OUT_DIM = 32, a power of two. The in-step
# schedules (1F1B, interleaved, zero bubble) seed each micro-batch's backward with ones and scale the
# summed gradients by the loss's constant at the end; by 1/24 (OUT_DIM 3) that is one more rounding
# than the reference's, which batch norm over micro-batches of 2 examples amplifies over 10 steps to
# 2.2e-3 (K=2, M=4, remat always); by 1/32 the scaling is exact and they drift as fill-drain does.
BATCH, IN_DIM, OUT_DIM = 8, 6, 4
TOL = 1e-5
# Batch norm over micro-batches of 2 examples divides by tiny variances, which amplifies float32
# rounding (a different summation order) over 10 steps to a few 1e-5 (1.6e-4 at K=2, M=4, remat
# always; 2.4e-4 on one weight at K=4, M=4); the first steps agree to 1e-6.
BN_TOL = 5e-4


def mlp(dropout: bool = True, depth: int = 4, batch_norm: bool = False) -> list[InstantiableParams]:
    """A tiny MLP: projections (tanh) with dropout between them, so every K in {1, 2, 4} can cut it.
    With ``batch_norm``, batch norm follows fc0 and fc2: the second one's input depends on the first's
    per-micro-batch normalization."""
    dims = [IN_DIM] + [5] * (depth - 1) + [OUT_DIM]
    layers = []
    for i in range(depth):
        act = "tanh" if i < depth - 1 else "none"
        layers.append(
            core.ProjectionLayer.Params().set(
                name=f"fc{i}", input_dim=dims[i], output_dim=dims[i + 1], activation=act
            )
        )
        if batch_norm and i in (0, 2) and i < depth - 1:
            layers.append(core.BatchNormLayer.Params().set(name=f"bn{i}", dim=5, decay=0.5))
        if dropout and i < depth - 1:
            layers.append(core.DropoutLayer.Params().set(name=f"drop{i}", keep_prob=0.75))
    return layers


def pipeline(layers, num_stages=1, num_micro_batches=1, remat="always", **kwargs) -> gpipe.GPipeLayer:
    p = gpipe.GPipeLayer.Params().set(
        name="net",
        layers=layers,
        num_stages=num_stages,
        num_micro_batches=num_micro_batches,
        remat=remat,
        **kwargs,
    )
    return p.instantiate()


def sequential(layers) -> BaseLayer:
    # Same root name and child names as the pipeline: same variable paths, so the same initial weights.
    return core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()


def data(seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batch, IN_DIM)).astype(np.float32)
    y = rng.normal(size=(batch, OUT_DIM)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def train(model, forward, steps=10, lr=0.1, loss_fn=None):
    """SGD on a squared loss; returns (losses, first-step gradients, final weights) as NumPy.
    ``loss_fn(model, ctx, x, target)``, if given, computes the loss instead of ``forward``."""
    x, target = data()
    variables = model.trainable_variables

    @tf.function(autograph=False)  # as the trainer traces (trainer/tracing.py)
    def step(i):
        ctx = FPropContext(training=True, step=i, seed=7)
        with tf.GradientTape() as tape:
            if loss_fn is not None:
                loss = loss_fn(model, ctx, x, target)
            else:
                loss = tf.reduce_mean(tf.square(forward(model, ctx, x) - target))
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(lr * g)
        ctx.apply_updates()
        return loss, grads

    losses, first_grads = [], None
    for i in range(steps):
        loss, grads = step(tf.constant(i))
        losses.append(loss.numpy())
        if first_grads is None:  # by name: layers' variable order differs between containers
            first_grads = {v.name: g.numpy() for v, g in zip(variables, grads)}
    weights = {v.name: v.numpy() for v in model.variables}
    return np.array(losses), first_grads, weights


def pipelined_forward(model, ctx, x):
    return model(ctx, x)


def micro_batched_forward(num_micro_batches):
    """The sequential model run micro-batch by micro-batch with the pipeline's randomness keys."""

    def forward(model, ctx, x):
        parts = tf.split(x, num_micro_batches)
        return tf.concat([model(ctx.for_micro_batch(m), xm) for m, xm in enumerate(parts)], 0)

    return forward


def unpipelined_forward(model, ctx, x):
    return model(ctx, x)


@functools.cache
def reference(num_micro_batches: int, dropout: bool = True, batch_norm: bool = False):
    """The sequential model trained on the whole batch where that is what the pipeline computes
    exactly (one micro-batch; or no batch norm and no dropout, whose masks are keyed by micro-batch),
    else micro-batch by micro-batch with the pipeline's randomness keys and batch-norm statistics."""
    model = sequential(mlp(dropout, batch_norm=batch_norm))
    if num_micro_batches == 1 or not (dropout or batch_norm):
        return train(model, unpipelined_forward)
    return train(model, micro_batched_forward(num_micro_batches))


def assert_same_training(got, want, tol=TOL):
    losses, grads, weights = got
    want_losses, want_grads, want_weights = want
    assert np.max(np.abs(losses - want_losses)) <= tol, (losses, want_losses)
    assert sorted(grads) == sorted(want_grads)
    for name, g in grads.items():
        assert np.max(np.abs(g - want_grads[name])) <= tol, name
    assert sorted(weights) == sorted(want_weights)
    for name, value in weights.items():
        assert np.max(np.abs(value - want_weights[name])) <= tol, name
    # The run must have learned something, or equality would prove little.
    assert losses[-1] < losses[0]


# A covering subset of K x M x remat (each value of each factor at least once); the full product is slow.
FAST = [(1, 1, "never"), (2, 4, "always"), (4, 8, "except_last"), (2, 2, "never"), (4, 1, "always")]
# Every pair of values of any two factors (K x M, K x remat, M x remat) in 12 of the 36 combinations,
# FAST among them: a fault needs two factors together far more often than three, and the full
# product cost 60 s of 15-minute test budget per schedule for the same behaviour.
PAIRWISE = [
    (1, 1, "never"), (1, 2, "always"), (1, 4, "except_last"), (1, 8, "always"),
    (2, 1, "except_last"), (2, 2, "never"), (2, 4, "always"), (2, 8, "never"),
    (4, 1, "always"), (4, 2, "except_last"), (4, 4, "never"), (4, 8, "except_last"),
]  # fmt: skip
