"""Optimizers over ``tf.Variable``s, written out so every slot is a plain checkpointed variable.

An optimizer is a ``tf.Module``: ``build(variables)`` creates its slot variables up front (next to each
variable, on its device), so a ``tf.train.Checkpoint`` that tracks the optimizer saves and restores
them. ``apply(grads, variables, lr, step)`` runs one update and can be called inside ``tf.function``.
``step`` is the global step before the update; step-dependent terms (Adam's bias correction,
Adafactor's second-moment decay) use ``t = step + 1``.

A checkpoint keys the slots by position (``slots/<i>/<slot>``: the i-th variable given to ``build``);
each slot's name, which the checkpoint's object graph records beside its key, is
``<variable name>/<optimizer>/<slot>`` (``slot_name``), so that a trainer placed otherwise (another
order of the variables) finds each variable's slots by name (trainer/checkpoint_names.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from params.errors import ConfigError
from params.hyperparams import Params


def slot_name(var_name: str, optimizer: str, slot: str) -> str:
    """The name of ``var_name``'s slot ``slot`` (module doc)."""
    return f"{var_name}/{optimizer}/{slot}"


def slot_owner(name: str) -> str | None:
    """The variable name in a slot's name; None for a name without one (checkpoints written before
    slots were named by their variables: ``adam.3.m``)."""
    parts = name.rsplit("/", 2)
    return parts[0] if len(parts) == 3 else None


class Optimizer(tf.Module):
    """Base of the optimizers: slot bookkeeping; subclasses define ``_slot_specs`` and ``_update``."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self._refs: list = []
        # One {slot name: variable} dict per variable given to build(), in that order.
        self.slots: list[dict[str, tf.Variable]] = []

    def _slot_specs(self, var: tf.Variable) -> dict[str, list[int]]:
        """Slot name -> shape for one variable ({} for a stateless optimizer)."""
        return {}

    def _update(self, grad: tf.Tensor, var: tf.Variable, slots: dict, lr: tf.Tensor, t: tf.Tensor) -> None:
        raise NotImplementedError(f"{type(self).__name__}._update")

    def build(self, variables: Sequence[tf.Variable]) -> None:
        """Creates the slots of ``variables`` (in this order). Calling it again with the same
        variables does nothing; other variables are an error, since slots are tracked by position."""
        refs = [v.ref() for v in variables]
        if self._refs:
            if refs != self._refs:
                raise ValueError(f"{self.name}: already built for a different list of variables")
            return
        if len(set(refs)) != len(refs):
            raise ValueError(f"{self.name}: the same variable is listed twice")
        with tf.init_scope():
            for var in variables:
                var_slots = {}
                for slot, shape in self._slot_specs(var).items():
                    name = slot_name(var.name.split(":")[0], self.name, slot)
                    if isinstance(var, dtensor.DVariable):
                        var_slots[slot] = _mesh_slot(var, list(shape), name)
                        continue
                    with tf.device(var.device):
                        var_slots[slot] = tf.Variable(tf.zeros(shape, var.dtype), trainable=False, name=name)
                # Appended to the list tracked since __init__, so a checkpoint restored before
                # build() (deferred restoration) still reaches the new slots.
                self.slots.append(var_slots)
        self._refs = refs

    def slots_of(self, var: tf.Variable) -> dict[str, tf.Variable]:
        """{slot name: slot variable} of ``var`` (a variable given to ``build``)."""
        index = {ref: i for i, ref in enumerate(self._refs)}.get(var.ref())
        if index is None:
            raise ValueError(f"{self.name}: variable {var.name} was not given to build()")
        return dict(self.slots[index])

    def slot_variables(self) -> list[tf.Variable]:
        """Every slot variable, in variable order (then by slot name)."""
        return [var_slots[name] for var_slots in self.slots for name in sorted(var_slots)]

    def apply(
        self,
        grads: Sequence[tf.Tensor],
        variables: Sequence[tf.Variable],
        lr: tf.Tensor,
        step: tf.Tensor | int,
        across_meshes: bool = False,
        guard: tf.Tensor | None = None,
    ) -> None:
        """One update of ``variables`` by ``grads`` with learning rate ``lr`` at global ``step``.
        ``across_meshes``: the variables lie on several DTensor meshes; ``lr`` and ``step`` are copied
        onto each variable's. ``guard``: update a variable (and its slots) only where this bool
        scalar is true, under a ``tf.cond`` on the variable's own mesh."""
        if len(grads) != len(variables):
            raise ValueError(f"{self.name}: {len(grads)} gradients for {len(variables)} variables")
        if not self._refs:
            self.build(variables)
        index = {ref: i for i, ref in enumerate(self._refs)}
        t = tf.cast(step, tf.float32) + 1.0
        for grad, var in zip(grads, variables):
            i = index.get(var.ref())
            if i is None:
                raise ValueError(f"{self.name}: variable {var.name} was not given to build()")
            slots = self.slots[i]
            if isinstance(var, dtensor.DVariable):  # placed by its layout on the mesh
                lr_v, t_v = tf.cast(lr, var.dtype), tf.cast(t, var.dtype)
                if across_meshes:
                    lr_v, t_v = (mesh_lib.scalar_on(x, mesh_lib.mesh_of(var)) for x in (lr_v, t_v))
                self._guarded(guard, across_meshes, var, tf.convert_to_tensor(grad), slots, lr_v, t_v)
                continue
            with tf.device(var.device):
                grad = tf.convert_to_tensor(grad)
                self._guarded(guard, False, var, grad, slots, tf.cast(lr, var.dtype), tf.cast(t, var.dtype))

    def _guarded(self, guard, across_meshes, var, grad, slots, lr, t) -> None:
        if guard is None:
            self._update(grad, var, slots, lr, t)
            return
        ok = mesh_lib.scalar_on(guard, mesh_lib.mesh_of(var)) if across_meshes else guard

        def update() -> tf.Tensor:
            self._update(grad, var, slots, lr, t)
            return tf.constant(True)

        tf.cond(ok, update, lambda: tf.constant(False))


