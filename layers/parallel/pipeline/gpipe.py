"""GPipe: a sequence of layers cut into K stages on K devices, fed M micro-batches as a pipeline.

Schedule. ``fprop`` splits the mini-batch into M micro-batches (``microbatch``) and emits the stages'
work inside the caller's ``tf.function``, unrolled, stage s's ops placed on its device, so TensorFlow's
executor overlaps the devices. ``params.schedule`` names a ``schedule.Schedule`` (docs/parallelism/
schedules.md) and ``executor.PipelineExecutor`` builds its units in that order: this layer keeps no
order of its own. Every schedule gives the same gradients; all but fill_drain need the loss computed
per micro-batch in the last stage (a ``head``) and summed times one constant, as the tasks do.

A ``head`` (``fprop(ctx, x, head=...)``) runs in the last stage on each micro-batch's output with its
share of ``head_inputs``: the tasks compute their per-example loss there. The micro-batch split's
gradient runs on the first stage's device and the join's on the last.

Re-materialization. With remat a (stage, micro-batch) keeps only its input: the schedule's recompute
unit runs the stage's forward again (with ``record_updates=False`` and the same randomness keys, so
it equals the first forward), starting only when the output gradient arrives. The per-micro-batch
weight gradients are summed as they come (one running sum per weight rather than M gradients alive
at once): the update equals the unpipelined one for any K and M.

Deferred batch norm. Layers see ``ctx.for_micro_batch(m)``: batch norm normalizes each micro-batch by
its own statistics and records them (weighted by element count) in the first forward only; the step
owner merges them once per step with ``ctx.apply_updates()``. For the first batch-norm layer (whose
input does not depend on an earlier normalization) the merged statistics are the full batch's; a later
one sees inputs normalized per micro-batch, so its statistics are those of the micro-batched model,
which is also what the pipeline trains (equal to the unpipelined model at M=1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, layers_of_type
from layers.parallel import device_choice, partition
from layers.parallel import mesh as mesh_lib
from layers.parallel.pipeline import knobs, microbatch, schedule_file, segment, stage_mesh
from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline.executor import PipelineExecutor, run_in_order
from layers.parallel.pipeline.segment import HeadFn
from layers.parallel.pipeline.step import SplitBackwardOps
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

REMAT_POLICIES = schedules.REMAT_POLICIES
SCHEDULES = schedules.SCHEDULES


class GPipeLayer(BaseLayer):
    """Runs ``layers`` (or ``stages``) as a K-stage, M-micro-batch pipeline: ``fprop(ctx, x) -> y``."""

    # Lingvo's names (gpipe.PipeliningLayer, layers_with_gpipe.GPipeTransformerStack) -> the equivalent
    # here: setting one is an unknown param whose error names it (docs/lingvo.md#gpipe).
    LINGVO_PARAMS = {
        "cell_tpl": "'stages' takes one layer Params per stage (or 'layers' cut into num_stages)",
        "splits": "'split_points' (the first layer of stages 1..K-1: splits=[2, 4] is split_points=[2]), "
        "or 'num_stages' for splits=K",
        "before_tpl": "layers before the pipeline are the task's own, outside this layer (or put them in "
        "the first stage's layers)",
        "state_dtype": "none is needed: the hand-offs between stages keep each stage's output dtype",
    }

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        knobs.define(p)
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._remat = checks.one_of(self, "remat", REMAT_POLICIES)
        self._schedule = checks.one_of(self, "schedule", schedules.SCHEDULES + schedules.V_SCHEDULES)
        self._virtual = checks.positive_int(self, "virtual_stages")
        method = checks.one_of(self, "partition_method", partition.METHODS)
        self._batch_dim = knobs.non_negative_int(self, "batch_dim")
        # Set by --mode=profile_pipeline while it traces a step: where the I and W units' ops go.
        self.split_backward_ops: SplitBackwardOps | None = None
        self._num_micro_batches = checks.positive_int(self, "num_micro_batches")
        self._micro_batch_size = knobs.non_negative_int(self, "micro_batch_size")
        if self._micro_batch_size and self._num_micro_batches != 1:
            raise ConfigError(
                f"{self.path}: set num_micro_batches ({self._num_micro_batches}) or micro_batch_size "
                f"({self._micro_batch_size}), not both"
            )
        layers, stages = checks.layer_params_list(self, "layers"), checks.layer_params_list(self, "stages")
        if bool(layers) == bool(stages):
            raise ConfigError(f"{self.path}: set exactly one of params.layers and params.stages")
        num_stages = knobs.non_negative_int(self, "num_stages")
        self._batcher = microbatch.MicroBatcher(
            self.path, self._batch_dim, self._num_micro_batches, self._micro_batch_size
        )
        if not self.params.schedule_file:  # a file's schedule says how many stages a device runs
            try:
                schedules.check_virtual_stages(self._schedule, self._virtual)
            except schedules.ScheduleError as e:
                raise ConfigError(f"{self.path}: {e}") from None
        if stages:
            self._init_stages(stages, num_stages)
        else:
            self._init_layers(layers, num_stages, method)
        self._report = _partition_report(self, method, self._costs)
        logging.info("%s", self._report)

    # ---------------------------------------------------------------------------------- building
    def _init_stages(self, stages: list[Params], num_stages: int) -> None:
        v = self._virtual
        knobs.check_stages(self.path, len(stages), num_stages, v, bool(self.params.split_points))
        self._costs: dict[str, list[float]] = {}
        self._bounds = list(range(len(stages) + 1))
        self._devices = self._resolve_devices(len(stages) // v)
        self._placement = self._stage_placement(len(stages), len(self._devices))
        self._layers = self._build(stages, self._placement, "stage")
        _add_report_costs(
            self._costs, self._layers, self._spec if self.params.input_shape is not None else None
        )

    def _init_layers(self, layers: list[Params], num_stages: int, method: str) -> None:
        n, v = len(layers), self._virtual
        split_points = list(self.params.split_points)
        devices = knobs.layer_devices(self.path, n, num_stages, v, split_points)
        k = devices * v
        self._costs = {}

        def costs(method: str) -> list[float]:  # a micro-batch's cost per layer
            spec = self._spec if self.params.input_shape is not None else None
            return partition.layer_costs(method, partition.probes(self, layers), spec, self._costs)

        self._bounds = _prefixed(self.path, partition.cut, n, k, split_points, method, costs)
        self._devices = self._resolve_devices(devices)
        stage_of = [s for s in range(k) for _ in range(self._bounds[s], self._bounds[s + 1])]
        self._placement = self._stage_placement(k, devices)
        self._layers = self._build(layers, [self._placement[s] for s in stage_of], "layer")
        _add_report_costs(
            self._costs, self._layers, self._spec if self.params.input_shape is not None else None
        )

    def _stage_placement(self, num_stages: int, num_devices: int) -> list[int]:
        """The schedule device of each stage: a V for ``zbv``, else where ``schedule_file`` puts it."""
        if not self.params.schedule_file and self._schedule in schedules.V_SCHEDULES:
            return list(schedules.v_placement(num_devices))
        return schedule_file.placement(self.params.schedule_file, num_stages, num_devices)

    def _build(self, params_list: list[Params], where: list[int], prefix: str) -> list[BaseLayer]:
        """Each layer on its schedule device ``where[i]``: that device, or that stage mesh's scope."""
        built = []
        for i, (params, d) in enumerate(zip(params_list, where)):
            mesh = self._stage_meshes.of(d)
            scope = mesh_lib.mesh_scope(mesh) if mesh is not None else device_choice.on(self._devices[d])
            with scope:
                built.append(self.create_child(params.name or f"{prefix}_{i}", params))
        return built

    def _spec(self, need_micro_batch: bool = False) -> tf.TensorSpec:
        """The input of one micro-batch (``_micro_batch_spec``)."""
        return _micro_batch_spec(self.path, self.params, self._batcher, need_micro_batch)

    def _resolve_devices(self, k: int) -> list[str | None]:
        self._stage_meshes = stage_mesh.build(self.path, self.params, k, self.mesh)
        self._batcher = dataclasses.replace(self._batcher, replicas=self._stage_meshes.replicas)
        if self._stage_meshes.meshes:
            return [None] * k
        return device_choice.resolve(self.path, list(self.params.devices), k, "stage")

    # (micro-batches, bytes of one micro-batch's pipeline input) of the last training trace
    micro_batch_input_bytes: tuple[int, int] | None = None

    @property
    def stage_meshes(self) -> list[mesh_lib.DeviceMesh]:
        """Each schedule device's mesh (empty without stage_mesh_shape)."""
        return list(self._stage_meshes.meshes)

    @property
    def stage_replicas(self) -> int:
        """The replicas a stage mesh's data axis splits each micro-batch over (1: none)."""
        return self._stage_meshes.replicas

    @property
    def input_mesh(self) -> mesh_lib.DeviceMesh | None:
        """Where fprop's inputs must be: the first stage's mesh (None: no stage meshes)."""
        return self._stage_meshes.of(0)

    @property
    def output_mesh(self) -> mesh_lib.DeviceMesh | None:
        """Where fprop's outputs (and the head's inputs) are: the last stage's mesh."""
        return self._stage_meshes.of(self.num_stages - 1)

    def to_output_mesh(self, x: Any) -> Any:
        """A nest of tensors on the input mesh (a batch's labels, paddings) -> the same values on the
        output mesh, for the head and the metrics (no gradient: for inputs, not activations). Without
        stage meshes, ``x`` as it is."""
        return self._stage_meshes.copy(x, 0, self.num_stages - 1)

    # --------------------------------------------------------------------------------- inspection
    @property
    def num_stages(self) -> int:
        return len(self._bounds) - 1

    @property
    def devices(self) -> list[str | None]:
        """The device of each schedule device (None: the caller's device); one per stage unless
        virtual_stages > 1."""
        return list(self._devices)

    @property
    def num_devices(self) -> int:
        return len(self._devices)

    @property
    def stage_devices(self) -> list[str | None]:
        """The device of each stage: ``devices[s % num_devices]``, or, for ``zbv`` or a
        ``schedule_file`` that says so, a V (stages d and 2K - 1 - d on device d)."""
        return [self._devices[d] for d in self._placement]

    def schedule_for(self, num_micro_batches: int) -> schedules.Schedule:
        """The schedule a training step with M micro-batches runs (ConfigError if it cannot)."""
        try:
            if self.params.schedule_file:
                want = (self.num_devices, self.num_stages, num_micro_batches)
                sched = schedule_file.load(self.path, self.params.schedule_file, want, self._remat)
            else:
                sched = schedules.build(
                    self._schedule, self.num_devices, num_micro_batches, self._remat, self._virtual
                )
        except schedules.ScheduleError as e:
            raise ConfigError(f"{self.path}: {e}") from None
        if sched.placement and self._stage_meshes.meshes:
            raise ConfigError(
                f"{self.path}: schedule {sched.name!r} places stages other than s % K (a V), which "
                "stage meshes do not support; use one device per schedule rank"
            )
        return sched

    @property
    def stage_bounds(self) -> list[int]:
        """``[0, b1, ..., n]``: stage k runs layers ``bounds[k]:bounds[k+1]``."""
        return list(self._bounds)

    @property
    def sequence(self) -> list[BaseLayer]:
        """Every built layer in order (with params.stages: one layer per stage)."""
        return list(self._layers)

    def stage_layers(self, k: int) -> list[BaseLayer]:
        return self._layers[self._bounds[k] : self._bounds[k + 1]]

    def partition_report(self) -> str:
        """The cut as text: each stage's device, layers, parameters and estimated cost."""
        return self._report

    # ------------------------------------------------------------------------------------- fprop
    def fprop(self, ctx: FPropContext, x: Any, head: HeadFn | None = None, head_inputs: Any = None) -> Any:
        """Runs the pipeline on the mini-batch ``x`` (a tensor or a nest of them, split along
        batch_dim); returns the micro-batch outputs concatenated along batch_dim.

        ``head(ctx, y, head_inputs_m)``, when given, runs in the last stage on each micro-batch's
        output ``y``, with that micro-batch's part of ``head_inputs`` (a nest of batch-major tensors,
        e.g. targets and weights, split like ``x`` on the last stage's device); its per-example
        results are what is concatenated. A task computes its loss there, so the full batch's logits
        and their gradient never exist at once. The head may use other layers' weights (a softmax,
        a tied embedding): their gradients are summed over micro-batches like the stage's own.
        """
        flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(x)]
        if not flat:
            raise ConfigError(f"{self.path}: fprop needs at least one input tensor")
        head_inputs = {} if head_inputs is None else head_inputs
        head_flat = [tf.convert_to_tensor(t) for t in tf.nest.flatten(head_inputs)]
        self._batcher.check_inputs(flat, head_flat, head is not None, ctx.training)
        if not ctx.training and self.num_stages == 1:
            if head is None:
                return segment.chain(self.stage_layers(0))(ctx, x)
            return segment.chain(segment.stage_segments(self.stage_layers(0), head))(ctx, (x, head_inputs))
        with device_choice.on(self._devices[0]), tf.name_scope("split_micro_batches"):
            micro = self._batcher.split(flat, ctx.training, device=self._devices[0])
        if ctx.training:  # what a stage keeps per micro-batch for its backward (static shapes)
            self.micro_batch_input_bytes = (len(micro), microbatch.static_bytes(micro[0]))
        head_micro: list[list[tf.Tensor]] = [[] for _ in micro]
        if head_flat:
            with device_choice.on(self._devices[self._placement[-1]]), tf.name_scope("split_head_inputs"):
                head_micro = self._batcher.split(
                    head_flat, ctx.training, len(micro), self._devices[self._placement[-1]]
                )
        outputs, structure = self._run_schedule(ctx, micro, x, head, head_micro, head_inputs)
        with device_choice.on(self._devices[self._placement[-1]]), tf.name_scope("join_micro_batches"):
            return tf.nest.pack_sequence_as(
                structure, self._batcher.join(outputs, self._devices[self._placement[-1]])
            )

    def _run_schedule(
        self,
        ctx: FPropContext,
        micro: list[list[tf.Tensor]],
        structure: Any,
        head: HeadFn | None = None,
        head_micro: list[list[tf.Tensor]] | None = None,
        head_structure: Any = None,
    ) -> tuple:
        """Training: the schedule's units, built by ``executor.PipelineExecutor``. Inference (or
        one stage and one micro-batch without remat): the stages in order, no custom gradient."""
        k_stages, m_count = self.num_stages, len(micro)
        head_micro = head_micro or [[] for _ in range(m_count)]
        remat = schedules.remat_micro_batches(self._remat, m_count)
        stages = [
            segment.stage_segments(self.stage_layers(k), head if k == k_stages - 1 else None)
            for k in range(k_stages)
        ]
        if ctx.training and (k_stages > 1 or m_count > 1 or any(remat)):
            executor = PipelineExecutor(
                self.path,
                self.schedule_for(m_count),
                stages,
                self._devices,
                remat,
                ctx,
                head is not None,
                self._stage_meshes,
                self._batch_dim,
                self.split_backward_ops,
                self.cast_reads,
            )
            return executor(micro, structure, head_micro, head_structure)
        where = (self.stage_devices, self._stage_meshes, self._batch_dim)
        heads = (head_micro, head_structure) if head is not None else None
        return run_in_order(stages, where, ctx, (micro, structure), heads)


