"""GPipe: a sequence of layers cut into K stages on K devices, fed M micro-batches as a pipeline.

Schedule. ``fprop`` splits the mini-batch into M micro-batches and emits the stages' work inside the
caller's ``tf.function``, unrolled (a ``tf.while_loop`` pipeline ran plain Eigen kernels instead of
oneDNN ones, 4x slower), with stage s's ops placed on its device, so TensorFlow's executor overlaps
the devices (tests/layers/parallel/pipeline/test_gpipe_proofs.py checks the placement of every stage
op and the overlap in a profiled step). ``params.schedule`` names a ``schedule.Schedule``
(fill_drain, one_f_one_b, one_f_one_b_split, interleaved_1f1b with ``virtual_stages``, zb_h1, zb_h2;
docs/parallelism/schedules.md), and ``executor.PipelineExecutor`` builds its units in the schedule's
order: this layer keeps no order of its own. Every schedule gives the same gradients. All but
fill_drain run a device's forwards after its backwards, which needs each micro-batch's output
gradient when its backward is built: the loss is computed per micro-batch in the last stage (a
``head``) and summed (times one constant) by the caller, as the tasks do; anything else is refused
with a ConfigError (no head) or fails the step with one clear error (a loss that is not a constant
times the sum).

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

import os
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import logging

from layers import checks
from layers.base_layer import BaseLayer, FPropContext, layers_of_type
from layers.parallel import device_choice, partition
from layers.parallel import mesh as mesh_lib
from layers.parallel.pipeline import executor as stage_ops
from layers.parallel.pipeline import schedule as schedules
from layers.parallel.pipeline import torch_format
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

REMAT_POLICIES = schedules.REMAT_POLICIES
SCHEDULES = schedules.SCHEDULES

HeadFn = Callable[[FPropContext, Any, Any], Any]


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
        p.define(
            "layers",
            [],
            "The sequence: layer Params applied in order (each fprop(ctx, x) -> x), cut into stages by "
            "split_points or num_stages + partition_method. Children are named by their name or layer_<i>.",
        )
        p.define(
            "stages",
            [],
            "Instead of layers: one layer Params per stage (e.g. a SequentialLayer); no partitioning.",
        )
        p.define("num_stages", 0, "K, the number of stages (0: len(split_points) + 1, or len(stages)).")
        p.define(
            "partition_method",
            "uniform",
            "How layers are cut: uniform (equal layer counts), params (balanced parameter bytes), "
            "flops (balanced FLOPs, traced on input_shape), measured (balanced forward+backward time "
            "of each layer at the micro-batch size). The cut minimizes the most expensive stage.",
        )
        p.define(
            "split_points",
            [],
            "Explicit cut: index of the first layer of stages 1..K-1 (replaces partition_method).",
        )
        p.define(
            "input_shape",
            None,
            "Shape of one input batch, e.g. [32, 784]: needed by partition_method flops and measured, "
            "which trace each layer on one micro-batch of it (measured needs the batch size here or "
            "micro_batch_size; flops allows None); when set the partition report shows FLOPs.",
            value_type=list,
        )
        p.define("input_dtype", "float32", "dtype of the input described by input_shape.")
        p.define("num_micro_batches", 1, "M: each mini-batch is split into M micro-batches.")
        p.define("micro_batch_size", 0, "Instead of num_micro_batches: examples per micro-batch (0: unused).")
        p.define("batch_dim", 0, "The batch dimension of every input and output tensor.")
        p.define(
            "devices",
            [],
            "One device per stage. Empty: the GPUs if there are K, else /device:CPU:0..K-1 (split the CPU "
            "with cluster.num_logical_cpu_devices); with one stage, the caller's device.",
        )
        p.define(
            "stage_mesh_shape",
            [],
            "A mesh of each stage's own (pipeline x mesh): e.g. [2] puts stage k on logical devices "
            "2k, 2k+1 as a 2-device DTensor mesh, its layers' weights sharded there by "
            "stage_layout_rules; activations cross to the next stage's mesh replicated. Empty: one "
            "device per stage. Inputs must be on the first stage's mesh (input_mesh), head inputs on "
            "the last's (output_mesh).",
            value_type=list,
        )
        p.define("stage_mesh_axis_names", [], "One distinct name per stage_mesh_shape entry, e.g. ['model'].")
        p.define(
            "stage_layout_rules",
            "",
            "Mesh-TF's layout rules on each stage's mesh, e.g. 'hidden:model;heads:model' "
            "(layers.parallel.mesh).",
        )
        p.define(
            "remat",
            "except_last",
            "Re-materialization: always (keep only stage inputs; recompute each stage in the backward "
            "pass), except_last (all micro-batches but the last, whose backward follows its forward at "
            "once), never (keep every activation; fastest, most memory).",
        )
        p.define(
            "schedule",
            "fill_drain",
            "The order of each device's forwards and backwards in a training step "
            "(docs/parallelism/schedules.md): fill_drain (GPipe: every forward, then every backward; a "
            "stage holds all M micro-batches), "
            "one_f_one_b (1F1B: after K - k forwards stage k alternates one backward and one forward, "
            "holding at most K - k), one_f_one_b_split (1F1B with each backward split into input and "
            "weight gradients, run at once: the gradient leaves after the input half; 1F1B's memory, "
            "(K - 1) T_W less idle), interleaved_1f1b (1F1B over virtual_stages chunks per device; "
            "bubble / v; M a multiple of K), zb_h1 or zb_h2 (zero bubble: the backward split into input "
            "and weight gradients, the weight halves filling the bubble; H1 at 1F1B's peak memory, H2 "
            "up to 2K - 1 micro-batches). All but fill_drain need the loss computed per micro-batch in "
            "the last stage, fprop(..., head=...), as the tasks do. Same gradients for every schedule.",
        )
        p.define(
            "schedule_file",
            "",
            "A schedule of your own instead of params.schedule: a CSV in torch.distributed.pipelining's "
            "format (one row per device, actions like 0F1, 1I0, 1W0, 0B2, SEND_F/RECV_F/SEND_B/RECV_B; "
            "docs/parallelism/schedules.md), validated when the step is traced; its K and M must match "
            "the layer's.",
        )
        p.define(
            "virtual_stages",
            1,
            "v, stages per device for schedule=interleaved_1f1b: the layers are cut into K * v stages "
            "and device d runs stages d, d + K, ...",
        )
        return p

    def __init__(self, params: InstantiableParams, parent: BaseLayer | None = None) -> None:
        super().__init__(params, parent)
        self._remat = checks.one_of(self, "remat", REMAT_POLICIES)
        self._schedule = checks.one_of(self, "schedule", schedules.SCHEDULES)
        self._virtual = checks.positive_int(self, "virtual_stages")
        method = checks.one_of(self, "partition_method", partition.METHODS)
        self._batch_dim = _non_negative_int(self, "batch_dim")
        self._num_micro_batches = checks.positive_int(self, "num_micro_batches")
        self._micro_batch_size = _non_negative_int(self, "micro_batch_size")
        if self._micro_batch_size and self._num_micro_batches != 1:
            raise ConfigError(
                f"{self.path}: set num_micro_batches ({self._num_micro_batches}) or micro_batch_size "
                f"({self._micro_batch_size}), not both"
            )
        layers, stages = checks.layer_params_list(self, "layers"), checks.layer_params_list(self, "stages")
        if bool(layers) == bool(stages):
            raise ConfigError(f"{self.path}: set exactly one of params.layers and params.stages")
        num_stages = _non_negative_int(self, "num_stages")
        if self._virtual > 1 and self._schedule != "interleaved_1f1b" and not self.params.schedule_file:
            raise ConfigError(
                f"{self.path}: virtual_stages={self._virtual} needs schedule='interleaved_1f1b' (got "
                f"{self._schedule!r}); set virtual_stages=1 or schedule='interleaved_1f1b'"
            )
        if stages:
            self._init_stages(stages, num_stages)
        else:
            self._init_layers(layers, num_stages, method)
        self._report = self._make_report(method)
        logging.info("%s", self._report)

    # ---------------------------------------------------------------------------------- building
    def _init_stages(self, stages: list[Params], num_stages: int) -> None:
        v = self._virtual
        if len(stages) % v:
            raise ConfigError(
                f"{self.path}: params.stages has {len(stages)} stages, not a multiple of virtual_stages={v}; "
                f"give {v} stages per device"
            )
        if num_stages not in (0, len(stages) // v):
            raise ConfigError(
                f"{self.path}: num_stages={num_stages} but params.stages has {len(stages)} "
                f"(virtual_stages={v}: {len(stages) // v} devices)"
            )
        if self.params.split_points:
            raise ConfigError(
                f"{self.path}: split_points cut params.layers; leave it empty with params.stages"
            )
        self._costs: dict[str, list[float]] = {}
        self._bounds = list(range(len(stages) + 1))
        self._devices = self._resolve_devices(len(stages) // v)
        self._layers = self._build(stages, [s % len(self._devices) for s in range(len(stages))], "stage")
        self._add_report_costs()

    def _init_layers(self, layers: list[Params], num_stages: int, method: str) -> None:
        n = len(layers)
        split_points = list(self.params.split_points)
        if split_points and num_stages not in (0, (len(split_points) + 1) // self._virtual):
            raise ConfigError(
                f"{self.path}: num_stages={num_stages} but split_points {split_points} make "
                f"{len(split_points) + 1} stages"
            )
        v = self._virtual
        if split_points and (len(split_points) + 1) % v:
            raise ConfigError(
                f"{self.path}: split_points make {len(split_points) + 1} stages, not a multiple of "
                f"virtual_stages={v}; give {v} stages per device"
            )
        devices = num_stages or (len(split_points) + 1) // v
        k = devices * v
        if k > n:
            need = (
                f"num_stages={devices}"
                if v == 1
                else f"num_stages={devices} x virtual_stages={v} needs {k} stages"
            )
            raise ConfigError(
                f"{self.path}: {need} but there are only {n} layers; each stage needs at least one layer, "
                f"so use num_stages <= {n // v}"
            )
        self._costs = {}

        def costs(method: str) -> list[float]:  # a micro-batch's cost per layer
            spec = self._spec if self.params.input_shape is not None else None
            return partition.layer_costs(method, partition.probes(self, layers), spec, self._costs)

        self._bounds = self._checked(partition.cut, n, k, split_points, method, costs)
        self._devices = self._resolve_devices(devices)
        stage_of = [s for s in range(k) for _ in range(self._bounds[s], self._bounds[s + 1])]
        self._layers = self._build(layers, [s % devices for s in stage_of], "layer")
        self._add_report_costs()

    def _checked(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as e:
            if str(e).startswith(f"{self.path}: "):
                raise
            raise ConfigError(f"{self.path}: {e}") from None

    def _add_report_costs(self) -> None:
        if "param_bytes" not in self._costs:
            self._costs["param_bytes"] = [float(partition.parameter_bytes(x)) for x in self._layers]
        if "flops" not in self._costs and self.params.input_shape is not None:
            self._costs["flops"] = [float(f) for f in partition.traced_flops(self._layers, self._spec())]

    def _build(self, params_list: list[Params], where: list[int], prefix: str) -> list[BaseLayer]:
        """Each layer on its schedule device ``where[i]``: that device, or that stage mesh's scope."""
        built = []
        for i, (params, d) in enumerate(zip(params_list, where)):
            mesh = self._meshes[d] if self._meshes else None
            scope = mesh_lib.mesh_scope(mesh) if mesh is not None else device_choice.on(self._devices[d])
            with scope:
                built.append(self.create_child(params.name or f"{prefix}_{i}", params))
        return built

    def _spec(self, need_micro_batch: bool = False) -> tf.TensorSpec:
        """The input of one micro-batch: input_shape with its batch dimension set to the micro-batch
        size (micro_batch_size, or the given batch over num_micro_batches). Unknown, it is 1, which
        only FLOP counts may use (they scale with the batch); measured times may not."""
        shape = list(self.params.input_shape)
        bd = self._batch_dim
        if bd >= len(shape):
            raise ConfigError(f"{self.path}: input_shape {shape} has no batch_dim={bd}")
        batch = shape[bd]
        if self._micro_batch_size:
            micro = self._micro_batch_size
        elif batch is None:
            micro = None
        elif isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
            micro = batch // self.num_micro_batches_for(batch)
        else:
            micro = batch  # input_spec says what is wrong with it
        if micro is None and need_micro_batch:
            raise ConfigError(
                f"{self.path}: partition_method='measured' times each layer at the micro-batch size, "
                f"but input_shape {shape} leaves the batch dimension unknown; give the batch size in "
                "input_shape or set micro_batch_size"
            )
        shape[bd] = micro
        return self._checked(partition.input_spec, shape, self.params.input_dtype)

    def _resolve_devices(self, k: int) -> list[str | None]:
        self._replicas = 1  # a stage mesh's data axis: the replicas each micro-batch is split over
        self._meshes = self._stage_meshes(k)
        if self._meshes:
            return [None] * k
        return device_choice.resolve(self.path, list(self.params.devices), k, "stage")

    def _stage_meshes(self, k: int) -> list[mesh_lib.DeviceMesh]:
        """The meshes of the k schedule devices (none without stage_mesh_shape); an impossible
        combination is one ConfigError naming the knobs."""
        shape, names = list(self.params.stage_mesh_shape), list(self.params.stage_mesh_axis_names)
        if not shape:
            if names or self.params.stage_layout_rules:
                raise ConfigError(
                    f"{self.path}: stage_mesh_axis_names / stage_layout_rules are set but "
                    "stage_mesh_shape is empty; set stage_mesh_shape too"
                )
            return []
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
            raise ConfigError(f"{self.path}: stage_mesh_shape must list ints >= 1, got {shape}")
        if len(names) != len(shape) or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(
                f"{self.path}: stage_mesh_axis_names {names} must name each of the {len(shape)} "
                f"stage_mesh_shape {shape} axes"
            )
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"{self.path}: stage_mesh_axis_names {names} names mesh axis {twice[0]!r} twice; give "
                "each axis its own name"
            )
        if self.params.devices:
            raise ConfigError(
                f"{self.path}: params.devices and stage_mesh_shape both place the stages; set one"
            )
        size = 1
        for n in shape:
            size *= n
        device_type = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
        found = len(tf.config.list_logical_devices(device_type))
        if k * size > found:
            raise ConfigError(
                f"{self.path}: num_stages={k} x stage_mesh_shape {shape} needs {k * size} {device_type} "
                f"devices, found {found}; set cluster.num_logical_cpu_devices : {k * size}, or fewer "
                "stages or a smaller stage mesh"
            )
        rules = self.params.stage_layout_rules
        try:
            batch_axis = mesh_lib.parse_layout_rules(rules).get("batch")
        except ConfigError as e:
            raise ConfigError(
                f"{self.path}: {str(e).replace('cluster.layout_rules', 'stage_layout_rules')}"
            ) from None
        try:
            meshes = [
                mesh_lib.create_mesh(shape, names, rules, device_type, first_device=d * size)
                for d in range(k)
            ]
        except ConfigError as e:
            msg = str(e).replace("cluster.layout_rules", "stage_layout_rules")
            raise ConfigError(f"{self.path}: {msg}") from None
        if batch_axis is not None:  # a data axis: each micro-batch split over its replicas
            self._replicas = meshes[0].axis_sizes[batch_axis]
        if self.mesh is not None and self.mesh.mesh != meshes[0].mesh:
            # Built inside its first stage's mesh (a trainer's stage-mesh placement puts the layers
            # before the pipeline there) is fine; any other enclosing mesh is a second placement.
            raise ConfigError(
                f"{self.path}: stage_mesh_shape puts each stage on a mesh of its own, but the layer is "
                f"already built on a mesh ({self.mesh.describe()}, cluster.mesh_shape); set one"
            )
        if not mesh_lib.keep_all_reduces_apart():
            env = mesh_lib.COMBINE_ALL_REDUCES_ENV
            raise ConfigError(
                f"{self.path}: stage_mesh_shape needs DTensor's all-reduce combiner off (two merged "
                "all-reduces of a stage can wait for each other through the next stage's mesh: the "
                f"step hangs), but the environment turns it on ({env}={os.environ.get(env)!r}); "
                f"set {env}=0 in the environment"
            )
        return meshes

    # (micro-batches, bytes of one micro-batch's pipeline input) of the last training trace
    micro_batch_input_bytes: tuple[int, int] | None = None

    @property
    def stage_meshes(self) -> list[mesh_lib.DeviceMesh]:
        """Each schedule device's mesh (empty without stage_mesh_shape)."""
        return list(self._meshes)

    @property
    def stage_replicas(self) -> int:
        """The replicas a stage mesh's data axis splits each micro-batch over (1: none)."""
        return self._replicas

    @property
    def input_mesh(self) -> mesh_lib.DeviceMesh | None:
        """Where fprop's inputs must be: the first stage's mesh (None: no stage meshes)."""
        return self._meshes[0] if self._meshes else None

    @property
    def output_mesh(self) -> mesh_lib.DeviceMesh | None:
        """Where fprop's outputs (and the head's inputs) are: the last stage's mesh."""
        return self._meshes[(self.num_stages - 1) % len(self._meshes)] if self._meshes else None

    def to_output_mesh(self, x: Any) -> Any:
        """A nest of tensors on the input mesh (a batch's labels, paddings) -> the same values on the
        output mesh, for the head and the metrics (no gradient: for inputs, not activations). Without
        stage meshes, ``x`` as it is."""
        if not self._meshes or self.input_mesh is self.output_mesh:
            return x
        src, dst = self.input_mesh, self.output_mesh
        return tf.nest.map_structure(lambda t: src.move_to(tf.convert_to_tensor(t), dst), x)

    def _make_report(self, method: str) -> str:
        k = self.num_stages
        how = "stages given" if self.params.stages else (
            "split_points" if self.params.split_points else f"partition_method={method}"
        )  # fmt: skip
        micro = (
            f"micro_batch_size={self._micro_batch_size}"
            if self._micro_batch_size
            else f"{self._num_micro_batches} micro-batches"
        )
        title = (
            f"GPipe {self.path}: {len(self._layers)} layers in {k} stages ({how}), {micro}, "
            f"remat={self._remat}, schedule={self._schedule}"
            + (
                f", virtual_stages={self._virtual} on {len(self._devices)} devices"
                if self._virtual > 1
                else ""
            )
        )
        num_params = [x.num_parameters() for x in self._layers]
        names = [x.params.name for x in self._layers]
        devices = self.stage_devices
        if self._meshes:  # a stage's device is its mesh's
            devices = [_mesh_text(self._meshes[s % len(self._meshes)]) for s in range(self.num_stages)]
        return partition.format_report(title, names, self._bounds, devices, num_params, self._costs)

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
        """The device of each stage: stage s runs on ``devices[s % num_devices]``."""
        return [self._devices[s % len(self._devices)] for s in range(self.num_stages)]

    def schedule_for(self, num_micro_batches: int) -> schedules.Schedule:
        """The schedule a training step with M micro-batches runs (ConfigError if it cannot)."""
        try:
            if self.params.schedule_file:
                return self._schedule_from_file(num_micro_batches)
            return schedules.build(
                self._schedule, self.num_devices, num_micro_batches, self._remat, self._virtual
            )
        except schedules.ScheduleError as e:
            raise ConfigError(f"{self.path}: {e}") from None

    def _schedule_from_file(self, num_micro_batches: int) -> schedules.Schedule:
        path = self.params.schedule_file
        if not tf.io.gfile.exists(path):
            raise ConfigError(f"{self.path}: params.schedule_file {path!r} does not exist")
        if tf.io.gfile.isdir(path):
            raise ConfigError(f"{self.path}: params.schedule_file {path!r} is a directory, not a CSV file")
        try:
            with tf.io.gfile.GFile(path) as f:
                rows = torch_format.read_csv(f.read())
            sched = torch_format.from_actions(rows, name=f"file:{path}")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{self.path}: params.schedule_file {path} is not UTF-8 text ({e.reason})"
            ) from None
        except (ValueError, tf.errors.OpError) as e:  # ScheduleError, a number past int's digits
            raise ConfigError(f"{self.path}: params.schedule_file {path}: {str(e)[:200]}") from None
        got = (sched.num_devices, sched.num_stages, sched.num_micro_batches)
        want = (self.num_devices, self.num_stages, num_micro_batches)
        if got != want:
            raise ConfigError(
                f"{self.path}: params.schedule_file {path} has {got[0]} ranks, {got[1]} stages and "
                f"{got[2]} micro-batches; the layer has {want[0]} devices, {want[1]} stages and {want[2]} "
                "micro-batches: set num_stages, virtual_stages and num_micro_batches to match"
            )
        return schedules.with_remat(sched, self._remat)

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
    def _segments(self, k: int, head: HeadFn | None = None) -> list[stage_ops.Segment]:
        """Stage k as segments (its layers; the head last, taking ``(x, head_inputs)``): the units of
        its backward's input and weight halves."""
        segments: list[stage_ops.Segment] = list(self.stage_layers(k))
        if head is None:
            return segments

        def first(ctx: FPropContext, x_and_head_inputs: Any) -> Any:
            x, head_inputs = x_and_head_inputs
            return segments[0](ctx, x), head_inputs

        def middle(layer: BaseLayer) -> stage_ops.Segment:
            return lambda ctx, pair: (layer(ctx, pair[0]), pair[1])

        def run_head(ctx: FPropContext, pair: Any) -> Any:
            return head(ctx, pair[0], pair[1])

        return [first] + [middle(layer) for layer in segments[1:]] + [run_head]

    def _stage_fn(self, k: int, head: HeadFn | None = None) -> stage_ops.Segment:
        segments = self._segments(k, head)

        def run(ctx: FPropContext, x: Any) -> Any:
            for segment in segments:
                x = segment(ctx, x)
            return x

        return run

    def num_micro_batches_for(self, batch_size: int) -> int:
        """M for a training batch of ``batch_size`` examples (ConfigError unless M divides it)."""
        if self._micro_batch_size:
            m, rest = divmod(batch_size, self._micro_batch_size)
            if rest or m == 0:
                raise ConfigError(
                    f"{self.path}: micro_batch_size={self._micro_batch_size} does not divide the batch "
                    f"size {batch_size}; use a batch size that is a multiple of it"
                )
            return m
        m = self._num_micro_batches
        if batch_size % m:
            raise ConfigError(
                f"{self.path}: num_micro_batches={m} does not divide the batch size {batch_size}; use a "
                f"batch size that is a multiple of {m} or another num_micro_batches"
            )
        return m

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
        for i, t in enumerate(flat + head_flat):
            if t.shape.rank is not None and t.shape.rank <= self._batch_dim:
                what = f"input {i}" if i < len(flat) else f"head input {i - len(flat)}"
                raise ConfigError(
                    f"{self.path}: {what} has shape {t.shape}, which has no batch_dim={self._batch_dim}"
                )
        if head is None and head_flat:
            raise ConfigError(f"{self.path}: head_inputs given without a head to use them")
        if head_flat and ctx.training and self._static_batch(head_flat) != self._static_batch(flat):
            raise ConfigError(
                f"{self.path}: the head inputs' batch size {self._static_batch(head_flat)} differs from "
                f"the inputs' {self._static_batch(flat)}"
            )
        if not ctx.training and self.num_stages == 1:
            if head is None:
                return self._stage_fn(0)(ctx, x)
            return self._stage_fn(0, head)(ctx, (x, head_inputs))
        with device_choice.on(self._devices[0]), tf.name_scope("split_micro_batches"):
            micro = self._split(flat, ctx.training, device=self._devices[0])
        if ctx.training:  # what a stage keeps per micro-batch for its backward (static shapes)
            self.micro_batch_input_bytes = (
                len(micro),
                sum(t.shape.num_elements() * t.dtype.size for t in micro[0] if t.shape.is_fully_defined()),
            )
        head_micro: list[list[tf.Tensor]] = [[] for _ in micro]
        if head_flat:
            with device_choice.on(self._devices[-1]), tf.name_scope("split_head_inputs"):
                head_micro = self._split(head_flat, ctx.training, len(micro), self._devices[-1])
        outputs, structure = self._run_schedule(ctx, micro, x, head, head_micro, head_inputs)
        with device_choice.on(self._devices[-1]), tf.name_scope("join_micro_batches"):
            return tf.nest.pack_sequence_as(structure, self._join(outputs))

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
        if ctx.training and (k_stages > 1 or m_count > 1 or any(remat)):
            executor = stage_ops.PipelineExecutor(
                self.path,
                self.schedule_for(m_count),
                [self._segments(k, head if k == k_stages - 1 else None) for k in range(k_stages)],
                self._devices,
                remat,
                ctx,
                head is not None,
                self._meshes,
                self._batch_dim,
            )
            return executor(micro, structure, head_micro, head_structure)
        current = list(micro)
        structures = [structure] * m_count
        for m in range(m_count):
            for k in range(k_stages):
                last = k == k_stages - 1 and head is not None
                fn = self._stage_fn(k, head if last else None)
                with device_choice.on(self.stage_devices[k]), tf.name_scope(f"stage_{k}_micro_batch_{m}"):
                    if self._meshes and k:  # onto this stage's mesh
                        src, dst = (self._meshes[j % len(self._meshes)] for j in (k - 1, k))
                        current[m] = [
                            dst.split_batch(src.move_to(t, dst), self._batch_dim) for t in current[m]
                        ]
                    s_in = (structures[m], head_structure) if last else structures[m]
                    xs_in = current[m] + head_micro[m] if last else current[m]
                    y = fn(ctx.for_micro_batch(m), tf.nest.pack_sequence_as(s_in, xs_in))
                current[m], structures[m] = [tf.convert_to_tensor(v) for v in tf.nest.flatten(y)], y
        return current, structures[0]

    def _join(self, outputs: list[list[tf.Tensor]]) -> list[tf.Tensor]:
        if len(outputs) == 1:
            return outputs[0]
        joined = []
        for i, leaf in enumerate(outputs[0]):
            if leaf.shape.rank is not None and leaf.shape.rank <= self._batch_dim:
                raise ConfigError(
                    f"{self.path}: output {i} has shape {leaf.shape}, which has no batch_dim="
                    f"{self._batch_dim} to concatenate micro-batches along"
                )
            parts = [out[i] for out in outputs]
            joined.append(
                stage_ops.concat_with_grad_on(self._devices[-1], parts, self._batch_dim, self._replicas)
            )
        return joined

    def _split(
        self, flat: list[tf.Tensor], training: bool, m_count: int | None = None, device: str | None = None
    ) -> list[list[tf.Tensor]]:
        """Micro-batch inputs ``[m][leaf]``. Training: M equal parts of a static batch (their gradient,
        a concat, runs on ``device``). Inference: M near-equal parts of any batch, even one of unknown
        size. ``m_count`` forces M (the head inputs are split like the inputs)."""
        bd = self._batch_dim
        if training:
            batch = self._static_batch(flat)
            m_count = m_count or self.num_micro_batches_for(batch)
            if m_count == 1:
                return [list(flat)]
            self._check_replicas(batch, m_count)
            parts = [stage_ops.split_with_grad_on(device, t, m_count, bd, self._replicas) for t in flat]
            return [[p[m] for p in parts] for m in range(m_count)]
        size = flat[0].shape[bd]
        if m_count is None and not self._micro_batch_size:
            m_count = self._num_micro_batches
        elif m_count is None:
            m_count = 1 if size is None else max(1, -(-int(size) // self._micro_batch_size))
        if m_count == 1:
            return [list(flat)]
        if self._replicas > 1:  # the rows each replica holds, split in place
            self._check_replicas(None if size is None else int(size), m_count)
            return [
                list(p) for p in zip(*(stage_ops.micro_batches(t, m_count, bd, self._replicas) for t in flat))
            ]
        total = tf.shape(flat[0])[bd] if size is None else int(size)
        sizes = [(total + m_count - 1 - m) // m_count for m in range(m_count)]
        sizes = tf.stack(sizes) if size is None else sizes
        parts = [tf.split(t, sizes, axis=bd, num=m_count) for t in flat]
        return [[p[m] for p in parts] for m in range(m_count)]

    def _check_replicas(self, batch: int | None, m_count: int) -> None:
        """A stage mesh's data axis splits each micro-batch over its replicas: the batch must be a
        known multiple of replicas x micro-batches."""
        if self._replicas > 1 and (batch is None or batch % (self._replicas * m_count)):
            raise ConfigError(
                f"{self.path}: a batch of {batch} rows does not split into {m_count} micro-batches "
                f"(num_micro_batches) x {self._replicas} replicas (the data axis of stage_mesh_shape); "
                f"make the batch size a multiple of {self._replicas * m_count}"
            )

    def _static_batch(self, flat: list[tf.Tensor]) -> int:
        sizes = set()
        for i, t in enumerate(flat):
            size = t.shape[self._batch_dim] if t.shape.rank is not None else None
            if size is None:
                raise ConfigError(
                    f"{self.path}: the batch dimension (batch_dim={self._batch_dim}) of input {i} is unknown "
                    f"when the step is traced (shape {t.shape}); GPipe needs a static batch size: batch the "
                    "input with drop_remainder=True or trace with a fully defined input_signature"
                )
            sizes.add(int(size))
        if len(sizes) > 1:
            raise ConfigError(f"{self.path}: inputs have different batch sizes {sorted(sizes)}")
        return sizes.pop()


# ----------------------------------------------------------------------------------------- helpers
def _non_negative_int(layer: BaseLayer, name: str) -> int:
    value = layer.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{layer.path}: params.{name} must be an int >= 0, got {value!r}")
    return value


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


def _mesh_text(mesh: mesh_lib.DeviceMesh) -> str:
    """``CPU:2,CPU:3 (model=2)``: a stage mesh's devices and axes, for the partition table."""
    devices = [str(d).rsplit("/device:", 1)[-1] for d in mesh.mesh.local_devices()]
    return f"{','.join(devices)} ({mesh.describe()})"


def clear_stage_meshes(node: Params) -> None:
    """A GPipeLayer's Params set to put its stages on plain devices (the same variables)."""
    node.set(stage_mesh_shape=[], stage_mesh_axis_names=[], stage_layout_rules="")