def _mesh_slot(var: tf.Variable, shape: list[int], name: str) -> tf.Variable:
    """A zero slot of a DVariable: in the variable's layout when shaped like it, else replicated."""
    layout = dtensor.fetch_layout(var)
    if shape != var.shape.as_list():
        layout = dtensor.Layout.replicated(layout.mesh, len(shape))
    return dtensor.DVariable(
        dtensor.call_with_layout(tf.zeros, layout, shape, var.dtype), trainable=False, name=name
    )


class Sgd(Optimizer):
    """``var -= lr * grad``."""

    def __init__(self) -> None:
        super().__init__(name="sgd")

    def _update(self, grad, var, slots, lr, t) -> None:
        var.assign_sub(lr * grad)


class Momentum(Optimizer):
    """Heavy-ball momentum (as tf.compat.v1.train.MomentumOptimizer): ``m = momentum * m + grad;
    var -= lr * m``."""

    def __init__(self, momentum: float) -> None:
        super().__init__(name="momentum")
        self._momentum = momentum

    def _slot_specs(self, var):
        return {"momentum": var.shape}

    def _update(self, grad, var, slots, lr, t) -> None:
        m = slots["momentum"]
        m.assign(self._momentum * m + grad)
        var.assign_sub(lr * m)


class Adam(Optimizer):
    """Adam (Kingma & Ba) with the bias correction folded into the step size:
    ``m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; var -= lr sqrt(1-b2^t)/(1-b1^t) * m/(sqrt(v)+eps)``."""

    def __init__(self, beta1: float, beta2: float, epsilon: float) -> None:
        super().__init__(name="adam")
        self._beta1, self._beta2, self._epsilon = beta1, beta2, epsilon

    def _slot_specs(self, var):
        return {"m": var.shape, "v": var.shape}

    def _update(self, grad, var, slots, lr, t) -> None:
        b1, b2 = self._beta1, self._beta2
        m, v = slots["m"], slots["v"]
        m.assign(b1 * m + (1.0 - b1) * grad)
        v.assign(b2 * v + (1.0 - b2) * tf.square(grad))
        lr_t = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
        var.assign_sub(lr_t * m / (tf.sqrt(v) + self._epsilon))


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern, 2018), Algorithms 4-5 with update clipping and relative step size.

    For a weight of rank >= 2 the second moment of its last two dimensions is factored into a row
    statistic ``vr`` (mean over the last dim) and a column statistic ``vc`` (mean over the one before),
    ``v_hat = vr vc / mean(vr)``; smaller weights keep a full ``v``. With ``t = step + 1``:
    ``beta2_t = 1 - t^-decay_rate``, ``u = g / sqrt(v_hat)``, ``u /= max(1, rms(u) / clipping_threshold)``,
    the step is ``lr * max(epsilon2, rms(var))`` when ``multiply_by_parameter_scale`` (else ``lr``), and
    with ``beta1 > 0`` the update is averaged in a momentum slot (off by default, as in the paper).
    """

    def __init__(
        self,
        decay_rate: float = 0.8,
        beta1: float = 0.0,
        clipping_threshold: float = 1.0,
        multiply_by_parameter_scale: bool = True,
        epsilon1: float = 1e-30,
        epsilon2: float = 1e-3,
    ) -> None:
        super().__init__(name="adafactor")
        self._decay_rate = decay_rate
        self._beta1 = beta1
        self._clipping_threshold = clipping_threshold
        self._multiply_by_parameter_scale = multiply_by_parameter_scale
        self._epsilon1 = epsilon1
        self._epsilon2 = epsilon2

    def _slot_specs(self, var):
        shape = list(var.shape)
        specs = {}
        if len(shape) >= 2:
            specs["vr"] = shape[:-1]
            specs["vc"] = shape[:-2] + shape[-1:]
        else:
            specs["v"] = shape
        if self._beta1 > 0:
            specs["m"] = shape
        return specs

    def _update(self, grad, var, slots, lr, t) -> None:
        beta2_t = 1.0 - tf.pow(t, -self._decay_rate)
        grad_sq = tf.square(grad) + self._epsilon1
        if "vr" in slots:
            vr, vc = slots["vr"], slots["vc"]
            vr.assign(beta2_t * vr + (1.0 - beta2_t) * tf.reduce_mean(grad_sq, axis=-1))
            vc.assign(beta2_t * vc + (1.0 - beta2_t) * tf.reduce_mean(grad_sq, axis=-2))
            row_mean = tf.reduce_mean(vr, axis=-1, keepdims=True)
            v_hat = tf.expand_dims(vr / row_mean, -1) * tf.expand_dims(vc, -2)
        else:
            v = slots["v"]
            v.assign(beta2_t * v + (1.0 - beta2_t) * grad_sq)
            v_hat = v
        update = grad * tf.math.rsqrt(v_hat)
        if self._clipping_threshold > 0:
            update /= tf.maximum(1.0, _rms(update) / self._clipping_threshold)
        step_size = lr
        if self._multiply_by_parameter_scale:
            step_size = lr * tf.maximum(tf.cast(self._epsilon2, var.dtype), _rms(var))
        if "m" in slots:
            m = slots["m"]
            m.assign(self._beta1 * m + (1.0 - self._beta1) * update)
            update = m
        var.assign_sub(step_size * update)


def _rms(x: tf.Tensor) -> tf.Tensor:
    return tf.sqrt(tf.reduce_mean(tf.square(x)))


OPTIMIZERS = ("sgd", "momentum", "adam", "adafactor")


def from_train_params(p: Params) -> Optimizer:
    """The optimizer named by ``task.train.optimizer``, configured from the other ``task.train`` fields."""
    name = p.optimizer
    if name == "sgd":
        return Sgd()
    if name == "momentum":
        return Momentum(p.momentum)
    if name == "adam":
        return Adam(p.beta1, p.beta2, p.epsilon)
    if name == "adafactor":
        return Adafactor(
            decay_rate=p.adafactor_decay_rate,
            beta1=p.adafactor_beta1,
            clipping_threshold=p.adafactor_clipping_threshold,
            multiply_by_parameter_scale=p.adafactor_multiply_by_parameter_scale,
            epsilon1=p.adafactor_epsilon1,
            epsilon2=p.adafactor_epsilon2,
        )
    raise ConfigError(
        f"task.train.optimizer: unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}"
    )
