"""Local parallelism: a sequence of layers cut into K blocks on K devices, each trained by a local loss.

Each block k that has a loss ends in a small auxiliary head (``aux_heads[k]``) and the last block's
output goes to the task's own loss. The loss of block k trains the ``window`` blocks ending at k
(greedy: window 1; overlapping: window 2 and stride 1); the input of that window is the output of
the block before it with the gradient stopped, so no backward message crosses a window's start and
no block ever waits for a later block's backward pass. ``stride`` places a loss every ``stride``
blocks counted back from the last (chunked: window = stride, several blocks trained as one chunk);
fewer, bigger blocks (several layers each, full backprop inside) are the other way to chunk.

Pipelined execution (``pipelined``, the default): in one training step unit 0 takes the new batch
while unit k works on what unit k-1 handed off in the previous step, so the K units of a step are
independent and run side by side on their devices. The hand-off (the input of each unit's window and
the targets that travel with it) lives in non-trainable variables of this layer: they are part of
the checkpoint, so a killed and resumed run continues bit-identically. The first K-1 steps fill the
pipeline: a unit whose slot holds no batch yet has weight 0 (``valid``). Hand-off writes are
recorded as ``ctx`` updates, applied by the step's owner with the batch-norm statistics (a step that
is skipped, for example for a NaN loss, leaves them as they were). The variables are created on
the first training call, when the static shapes are known.

``fprop(ctx, x, targets)`` returns a LocalOutput; ``objective(task_loss, out)`` is the training
objective: the sum of every unit's (valid) loss. Its gradient with respect to block k's weights is
the gradient of the losses whose window holds k, and only of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf
from absl import logging

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, layers_of_type
from layers.core import LayerNorm, SoftmaxLayer
from layers.parallel import device_choice, partition
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

# Hand-off values go through FPropContext updates, which are merged in float32: exact for float32,
# bfloat16 and float16 values and for integers below 2**24 (class ids, token ids, paddings).
_EXACT_DTYPES = (tf.float32, tf.bfloat16, tf.float16, tf.int32, tf.int64, tf.bool)


@dataclasses.dataclass
class LocalOutput:
    """What one ``LocalParallelLayer.fprop`` gives the task.

    ``output``: the last block's output; ``targets``: the targets of the batch it belongs to (in a
    pipelined training step, the batch taken K-1 steps ago); ``aux``: per block, its aux head's
    metrics ``{name: (value, weight)}`` (with a ``loss`` entry) or None for a block without one;
    ``valid``: per block, 1.0 if its unit worked on a real batch this step, else 0.0 (filling).
    """

    output: Any
    targets: Any
    aux: list[dict[str, tuple[tf.Tensor, tf.Tensor]] | None]
    valid: list[tf.Tensor]


class LocalParallelLayer(BaseLayer):
    """K blocks trained by local losses, pipelined across steps: ``fprop(ctx, x, targets)``."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define(
            "layers",
            [],
            "The sequence: layer Params applied in order (each fprop(ctx, x) -> x), cut into blocks by "
            "split_points or num_blocks + partition_method, as GPipeLayer cuts stages.",
        )
        p.define("num_blocks", 0, "K, the number of blocks (0: len(split_points) + 1).")
        p.define(
            "partition_method",
            "uniform",
            "uniform, params, flops or measured (see GPipeLayer; flops and measured need input_shape).",
        )
        p.define("split_points", [], "Explicit cut: index of the first layer of blocks 1..K-1.")
        p.define(
            "input_shape",
            None,
            "Shape of one input batch (flops/measured partitioning, report).",
            value_type=list,
        )
        p.define("input_dtype", "float32", "dtype of the input described by input_shape.")
        p.define(
            "devices",
            [],
            "One device per block. Empty: the GPUs if there are K, else /device:CPU:0..K-1 (split the CPU "
            "with cluster.num_logical_cpu_devices); with one block, the caller's device.",
        )
        p.define(
            "aux_heads",
            [],
            "One head Params per block 0..K-2 (fprop(ctx, block_output, targets) -> metrics with a "
            "'loss' entry); the last block's loss is the task's. Heads of blocks without a loss "
            "(stride > 1) are not built.",
        )
        p.define("window", 1, "Blocks trained by each local loss (1: greedy; 2 with stride 1: overlapping).")
        p.define("stride", 1, "A loss every `stride` blocks, counted back from the last (<= window).")
        p.define(
            "pipelined",
            True,
            "Training: unit k works on the batch unit k-1 handed off in the previous step (hand-off "
            "state checkpointed). False: every unit works on this step's batch, one after the other.",
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        method = checks.one_of(self, "partition_method", partition.METHODS)
        layers = checks.layer_params_list(self, "layers")
        if not layers:
            raise ConfigError(f"{self.path}: params.layers must list at least one layer")
        self._bounds, costs = self._cut(layers, method)
        k = len(self._bounds) - 1
        self._window = checks.positive_int(self, "window")
        self._stride = checks.positive_int(self, "stride")
        if self._stride > self._window:
            raise ConfigError(
                f"{self.path}: stride={self._stride} > window={self._window} leaves blocks without a "
                "loss to train them; use stride <= window"
            )
        self._devices = self._resolve_devices(k)
        block_of = [b for b in range(k) for _ in range(self._bounds[b], self._bounds[b + 1])]
        self._layers = []
        for i, (lp, b) in enumerate(zip(layers, block_of)):
            with device_choice.on(self._devices[b]):
                self._layers.append(self.create_child(lp.name or f"layer_{i}", lp))
        heads = checks.layer_params_list(self, "aux_heads", allow_none=True)
        if len(heads) != k - 1:
            raise ConfigError(
                f"{self.path}: params.aux_heads has {len(heads)} entries for {k} blocks; give one head "
                f"per block but the last ({k - 1})"
            )
        self._has_loss = [(k - 1 - b) % self._stride == 0 for b in range(k)]
        self._heads: list[BaseLayer | None] = []
        for b, hp in enumerate(heads):
            if not self._has_loss[b]:
                self._heads.append(None)
                continue
            if hp is None:
                raise ConfigError(f"{self.path}: params.aux_heads[{b}] is None but block {b} has a loss")
            with device_choice.on(self._devices[b]):
                self._heads.append(self.create_child(f"aux_head_{b}", hp))
        self._heads.append(None)
        self._state: list[list[tf.Variable]] | None = None  # slot k's variables at index k - 1
        self._filled: tf.Variable | None = None
        if "param_bytes" not in costs:
            costs["param_bytes"] = [float(partition.parameter_bytes(x)) for x in self._layers]
        title = (
            f"Local parallelism {self.path}: {len(self._layers)} layers in {k} blocks "
            f"(window={self._window}, stride={self._stride}, "
            f"{'pipelined' if p.pipelined else 'not pipelined'})"
        )
        names = [x.params.name for x in self._layers]
        nums = [x.num_parameters() for x in self._layers]
        self._report = partition.format_report(title, names, self._bounds, self._devices, nums, costs)
        logging.info("%s", self._report)

    # ---------------------------------------------------------------------------------- building
    def _cut(self, layers: list[Params], method: str) -> tuple[list[int], dict[str, list[float]]]:
        n = len(layers)
        split_points = list(self.params.split_points)
        num_blocks = self.params.num_blocks
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ConfigError(f"{self.path}: params.num_blocks must be an int >= 0, got {num_blocks!r}")
        if split_points and num_blocks not in (0, len(split_points) + 1):
            raise ConfigError(
                f"{self.path}: num_blocks={num_blocks} but split_points {split_points} make "
                f"{len(split_points) + 1} blocks"
            )
        k = num_blocks or len(split_points) + 1
        costs: dict[str, list[float]] = {}

        def estimate(method: str) -> list[float]:  # the whole batch's cost per layer
            shape, dtype = self.params.input_shape, self.params.input_dtype
            spec = None if shape is None else lambda _: partition.input_spec(list(shape), dtype)
            return partition.layer_costs(method, partition.probes(self, layers), spec, costs)

        try:
            return partition.cut(n, k, split_points, method, estimate), costs
        except ConfigError as e:
            if str(e).startswith(self.path):
                raise
            raise ConfigError(f"{self.path}: {e}") from None

    def _resolve_devices(self, k: int) -> list[str | None]:
        return device_choice.resolve(self.path, list(self.params.devices), k, "block")

    # --------------------------------------------------------------------------------- inspection
    @property
    def num_blocks(self) -> int:
        return len(self._bounds) - 1

    @property
    def devices(self) -> list[str | None]:
        return list(self._devices)

    @property
    def block_bounds(self) -> list[int]:
        """``[0, b1, ..., n]``: block k runs layers ``bounds[k]:bounds[k+1]``."""
        return list(self._bounds)

    @property
    def has_loss(self) -> list[bool]:
        return list(self._has_loss)

    def block_layers(self, k: int) -> list[BaseLayer]:
        return self._layers[self._bounds[k] : self._bounds[k + 1]]

    def block_variables(self, k: int) -> list[tf.Variable]:
        """The trainable weights of block k's layers (its aux head's are in ``head_variables``)."""
        return [v for layer in self.block_layers(k) for v in layer.trainable_variables]

    def head_variables(self, k: int) -> list[tf.Variable]:
        head = self._heads[k]
        return list(head.trainable_variables) if head is not None else []

    def window_of(self, k: int) -> list[int]:
        """The blocks the loss of block k trains (empty for a block without a loss)."""
        if not self._has_loss[k]:
            return []
        return list(range(max(0, k - self._window + 1), k + 1))

    def partition_report(self) -> str:
        return self._report

    # ------------------------------------------------------------------------------------- fprop
    def _start(self, k: int) -> int:
        """The first block of unit k's window: unit k's input is that block's input."""
        return max(0, k - self._window + 1)

    def _run_block(self, ctx: FPropContext, j: int, x: Any) -> Any:
        with device_choice.on(self._devices[j]), tf.name_scope(f"block_{j}"):
            for layer in self.block_layers(j):
                x = layer(ctx, x)
        return x

    def _run_unit(
        self, ctx: FPropContext, k: int, x: Any, targets: Any, recorded: set[int], heads: bool = True
    ) -> tuple[Any, Any, dict | None]:
        """Unit k on its input ``x`` (the input of block ``_start(k)``): returns the hand-off for
        unit k+1 (its window's input), the last block's output (None unless k is the last unit) and
        the aux metrics of block k (None without a loss)."""
        start, k_last = self._start(k), self.num_blocks - 1
        next_start = self._start(k + 1) if k < k_last else None
        end = k if self._has_loss[k] else (start if next_start != start else start - 1)
        z = tf.nest.map_structure(tf.stop_gradient, x)
        handoff = x if next_start == start else None
        for j in range(start, end + 1):
            block_ctx = ctx.for_micro_batch(k, record_updates=ctx.record_updates and j not in recorded)
            recorded.add(j)
            z = self._run_block(block_ctx, j, z)
            if j == start and handoff is None:
                handoff = tf.nest.map_structure(tf.stop_gradient, z)
        aux = None
        if heads and self._has_loss[k] and k < k_last:
            with device_choice.on(self._devices[k]), tf.name_scope(f"aux_head_{k}"):
                aux = self._heads[k](ctx.for_micro_batch(k), z, targets)
            if not isinstance(aux, dict) or "loss" not in aux:
                raise ConfigError(f"{self.path}: aux_head_{k} must return metrics with a 'loss' entry")
        return handoff, (z if k == k_last else None), aux

    def fprop(self, ctx: FPropContext, x: Any, targets: Any = None) -> LocalOutput:
        """Training: every unit's step (pipelined: on the handed-off batches). Evaluation: the blocks
        in order on ``x``, each aux head on its block's output with ``targets``."""
        targets = {} if targets is None else targets
        k_blocks = self.num_blocks
        one = tf.constant(1.0, tf.float32)
        if not (ctx.training and self.params.pipelined and k_blocks > 1):
            recorded: set[int] = set()
            aux, inp = [], x
            for k in range(k_blocks):
                inp, out, metrics = self._run_unit(ctx, k, inp, targets, recorded)
                aux.append(metrics)
            return LocalOutput(out, targets, aux, [one] * k_blocks)
        self._build_state(x, targets)
        filled = self._filled.read_value()
        slots = [(x, targets)] + [self._read_slot(k) for k in range(1, k_blocks)]
        recorded = set()
        aux, valid, out = [], [], None
        for k in range(k_blocks):
            inp, tgt = slots[k]
            handoff, last, metrics = self._run_unit(ctx, k, inp, tgt, recorded)
            aux.append(metrics)
            valid.append(one if k == 0 else tf.cast(filled >= k, tf.float32))
            if k < k_blocks - 1:
                self._record_slot(ctx, k + 1, handoff, tgt)
            else:
                out, out_targets = last, tgt
        ctx.add_update(self, "filled", tf.minimum(filled + 1, k_blocks - 1), 1.0)
        return LocalOutput(out, out_targets, aux, valid)

    # ------------------------------------------------------------------------------ hand-off state
    def _build_state(self, x: Any, targets: Any) -> None:
        """Creates the hand-off variables on the first pipelined training call (shapes are known
        then): slot k holds unit k's window input and its targets, zeros until filled."""
        if self._state is not None:
            return
        specs = self._slot_specs(x, targets)
        state = {}
        with tf.init_scope():
            for k, (_, flat) in specs.items():
                with device_choice.on(self._devices[self._start(k)]):
                    state[k] = [
                        tf.Variable(
                            tf.zeros(s.shape, s.dtype),
                            trainable=False,
                            name=f"{self.path.replace('/', '.')}.handoff_{k}_{i}",
                        )
                        for i, s in enumerate(flat)
                    ]
            filled = tf.Variable(
                0, dtype=tf.int32, trainable=False, name=f"{self.path.replace('/', '.')}.filled"
            )
        structures = {k: structure for k, (structure, _) in specs.items()}
        target_structure = tf.nest.map_structure(lambda _: 0, targets)
        # Closures, not attributes: a tf.Module would try to track nests of specs.
        self._slot_structure = lambda k: structures[k]
        self._pack_targets = lambda flat: tf.nest.pack_sequence_as(target_structure, flat)
        for k, variables in state.items():
            for i, v in enumerate(variables):
                self.vars[f"handoff_{k}_{i}"] = v
        self.vars["filled"] = filled
        self._filled = filled
        self._state = [state[k] for k in sorted(state)]

    def _slot_specs(self, x: Any, targets: Any) -> dict[int, tuple[Any, list[tf.TensorSpec]]]:
        """The structure and flat TensorSpecs of each slot 1..K-1, from a trace of the units."""
        ctx = FPropContext(training=True, record_updates=False)
        for name, value in (("input", x), ("targets", targets)):
            for t in tf.nest.flatten(value):
                t = tf.convert_to_tensor(t)
                if not t.shape.is_fully_defined():
                    raise ConfigError(
                        f"{self.path}: pipelined training needs static shapes, but an {name} tensor has "
                        f"shape {t.shape}; batch the input with drop_remainder=True"
                    )
                if t.dtype not in _EXACT_DTYPES:
                    raise ConfigError(f"{self.path}: cannot hand off a {t.dtype.name} {name} tensor")

        def spec(v: Any) -> tf.TensorSpec:
            t = tf.convert_to_tensor(v)
            return tf.TensorSpec(t.shape, t.dtype)

        def trace(inp: Any, k: int) -> Any:
            handoff, _, _ = self._run_unit(ctx, k, inp, None, set(range(self.num_blocks)), heads=False)
            return handoff

        specs: dict[int, tuple[Any, list[tf.TensorSpec]]] = {}
        inp_spec = tf.nest.map_structure(spec, x)
        target_flat = [spec(t) for t in tf.nest.flatten(targets)]
        for k in range(self.num_blocks - 1):
            fn = tf.function(lambda inp, k=k: trace(inp, k), autograph=False)
            out = fn.get_concrete_function(inp_spec).structured_outputs
            inp_spec = tf.nest.map_structure(spec, out)
            specs[k + 1] = (inp_spec, tf.nest.flatten(inp_spec) + target_flat)
        return specs

    def _read_slot(self, k: int) -> tuple[Any, Any]:
        structure = self._slot_structure(k)
        n = len(tf.nest.flatten(structure))
        with device_choice.on(self._devices[self._start(k)]), tf.name_scope(f"handoff_{k}"):
            values = [v.read_value() for v in self._state[k - 1]]
        return (
            tf.nest.pack_sequence_as(structure, values[:n]),
            self._pack_targets(values[n:]),
        )

    def _record_slot(self, ctx: FPropContext, k: int, x: Any, targets: Any) -> None:
        flat = tf.nest.flatten(x) + tf.nest.flatten(targets)
        for i, value in enumerate(flat):
            ctx.add_update(self, f"handoff_{k}_{i}", tf.convert_to_tensor(value), 1.0)

    def apply_update(self, name: str, value: tf.Tensor) -> None:
        var = self.vars.get(name)
        if var is None or not (name.startswith("handoff_") or name == "filled"):
            super().apply_update(name, value)
            return
        if var.dtype.is_integer or var.dtype == tf.bool:
            value = tf.round(value)
        var.assign(tf.cast(value, var.dtype))


def objective(task_loss: tf.Tensor, out: LocalOutput) -> tf.Tensor:
    """The training objective: the task's loss (last block) plus every aux loss, each times its
    unit's ``valid``. Because each window starts from a stopped gradient, the gradient of this sum
    with respect to block k's weights is that of the losses whose window holds block k."""
    terms = [out.valid[-1] * tf.cast(task_loss, tf.float32)]
    for metrics, valid in zip(out.aux, out.valid):
        if metrics is not None:
            terms.append(valid * tf.cast(metrics["loss"][0], tf.float32))
    return tf.add_n(terms)


def loss_with_local_gradient(task_loss: tf.Tensor, out: LocalOutput) -> tf.Tensor:
    """The task's loss value, with the gradient of ``objective``: reported losses stay the task's,
    while a trainer that differentiates the loss trains each block on its local loss (a NaN or Inf
    aux loss makes it non-finite too, so a diverging block stops training)."""
    total = objective(task_loss, out)
    value = tf.stop_gradient(tf.cast(task_loss, tf.float32))
    return tf.cast(value + (total - tf.stop_gradient(total)), task_loss.dtype)


def aux_metrics(out: LocalOutput) -> dict[str, tuple[tf.Tensor, tf.Tensor]]:
    """Each aux head's metrics as ``block<k>_aux_<name>`` (weight 0 while the pipeline fills)."""
    metrics = {}
    for k, (head, valid) in enumerate(zip(out.aux, out.valid)):
        for name, (value, weight) in (head or {}).items():
            metrics[f"block{k}_aux_{name}"] = (value, tf.cast(weight, tf.float32) * valid)
    return metrics


# -------------------------------------------------------------------------------------- aux heads
class PooledSoftmaxHead(BaseLayer):
    """Images: mean over the spatial axes of ``[batch, ..., channels]``, then a softmax over classes.

    Metrics ``loss`` (weighted mean cross-entropy) and ``accuracy``, weighted by the example weights
    ``targets[weight_key]`` (ones when absent).
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Channels of the block output.")
        p.define("num_classes", 0, "Number of classes.")
        p.define("label_key", "label", "targets entry with the int class ids [batch].")
        p.define("weight_key", "weight", "targets entry with example weights [batch] (optional).")
        p.define("feature_key", "", "If the block output is a dict: the entry to pool ('' : the output).")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        self.create_child(
            "softmax", SoftmaxLayer.Params().set(input_dim=p.input_dim, num_classes=p.num_classes)
        )

    def fprop(self, ctx: FPropContext, x: Any, targets: dict) -> dict[str, tuple[tf.Tensor, tf.Tensor]]:
        p = self.params
        x = _feature(self, x, p.feature_key)
        if x.shape.rank is not None and x.shape.rank > 2:
            x = tf.reduce_mean(x, axis=list(range(1, x.shape.rank - 1)))
        labels = tf.cast(_target(self, targets, p.label_key), tf.int32)
        weights = targets.get(p.weight_key) if isinstance(targets, dict) else None
        dtype = x.dtype if x.dtype.is_floating else tf.float32  # the model's (float64 too)
        weights = tf.ones(tf.shape(labels), dtype) if weights is None else tf.cast(weights, dtype)
        out = self.softmax.fprop(ctx, x, labels, weights)
        predicted = tf.argmax(out["logits"], axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predicted, labels), dtype)
        total = out["total_weight"]
        accuracy = tf.math.divide_no_nan(tf.reduce_sum(correct * weights), total)
        return {"loss": (out["avg_xent"], total), "accuracy": (accuracy, total)}


class SequenceSoftmaxHead(BaseLayer):
    """Sequences: layer norm then a (small) softmax at every position of ``[batch, time, dim]``.

    Metrics ``loss`` (nats per real token) and ``accuracy``, weighted by the number of real tokens
    (``1 - targets[padding_key]``).
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("input_dim", 0, "Width of the block output.")
        p.define("num_classes", 0, "Vocabulary size.")
        p.define("label_key", "labels", "targets entry with the next-token ids [batch, time].")
        p.define("padding_key", "paddings", "targets entry with the paddings [batch, time] (1 = pad).")
        p.define("feature_key", "x", "If the block output is a dict: the entry to read.")
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        p = self.params
        self.create_child("ln", LayerNorm.Params().set(input_dim=p.input_dim))
        self.create_child(
            "softmax", SoftmaxLayer.Params().set(input_dim=p.input_dim, num_classes=p.num_classes)
        )

    def fprop(self, ctx: FPropContext, x: Any, targets: dict) -> dict[str, tuple[tf.Tensor, tf.Tensor]]:
        p = self.params
        x = self.ln(ctx, _feature(self, x, p.feature_key))
        labels = tf.cast(_target(self, targets, p.label_key), tf.int32)
        weights = 1.0 - tf.cast(_target(self, targets, p.padding_key), tf.float32)
        out = self.softmax.fprop(ctx, x, labels, weights)
        predicted = tf.argmax(out["logits"], axis=-1, output_type=tf.int32)
        correct = tf.cast(tf.equal(predicted, labels), tf.float32)
        total = out["total_weight"]
        accuracy = tf.math.divide_no_nan(tf.reduce_sum(correct * weights), total)
        return {"loss": (out["avg_xent"], total), "accuracy": (accuracy, total)}


# ----------------------------------------------------------------------------------------- helpers
def _feature(layer: BaseLayer, x: Any, key: str) -> tf.Tensor:
    if isinstance(x, dict):
        if not key or key not in x:
            raise ConfigError(f"{layer.path}: block output is a dict ({sorted(x)}); set feature_key")
        x = x[key]
    return checks.float_input(layer, x)


def _target(layer: BaseLayer, targets: Any, key: str) -> tf.Tensor:
    if not isinstance(targets, dict) or key not in targets:
        got = sorted(targets) if isinstance(targets, dict) else type(targets).__name__
        raise ConfigError(f"{layer.path}: targets need entry {key!r}, got {got}")
    return targets[key]


def local_reports(root: BaseLayer) -> str:
    """The block reports of every LocalParallelLayer under ``root``."""
    return "\n\n".join(layer.partition_report() for layer in layers_of_type(root, LocalParallelLayer))
