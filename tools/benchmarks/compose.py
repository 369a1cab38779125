"""Pipeline x mesh x replicas: ``python -m tools.benchmark compose [--quick]``.

One model, a stack of Megatron pairs (``embed -> hidden`` column-split, ``hidden -> embed``
row-split, with ``hidden:model`` rules), trained with SGD on ``--devices`` logical CPU devices (4,
set before TensorFlow starts; 8 adds pipeline 2 x mesh 2 x replicas 2) in every combination of
pipeline K (GPipe stages), mesh N (a model axis of N devices per stage) and replicas R (a data axis
of R devices per stage, the batch split over it) with K * N * R <= the devices. K > 1 with N * R > 1
is a GPipe whose stages each carry a mesh of their own (``GPipeLayer.stage_mesh_shape``; R > 1:
each micro-batch split over the data axis); K = 1 is the stack on one [R, N] mesh; K > 1 alone is
one device per stage. Per combination, two JSON lines:

- ``param_bytes_ratio``: the parameter bytes of the device that holds the most (each variable's
  local component on each device, summed per device) over the unsharded model's bytes. Pipeline 2 x
  mesh 2 is about 1/4 (each stage holds half the layers, each weight split in two; the row-split
  layers' biases stay whole); replicas hold copies, so R changes nothing.
- ``step_s``: the best of a few compiled training steps' seconds (one process, all combinations on
  the same logical devices, which share the machine's cores: noisy on a loaded machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tools.benchmarks import harness

DEVICES = 4


def _layers(dim: int, pairs: int) -> list:
    from layers import core

    out = []
    for i in range(pairs):
        for j, (a, b, an, bn) in enumerate(
            [(dim, 4 * dim, "embed", "hidden"), (4 * dim, dim, "hidden", "embed")]
        ):
            out.append(
                core.ProjectionLayer.Params().set(
                    name=f"fc{2 * i + j}",
                    input_dim=a,
                    output_dim=b,
                    input_dim_name=an,
                    output_dim_name=bn,
                    activation="relu" if j == 0 else "none",
                )
            )
    return out


def _mesh_args(n: int, r: int) -> tuple[list[int], list[str], str]:
    """The mesh of R x N (axes of size 1 left out) and the layout rules of its axes."""
    shape, names, rules = [], [], []
    if r > 1:
        shape, names, rules = [r], ["data"], ["batch:data"]
    if n > 1:
        shape, names, rules = shape + [n], names + ["model"], rules + ["hidden:model"]
    return shape, names, ";".join(rules)


def combinations(devices: int = DEVICES) -> list[tuple[int, int, int]]:
    """Every (K, N, R) of powers of two whose product fits the devices."""
    sizes = [s for s in (1, 2, 4, 8) if s <= devices]
    return [(k, n, r) for k in sizes for n in sizes for r in sizes if k * n * r <= devices]


def measure(k: int, n: int, r: int, size: dict, steps: int) -> dict:
    """Builds the combination, returns its largest device's parameter bytes and best step seconds."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from layers import core
    from layers.base_layer import FPropContext
    from layers.parallel import mesh as mesh_lib
    from layers.parallel.pipeline import gpipe

    layers = _layers(size["dim"], size["pairs"])
    shape, names, rules = _mesh_args(n, r)
    first = last = None
    if k > 1:
        stage_mesh = dict(stage_mesh_shape=shape, stage_mesh_axis_names=names, stage_layout_rules=rules)
        model = (
            gpipe.GPipeLayer.Params()
            .set(
                name="net", layers=layers, num_stages=k, num_micro_batches=2, **(stage_mesh if shape else {})
            )
            .instantiate()
        )
        first, last = model.input_mesh, model.output_mesh
    else:
        first = last = mesh_lib.create_mesh(shape, names, rules) if shape else None
        with mesh_lib.mesh_scope(first):
            model = core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()

    per_device: dict[str, int] = {}
    for v in model.trainable_variables:
        if isinstance(v, dtensor.DVariable):
            layout = dtensor.fetch_layout(v)
            for device, part in zip(layout.mesh.local_devices(), dtensor.unpack(v.read_value())):
                per_device[device] = per_device.get(device, 0) + int(part.shape.num_elements()) * 4
        else:
            per_device[v.device] = per_device.get(v.device, 0) + int(v.shape.num_elements()) * 4

    rng = np.random.default_rng(0)
    x = rng.normal(size=(size["batch"], size["dim"])).astype(np.float32)
    y = rng.normal(size=(size["batch"], size["dim"])).astype(np.float32)
    split = ["data" if r > 1 else None, None]
    xin = first.to_layout(x, split) if first is not None else tf.constant(x)
    yin = last.to_layout(y, split) if last is not None else tf.constant(y)
    variables = model.trainable_variables

    def error(ctx: Any, out: Any, target: Any) -> Any:
        return tf.reduce_sum(tf.square(out - target), axis=-1)

    @tf.function(autograph=False)
    def step() -> Any:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            if k > 1:
                per_example = model(ctx, xin, head=error, head_inputs=yin)
            else:
                per_example = error(ctx, model(ctx, xin), yin)
            loss = tf.reduce_sum(per_example) / float(x.size)
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.01 * g)
        return loss

    def one() -> float:
        start = time.perf_counter()
        loss = step()
        (dtensor.unpack(loss)[0] if dtensor.is_dtensor(loss) else loss).numpy()
        return time.perf_counter() - start

    one(), one()  # compile and warm up
    return {"param_bytes": max(per_device.values()), "step_s": min(one() for _ in range(steps))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark compose")
    parser.add_argument("--quick", action="store_true", help="A smoke test: the small size, 2 timed steps.")
    parser.add_argument("--dim", type=int, default=256, help="Model width (hidden is 4x).")
    parser.add_argument("--pairs", type=int, default=4, help="Megatron pairs of projections.")
    parser.add_argument("--batch", type=int, default=64, help="Global batch.")
    parser.add_argument(
        "--devices",
        type=int,
        default=DEVICES,
        help="Logical CPU devices (8: pipeline 2 x mesh 2 x replicas 2 too).",
    )
    args = parser.parse_args(argv[1:])
    harness.configure(
        {
            "cpus": None,
            "measure": "time",
            "intra_op_threads": 0,
            "inter_op_threads": 0,
            "logical_devices": args.devices,
        }
    )
    # Pipeline 2 x mesh 2 at the default size hung in TensorFlow 2.21's DTensor until its all-reduce
    # combiner was turned off (layers/parallel/mesh.py, docs/parallelism/compose.md).
    size = {"dim": args.dim, "pairs": args.pairs, "batch": args.batch}
    if args.quick:
        size = {"dim": 32, "pairs": 2, "batch": 16}
    steps = 2 if args.quick else 5
    whole = None
    for k, n, r in combinations(args.devices):
        got = measure(k, n, r, size, steps)
        if whole is None:  # (1, 1, 1) comes first: the unsharded model
            whole = got["param_bytes"]
        knobs = {"pipeline": k, "mesh": n, "replicas": r}
        harness.emit(
            "param_bytes_ratio",
            got["param_bytes"] / whole,
            **knobs,
            param_bytes=got["param_bytes"],
            unsharded_bytes=whole,
            **size,
        )
        harness.emit("step_s", round(got["step_s"], 5), **knobs, **size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
