"""The GPipe layer's knobs: every field of ``GPipeLayer.Params`` and its help text, in groups, and the
checks that the stage-count knobs agree."""

from __future__ import annotations

from typing import Any

from params.errors import ConfigError
from params.hyperparams import InstantiableParams


def define(p: InstantiableParams) -> None:
    """Defines every GPipe field on ``p``, in the order the Params text lists them."""
    for group in (_define_partition, _define_batch, _define_placement, _define_schedule):
        group(p)


def _define_partition(p: InstantiableParams) -> None:
    """The sequence and how it is cut into stages."""
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


def _define_batch(p: InstantiableParams) -> None:
    """The micro-batches."""
    p.define("num_micro_batches", 1, "M: each mini-batch is split into M micro-batches.")
    p.define("micro_batch_size", 0, "Instead of num_micro_batches: examples per micro-batch (0: unused).")
    p.define("batch_dim", 0, "The batch dimension of every input and output tensor.")


def _define_placement(p: InstantiableParams) -> None:
    """Where the stages run: a device each, or a mesh each."""
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


def _define_schedule(p: InstantiableParams) -> None:
    """The order of the units and what they keep."""
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


def check_stages(path: str, count: int, num_stages: int, v: int, split_points: bool) -> None:
    """ConfigError unless ``count`` stages given as params.stages fit num_stages and ``v``."""
    if count % v:
        raise ConfigError(
            f"{path}: params.stages has {count} stages, not a multiple of virtual_stages={v}; "
            f"give {v} stages per device"
        )
    if num_stages not in (0, count // v):
        raise ConfigError(
            f"{path}: num_stages={num_stages} but params.stages has {count} "
            f"(virtual_stages={v}: {count // v} devices)"
        )
    if split_points:
        raise ConfigError(f"{path}: split_points cut params.layers; leave it empty with params.stages")


def layer_devices(path: str, n: int, num_stages: int, v: int, split_points: list[int]) -> int:
    """The schedule devices ``n`` layers are cut for (ConfigError if num_stages, ``v`` and
    split_points disagree, or there are too few layers)."""
    if split_points and num_stages not in (0, (len(split_points) + 1) // v):
        raise ConfigError(
            f"{path}: num_stages={num_stages} but split_points {split_points} make "
            f"{len(split_points) + 1} stages"
        )
    if split_points and (len(split_points) + 1) % v:
        raise ConfigError(
            f"{path}: split_points make {len(split_points) + 1} stages, not a multiple of "
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
            f"{path}: {need} but there are only {n} layers; each stage needs at least one layer, "
            f"so use num_stages <= {n // v}"
        )
    return devices


def non_negative_int(layer: Any, name: str) -> int:
    value = layer.params.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{layer.path}: params.{name} must be an int >= 0, got {value!r}")
    return value