# ----------------------------------------------------------------------------------------- helpers
def _micro_batch_spec(
    path: str, params: Params, batcher: microbatch.MicroBatcher, need_micro_batch: bool
) -> tf.TensorSpec:
    """The input of one micro-batch: input_shape with its batch dimension set to the micro-batch
    size (micro_batch_size, or the given batch over num_micro_batches). Unknown, it is 1, which
    only FLOP counts may use (they scale with the batch); measured times may not."""
    shape = list(params.input_shape)
    bd = batcher.batch_dim
    if bd >= len(shape):
        raise ConfigError(f"{path}: input_shape {shape} has no batch_dim={bd}")
    micro = batcher.rows_of(shape[bd])
    if micro is None and need_micro_batch:
        raise ConfigError(
            f"{path}: partition_method='measured' times each layer at the micro-batch size, "
            f"but input_shape {shape} leaves the batch dimension unknown; give the batch size in "
            "input_shape or set micro_batch_size"
        )
    shape[bd] = micro
    return _prefixed(path, partition.input_spec, shape, params.input_dtype)


def _prefixed(path: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, its ConfigError prefixed with the layer's ``path``."""
    try:
        return fn(*args)
    except ConfigError as e:
        if str(e).startswith(f"{path}: "):
            raise
        raise ConfigError(f"{path}: {e}") from None


def _add_report_costs(
    costs: dict[str, list[float]], layers: list[BaseLayer], spec: Callable[[], tf.TensorSpec] | None
) -> None:
    """The partition report's columns the cut did not compute: parameter bytes, and FLOPs where the
    input is known (``spec``)."""
    if "param_bytes" not in costs:
        costs["param_bytes"] = [float(partition.parameter_bytes(x)) for x in layers]
    if "flops" not in costs and spec is not None:
        costs["flops"] = [float(f) for f in partition.traced_flops(layers, spec())]


def _partition_report(layer: GPipeLayer, method: str, costs: dict[str, list[float]]) -> str:
    """The cut as text: a title with the knobs, then each stage's device, layers and costs."""
    p = layer.params
    how = "stages given" if p.stages else ("split_points" if p.split_points else f"partition_method={method}")
    micro = (
        f"micro_batch_size={p.micro_batch_size}"
        if p.micro_batch_size
        else f"{p.num_micro_batches} micro-batches"
    )
    virtual = (
        f", virtual_stages={p.virtual_stages} on {layer.num_devices} devices" if p.virtual_stages > 1 else ""
    )
    title = (
        f"GPipe {layer.path}: {len(layer.sequence)} layers in {layer.num_stages} stages ({how}), {micro}, "
        f"remat={p.remat}, schedule={f'file:{p.schedule_file}' if p.schedule_file else p.schedule}{virtual}"
    )
    num_params = [x.num_parameters() for x in layer.sequence]
    names = [x.params.name for x in layer.sequence]
    devices: list[Any] = layer.stage_devices
    meshes = layer.stage_meshes
    if meshes:  # a stage's device is its mesh's
        devices = [_mesh_text(meshes[s % len(meshes)]) for s in range(layer.num_stages)]
    return partition.format_report(title, names, layer.stage_bounds, devices, num_params, costs)


def _mesh_text(mesh: mesh_lib.DeviceMesh) -> str:
    """``CPU:2,CPU:3 (model=2)``: a stage mesh's devices and axes, for the partition table."""
    devices = [str(d).rsplit("/device:", 1)[-1] for d in mesh.mesh.local_devices()]
    return f"{','.join(devices)} ({mesh.describe()})"


def partition_reports(root: BaseLayer) -> str:
    """The partition reports of every GPipeLayer under ``root`` (for a task's model analysis)."""
    return "\n\n".join(layer.partition_report() for layer in layers_of_type(root, GPipeLayer))


def gpipe_params_in(p: Params) -> list[InstantiableParams]:
    """The Params of every GPipeLayer in the tree ``p`` (nested Params and lists of them), outermost
    first: what the trainer and ``tools.export`` rewrite to place a model's pipelines."""
    found: list[InstantiableParams] = []

    def visit(node: Params) -> None:
        if (
            isinstance(node, InstantiableParams)
            and isinstance(node.cls, type)
            and issubclass(node.cls, GPipeLayer)
        ):
            found.append(node)
        for name in node.names():
            value = node.get(name)
            for child in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(child, Params):
                    visit(child)

    visit(p)
    return found


def clear_stage_meshes(node: Params) -> None:
    """A GPipeLayer's Params set to put its stages on plain devices (the same variables)."""
    node.set(stage_mesh_shape=[], stage_mesh_axis_names=[], stage_layout_rules="")
