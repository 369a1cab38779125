"""What each process of a plan holds at its peak, item by item (bytes).

    baseline     TensorFlow's own footprint (costs.baseline_mib: a fresh process's peak)
    runtime      what a process of its kind brings up beyond the baseline (``RUNTIME_BYTES``)
    weights      float32 variables the process owns
    gradients    their gradient sums (one float32 copy of the weights)
    optimizer    the optimizer's slots (Adam: two copies of the weights)
    update       the update's temporaries (the clipped gradients, the optimizer's intermediate
                 tensors): ``costs.update_ratio`` times the weights, calibrated on the experiment's
                 own stage processes (``calibrate``)
    activations  what the schedule holds at its peak on each of the process's devices: per stage and
                 micro-batch, the bytes the stage's backward reads from its forward (remat never),
                 or the stage's input alone (re-materialized micro-batches); placed in time by the
                 schedule's timeline (``pipeline.memory.peak_held``)
    workspace    the step's temporaries: one micro-batch's recomputed activations under remat, the
                 largest layer's backward temporaries, the loss's logits and their gradient
    graph        the traced step's graph: its op count (each layer's measured gradient graph, per
                 micro-batch and unit) times ``GRAPH_NODE_BYTES`` of the process's kind
    all_reduce   replicas: one more copy of the gradients, the all-reduce's buffer
    mesh         stages on a DTensor mesh of S devices: what DTensor keeps beyond the unsharded
                 layers' items (its runtime, the replicated tensors, the per-device graphs), a fixed
                 part and a part per graph node, calibrated for each S (``calibrate.measure_mesh``)

What it leaves out is in docs/plan.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trainer.planning.costs import ModelCosts

MIB = 2**20
# What a process of each kind keeps beyond the baseline besides its model (``runtime``: for stage
# processes and their trainer, the gRPC server and the remote functions' machinery), and the bytes
# one node of its traced step keeps (its graph, the optimized copies, the executors' state). Fitted
# on measured runs of the capacity family at 8 x 128 (batch 8, sequences of 128; VmHWM less the other
# items, against the nodes counted here): K=2 stage processes at M=2 and M=4 fill-drain and M=8 1F1B
# remat always (the trainer 266, 349 and 656 MiB over 5.8k, 11.6k and 31k nodes; each stage about
# 150, 143 and 225 MiB over 2.9k, 5.8k and 15.5k); one process M=1, K=2 on logical devices at M=2
# 1F1B and M=4 fill-drain (277, 364 and 495 MiB over 2.9k, 5.8k and 11.6k nodes).
RUNTIME_BYTES = {"in_process": 205.0 * MIB, "stage_trainer": 178.0 * MIB, "stage": 140.0 * MIB}
GRAPH_NODE_BYTES = {"in_process": 27 * 1024, "stage_trainer": 16 * 1024, "stage": 6 * 1024}
ITEMS = (
    "baseline",
    "runtime",
    "weights",
    "gradients",
    "optimizer",
    "update",
    "activations",
    "workspace",
    "graph",
    "all_reduce",
    "mesh",
)


@dataclasses.dataclass
class ProcessMemory:
    """One process's predicted peak, item by item (bytes)."""

    name: str
    items: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.items.values())

    def largest_item(self) -> str:
        return max((k for k in self.items if k != "baseline"), key=lambda k: self.items[k])


def state_items(costs: ModelCosts, params: float) -> dict[str, float]:
    """Weights, gradient sums, optimizer slots and the update's temporaries of ``params`` float32
    parameters."""
    return {
        "weights": 4.0 * params,
        "gradients": 4.0 * params,
        "optimizer": 4.0 * params * costs.optimizer_slots,
        "update": 4.0 * params * costs.update_ratio,
    }


def part_bytes(costs: ModelCosts, micro_batch: int, bounds: Sequence[int]) -> tuple[list[float], list[float]]:
    """Per part of the cut ``bounds``: the bytes one micro-batch keeps for its backward, and its input."""
    kept = costs.per_size[micro_batch]["kept_bytes"]
    full = [float(sum(kept[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    inputs = [float(micro_batch * costs.example_bytes)] * (len(bounds) - 1)
    return full, inputs


# A schedule that splits the backward (I, then W from per-layer tapes) traces that many times the
# nodes: fitted on the trainer of K=2 stage processes at 8 x 128, M=2, ZB-H1 beside fill-drain.
SPLIT_BACKWARD_NODES = 2.4


def graph_nodes(
    costs: ModelCosts,
    micro_batch: int,
    layers: Sequence[int],
    micro_batches: int,
    remat: str,
    split_backward: bool = False,
) -> float:
    """The op count of a traced step over ``layers`` (indices) for ``micro_batches`` micro-batches."""
    ops = costs.per_size[micro_batch]["ops"]
    per = sum(ops[i] for i in layers) * (SPLIT_BACKWARD_NODES if split_backward else 1.0)
    recompute = {"never": 0.0, "except_last": (micro_batches - 1) / micro_batches, "always": 1.0}[remat]
    return per * micro_batches * (1.0 + recompute / 3.0)  # a recompute is a forward: a third of F + B
