"""Mesh (DTensor) figures as JSON lines: ``python -m tools.benchmark mesh [--quick]``.

The model is ``lm.synthetic.MeshTransformerLM``'s Transformer LM with the rules
``batch:data;hidden:model;heads:model;vocab:model``. Every side runs in its own subprocess
(``python -m tools.benchmarks.mesh --worker=JSON``), which sets its logical CPU devices and threads
before TensorFlow starts.

- param_bytes_ratio_model{2,4}: bytes of the task's variables held by one device (the largest local
  component of each DVariable, read from ``dtensor.unpack``) on a 1x2 / 1x4 mesh over the unsharded
  model's bytes. Targets <= 0.52 and <= 0.27 (layer norms and the biases of outputs that are not
  split stay replicated).
- activation_bytes_ratio_model{2,4}: the bytes one device holds of every layer output in one forward
  pass (the local components, summed), over the unsharded sum. It is a sum of the layers' outputs,
  an upper bound of what a forward pass keeps for the backward pass, not an allocator peak (CPU
  devices share one allocator and report no per-device peak).
- step_peak_bytes_ratio_model{2,4}: the peak bytes of live tensors in one traced train step (above
  what was live before it: weights, slots), from the profiler's allocator events
  (``tools/memory_trace.py``), divided by the number of devices, over the unsharded step's peak. The
  logical CPU devices share one allocator, so this is the process's peak split evenly; under SPMD every
  device runs the same program on equal shards, and the devices' own peaks are at least this.
- step_time_ratio_{data2,model2}: the train step's time on the 2x1 (data) and 1x2 (model) mesh over the
  unsharded model's; one core per device (the process's CPU affinity is limited to as many cores as
  the mesh has devices, one intra-op thread per op). Sides run in alternating rounds; the best round
  of each counts (load only ever adds time). The collectives: data parallelism all-reduces every
  gradient once per step; the model split all-reduces each layer's output twice per layer forward
  (after w_o and fc2) and twice backward, and the tied softmax's vocabulary split adds a reduction
  over the logits' last dimension.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from tools.benchmarks import harness

RULES = "batch:data;hidden:model;heads:model;vocab:model"


def _experiment(spec: dict) -> Any:
    from tasks.lm.params.synthetic import MeshTransformerLM

    return MeshTransformerLM(
        model_dim=spec["model_dim"],
        hidden_dim=4 * spec["model_dim"],
        num_heads=4,
        num_layers=spec["layers"],
        batch_size=spec["batch"],
        seq_length=spec["length"],
        num_train_sequences=8 * spec["batch"],
    )


def run_worker(spec: dict) -> int:
    """One side: builds the step on ``spec['mesh']`` ([] = unsharded) and prints its figures."""
    devices = max(1, spec["devices"])
    tf = harness.configure(
        {
            "cpus": sorted(os.sched_getaffinity(0))[:devices] if spec.get("pin") else None,
            "measure": "memory" if spec.get("memory") else "time",
            "intra_op_threads": 1,
            "inter_op_threads": devices,
            "logical_devices": devices,
        }
    )
    from tensorflow.experimental import dtensor

    from layers.base_layer import BaseLayer, FPropContext
    from layers.parallel import mesh as mesh_lib
    from trainer.distributed.mesh_placement import MeshPlacement
    from trainer.train_step import TrainStep

    exp = _experiment(spec)
    if spec["mesh"]:
        mesh = mesh_lib.create_mesh(spec["mesh"], ["data", "model"], RULES)
        step = TrainStep(exp.task(), exp.train(), MeshPlacement(mesh))
    else:
        mesh, step = None, TrainStep(exp.task(), exp.train())

    def local_bytes(x: Any) -> int:
        x = x.read_value() if isinstance(x, tf.Variable) else tf.convert_to_tensor(x)
        parts = dtensor.unpack(x) if mesh is not None else [x]
        return max(int(p.shape.num_elements()) * p.dtype.size for p in parts)

    out: dict[str, Any] = {"param_bytes": sum(local_bytes(v) for v in step.task.variables)}
    batch = next(iter(exp.train().instantiate().dataset()))
    if mesh is not None:
        batch = step.placement.to_mesh(batch)
    recorded: list[int] = []
    original = BaseLayer.shard_activation

    def recording(layer: Any, x: Any, last_dim: Any = None) -> Any:
        size = int(x.shape.num_elements()) * x.dtype.size
        if layer.mesh is not None:  # the output's layout is the mapping it is relaid out to
            for axis in layer.activation_split(x, last_dim):
                size //= layer.mesh.axis_sizes[axis] if axis else 1
        recorded.append(size)
        return original(layer, x, last_dim)

    BaseLayer.shard_activation = recording  # every sharding layer's output, as one device holds it
    try:
        tf.function(lambda b: step.task.fprop(FPropContext(training=True), b)).get_concrete_function(batch)
    finally:
        BaseLayer.shard_activation = original
    out["activation_bytes"] = sum(recorded)
    if spec.get("memory"):
        from tools.memory_trace import live_tensor_peak

        step.run(2)  # compiled and warmed up: the traced step allocates only what a step needs
        traced = live_tensor_peak(lambda: bool(step.run(1)[0].numpy()))
        out["step_peak_bytes"] = traced["live_peak_bytes"] - traced["resting_bytes"]
    if spec.get("steps"):
        step.run(2)  # compile and warm up
        times = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            finite, _ = step.run(1)
            bool(finite.numpy())
            times.append(time.perf_counter() - start)
        out["step_seconds"] = min(times)
    print(json.dumps(out), flush=True)
    return 0


def _side(spec: dict) -> dict:
    return harness.run_once("mesh", spec)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.benchmark mesh")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="A smaller model and fewer steps.")
    parser.add_argument("--rounds", type=int, default=2, help="Alternating timing rounds per side.")
    args = parser.parse_args(argv[1:])
    if args.worker:
        return run_worker(json.loads(args.worker))
    size = (
        {"model_dim": 64, "layers": 2, "batch": 16, "length": 32}
        if args.quick
        else {"model_dim": 256, "layers": 2, "batch": 32, "length": 64}
    )
    steps = 3 if args.quick else 5
    base = _side({**size, "mesh": [], "devices": 1})
    for k in (2, 4):
        side = _side({**size, "mesh": [1, k], "devices": k})
        harness.emit(
            f"param_bytes_ratio_model{k}",
            side["param_bytes"] / base["param_bytes"],
            target=0.52 if k == 2 else 0.27,
            sharded_bytes=side["param_bytes"],
            unsharded_bytes=base["param_bytes"],
            **size,
        )
        harness.emit(
            f"activation_bytes_ratio_model{k}",
            side["activation_bytes"] / base["activation_bytes"],
            sharded_bytes=side["activation_bytes"],
            unsharded_bytes=base["activation_bytes"],
            **size,
        )
    peaks = {
        k: _side({**size, "mesh": [1, k] if k > 1 else [], "devices": k, "memory": True}) for k in (1, 2, 4)
    }
    for k in (2, 4):
        per_device = peaks[k]["step_peak_bytes"] / k
        harness.emit(
            f"step_peak_bytes_ratio_model{k}",
            per_device / peaks[1]["step_peak_bytes"],
            per_device_bytes=int(per_device),
            unsharded_bytes=peaks[1]["step_peak_bytes"],
            **size,
        )
    sides = {
        "unsharded": {**size, "mesh": [], "devices": 1},
        "data2": {**size, "mesh": [2, 1], "devices": 2},
        "model2": {**size, "mesh": [1, 2], "devices": 2},
    }
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, spec in sides.items():
            seconds = _side({**spec, "steps": steps, "pin": True})["step_seconds"]
            best[name] = min(best.get(name, float("inf")), seconds)
    for name in ("data2", "model2"):
        harness.emit(
            f"step_time_ratio_{name}",
            best[name] / best["unsharded"],
            mesh_seconds=round(best[name], 4),
            unsharded_seconds=round(best["unsharded"], 4),
            cores_per_side={"data2": 2, "model2": 2, "unsharded": 1},
            **size,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
