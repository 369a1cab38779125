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
                 part and a part per graph node, calibrated for one stage and for a pipeline of
                 stage meshes of each S (``calibrate.measure_mesh``)
    calibrated   a plan in one process (not on meshes): what the experiment's own one-process runs
                 peaked above the items here, a fixed part (it holds ``update`` there) and a part
                 per graph node, either negative where the items over-count
                 (``calibrate.measure_process``)

What it leaves out is in docs/plan.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from trainer.planning.costs import ModelCosts
from trainer.planning.pipeline_api import held

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
    "calibrated",
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


# A layer whose weight gradient the weight half of a split backward (W) takes traces that many
# times the nodes of one whose backward is one pass: I's gradient to the stage's input and to the
# layer's weight cut, then W's from the cut (``layers.parallel.pipeline.weight_cut``). Fitted on one
# process at 8 x 128: K=8 and K=4 on logical devices, M=8, ZB-H2 and 1F1B-split (every layer's W
# deferred at K=8, one layer in two at K=4) beside fill-drain; and K=2, M=2 and 4, ZB-H1, ZB-H2 and
# 1F1B-split (two layers of four deferred a stage), which peaked 3 to 9% above 2.8 in three runs.
DEFERRED_NODES = 3.4
# The trainer of stage processes keeps what a deferred W adds to its stages' graphs that many times
# over (per node, at its own ``GRAPH_NODE_BYTES``): fitted on its VmHWM at 8 x 128 and 8 x 512, K=2
# and K=4, ZB-H1 and ZB-H2, M=2 to 8, beside fill-drain (1.8 times 2.8 - 1 extra nodes then).
TRAINER_DEFERRED_EXTRA = 1.35


def deferred_layers(schedule: Any, bounds: Sequence[int], unit_bytes: float) -> list[set[int]]:
    """Per part of the cut ``bounds`` under a split-backward ``schedule`` (a built
    ``schedule.Schedule``), the layers whose weight gradient W takes: the executor's own choice
    (``held.weight_budgets``, ``held.deferred_segments``), each layer a segment that keeps its input
    and output (``unit_bytes`` each; the first part's input is the pipeline's own and counts for
    neither) and holds both from I to W."""
    kept, held_bytes = [], []
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        first_free = s == 0
        kept.append(int((b - a + 1 - first_free) * unit_bytes))
        held_bytes.append([int(unit_bytes * (1 if first_free and i == a else 2)) for i in range(a, b)])
    budgets = held.weight_budgets(schedule, kept)
    return [
        set(range(a, a + held.deferred_segments(budget, sizes)))
        for a, budget, sizes in zip(bounds[:-1], budgets, held_bytes)
    ]


def graph_nodes(
    costs: ModelCosts,
    micro_batch: int,
    layers: Sequence[int],
    micro_batches: int,
    remat: str,
    deferred: Collection[int] = (),
) -> float:
    """The op count of a traced step over ``layers`` (indices) for ``micro_batches`` micro-batches;
    ``deferred``: the layers whose weight gradient a split backward's W takes."""
    ops = costs.per_size[micro_batch]["ops"]
    per = sum(ops[i] * (DEFERRED_NODES if i in deferred else 1.0) for i in layers)
    recompute = {"never": 0.0, "except_last": (micro_batches - 1) / micro_batches, "always": 1.0}[remat]
    return per * micro_batches * (1.0 + recompute / 3.0)  # a recompute is a forward: a third of F + B
