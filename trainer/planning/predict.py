"""A plan's step time, every process's peak memory and the bytes each sends per step, predicted
from measured costs.

The step: the schedule's timeline (``simulator.simulate``) over each stage's summed layer costs at
the plan's micro-batch size (forward, backward, recompute = forward, the backward's input and weight
halves), with every hand-off between stage processes costing the link's latency plus its bytes over
the link's bandwidth; plus the step outside the stack (embedding, loss, optimizer: calibrated at the
full batch, divided among replicas); plus, for stage processes, the trainer's hand-off to the first
stage and back; plus, for replicas, a ring all-reduce of the gradients (2 (R - 1) / R of their bytes
over the link). Each layer of a unit inside one process's traced step, W included, costs a
calibrated ``process_layer_s`` beyond its isolated timing (its ops' dispatch in the step's executor,
the micro-batch's slicing and joins; at least 0): a cost per layer, not per unit, so an interleaved
schedule's units of fewer layers each pay less.
Logical devices of one process overlap only partly (their ops' dispatch is the process's): an
in-process pipeline's step lies between the schedule's timeline and the sum of all its units,
``devices_serial`` of the way (calibrated; 1 until measured). Processes computing at once beyond
the host's cores (``host_cores``) take turns: the step is at least all their units' CPU time over
the cores, a unit's CPU time its layers' time by the CPU seconds a second they took when timed
(``cpu_per_wall``: with one thread per op, TensorFlow still runs independent ops side by side),
plus its layers' own cost in one process, plus its dispatch to a stage process or a mesh (the
executors' work on both sides of a crossing holds a core: at 8 x 128 on 2 cores, K=2 stage
processes at M=8 are bound by the cores, and their steps grow with their units). Stage processes
and stages on a DTensor mesh add their calibrated costs (``calibrate``): a fixed cost a step
(stage processes': two tasks', and one for each further task) and a cost per unit (a stage
process's: every unit but a split backward's W, which hands nothing to another process; a mesh's:
the same units, one stage's or a pipeline's of two, ``mesh_key``).
Memory: ``memory``'s items per process; a stage mesh's shards all live in the one process (every
weight whole across its S devices), plus its calibrated ``mesh`` item; any other plan in one process
has its calibrated ``calibrated`` item instead of ``update``. A split backward's graph
counts the layers whose weight gradient W takes (``memory.deferred_layers``: the executor's own
choice).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from trainer.planning import memory
from trainer.planning.candidates import Plan
from trainer.planning.costs import ModelCosts
from trainer.planning.memory import MIB, ProcessMemory
from trainer.planning.pipeline_api import held, schedule, simulator


@dataclasses.dataclass
class Prediction:
    """One plan's predicted step."""

    plan: Plan
    step_s: float
    bubble: float
    processes: list[ProcessMemory]
    bytes_sent: list[float]

    @property
    def peak_mib(self) -> float:
        return max(p.total for p in self.processes) / MIB

    def fits(self, budget_mib: float) -> bool:
        return self.peak_mib <= budget_mib

    def overflow(self, budget_mib: float) -> tuple[str, str, float]:
        """The process over ``budget_mib`` by most, its largest item, and by how many MiB."""
        worst = max(self.processes, key=lambda p: p.total)
        return worst.name, worst.largest_item(), worst.total / MIB - budget_mib

    def to_json(self, budget_mib: float | None = None) -> dict[str, Any]:
        d = {
            "plan": self.plan.name(),
            "placement": self.plan.placement,
            "processes": self.plan.processes,
            "num_stages": self.plan.num_stages,
            "num_micro_batches": self.plan.num_micro_batches,
            "schedule": self.plan.schedule,
            "virtual_stages": self.plan.virtual_stages,
            "remat": self.plan.remat,
            "replicas": self.plan.replicas,
            "split_points": list(self.plan.split_points),
            "step_s": round(self.step_s, 6),
            "bubble": round(self.bubble, 4),
            "peak_mib": round(self.peak_mib, 1),
            "memory_mib": {
                p.name: {k: round(v / MIB, 1) for k, v in p.items.items()} for p in self.processes
            },
            "bytes_sent": [int(b) for b in self.bytes_sent],
        }
        if budget_mib is not None:
            d["fits"] = self.fits(budget_mib)
        return d


def _bounds(plan: Plan, num_layers: int) -> list[int]:
    return [0, *plan.split_points, num_layers]


def _part_layers(bounds: list[int]) -> list[int]:
    """How many layers each part of the cut ``bounds`` holds."""
    return [b - a for a, b in zip(bounds[:-1], bounds[1:])]


def stage_costs(
    costs: ModelCosts,
    plan: Plan,
    micro_batch: int,
    transfer: float,
    unit_s: float = 0.0,
    layer_s: float = 0.0,
    recompute_s: float | None = None,
) -> Any:
    """Each part's summed layer costs (``simulator.StageCosts``, K * v parts), every unit but a split
    backward's weight half W ``unit_s`` longer (a unit's dispatch to, or crossing from, another
    process: W hands nothing on), a recompute ``recompute_s`` longer (None: ``unit_s``; a stage
    process's recompute reads its own input and hands nothing on), and every unit W included
    ``layer_s`` longer per layer of its part (a layer's own cost in one process's traced step: its
    ops' dispatch, its slicing and joins; measured, ZB-H1 and ZB-H2 in one process step no faster
    than fill-drain)."""
    figures = costs.per_size[micro_batch]
    bounds = _bounds(plan, costs.num_layers)

    def sums(name: str) -> list[float]:
        return [float(sum(figures[name][a:b])) for a, b in zip(bounds[:-1], bounds[1:])]

    layers = _part_layers(bounds)
    forward, backward, b_in = sums("forward"), sums("backward"), sums("backward_input")
    weight = [max(b - i, 0.0) for b, i in zip(backward, b_in)]
    again = unit_s if recompute_s is None else recompute_s

    def units(seconds: list[float], extra: float) -> list[float]:
        return [s + extra + layer_s * n for s, n in zip(seconds, layers)]

    return simulator.StageCosts.given(
        units(forward, unit_s),
        units(backward, unit_s),
        units(forward, again),
        transfer,
        backward_input=units(b_in, unit_s),
        backward_weight=units(weight, 0.0),
    )


def handoff_seconds(
    costs: ModelCosts, num_bytes: float, link_bytes_per_s: float, link_latency_s: float
) -> float:
    """One hand-off of ``num_bytes`` between two processes: the slower of the link and TensorFlow's
    runtime (``grpc_link``: a crossing's fixed time, its bytes per second), each fixed time and rate."""
    hop = max(link_latency_s, costs.grpc_hop_s)
    rate = min(link_bytes_per_s, costs.grpc_bytes_per_s) if costs.grpc_bytes_per_s else link_bytes_per_s
    return hop + num_bytes / rate


def mesh_key(plan: Plan) -> str:
    """The calibrated stage-mesh terms ``plan`` uses (``costs.mesh``): ``<stages>x<mesh size>``, one
    stage's, or two stages' for a pipeline of stage meshes (their cross-mesh copies, two meshes'
    runtimes)."""
    return f"{min(plan.num_stages, 2)}x{plan.stage_mesh}"


def predict(
    costs: ModelCosts, plan: Plan, link_bytes_per_s: float, link_latency_s: float, host_cores: int = 0
) -> Prediction:
    """``plan``'s step, memory and bytes (module doc). ``host_cores``: the cores every process of the
    plan shares (all on one host); 0: each process has its own."""
    b = plan.micro_batch(costs.batch_size)
    m, k, v = plan.num_micro_batches, plan.num_stages, plan.virtual_stages
    bounds = _bounds(plan, costs.num_layers)
    handoff = float(b * costs.example_bytes)
    remote = plan.placement == "stage_processes"
    transfer = handoff_seconds(costs, handoff, link_bytes_per_s, link_latency_s) if remote else 0.0
    meshed = costs.mesh.get(mesh_key(plan), {}) if plan.placement == "pipeline_mesh" else {}
    dispatch = costs.stage_unit_s if remote else meshed.get("unit_s", 0.0)  # a crossing's executors
    pipelines = k * m > 1 or plan.remat != "never"  # else the plain step, which rest_seconds measured
    own = max(costs.process_layer_s, 0.0) if not remote and pipelines else 0.0  # holds a core
    # the units that pay no dispatch: W hands nothing on; nor, in a stage process, a recompute
    unpaid = {schedule.BACKWARD_WEIGHT, schedule.RECOMPUTE} if remote else {schedule.BACKWARD_WEIGHT}
    again = 0.0 if schedule.RECOMPUTE in unpaid else None
    sc = stage_costs(costs, plan, b, transfer, dispatch, own, again)
    sched = schedule.build(plan.schedule, k, m, plan.remat, v)
    sim = simulator.simulate(sched, m, plan.remat, sc, v)
    busy = sum(e.end - e.start for e in sim.events)  # every unit's work, all stages together
    pipelined = sim.step_time
    if not remote:  # logical devices overlap partly (module doc)
        serial = costs.devices_serial if costs.devices_serial >= 0 else 1.0
        pipelined += serial * max(busy - pipelined, 0.0)
    if host_cores:  # every process's units' CPU time (R replicas: R times one's) on the host's cores
        waits = dispatch * sum(1 for e in sim.events if e.kind not in unpaid)
        layers = _part_layers(bounds)
        owns = own * sum(layers[e.stage] for e in sim.events)
        cpu = statistics.fmean(costs.per_size[b].get("cpu_per_wall", [1.0]))
        # the layers' CPU time, each layer's own cost in one process, and each unit's dispatch
        compute = (busy - waits - owns) * cpu + owns + waits
        pipelined = max(pipelined, compute * plan.replicas / host_cores)
    step = pipelined + max(costs.rest_seconds, 0.0) / plan.replicas + meshed.get("step_s", 0.0)
    if remote:  # the trainer's hand-offs to the first stage and back, the runtime's fixed costs
        step += 2 * transfer + max(costs.stage_step_s, 0.0) + (k - 2) * max(costs.stage_task_s, 0.0)
    grad_bytes = 4.0 * costs.total_params
    if plan.replicas > 1:
        r = plan.replicas
        step += 2 * (r - 1) / r * grad_bytes / link_bytes_per_s + 2 * (r - 1) * link_latency_s

    # memory: per device (stage rows of the timeline), then per process
    full, inputs = memory.part_bytes(costs, b, bounds)
    kept = costs.per_size[b]["kept_bytes"]
    split = plan.schedule in schedule.SPLIT_BACKWARD
    deferred = memory.deferred_layers(sched, bounds, handoff) if split else [set()] * len(full)
    if plan.remat == "never":
        peak = held.peak_held(list(sim.events), full)
    else:
        peak = held.peak_held(list(sim.events), inputs)
        if plan.remat == "except_last":  # the last micro-batch keeps everything
            peak = [
                h + max(full[s] - inputs[s] for s in range(len(full)) if s % k == d)
                for d, h in enumerate(peak)
            ]
    devices, base_nodes = [], 0.0  # base_nodes: without W's deferred layers
    for d in range(k):
        parts = [s for s in range(len(full)) if s % k == d]
        layers = [i for s in parts for i in range(bounds[s], bounds[s + 1])]
        params = float(sum(costs.layer_params[i] for i in layers))  # a stage mesh's shards: one process
        work = max(kept[i] for i in layers)
        if plan.remat != "never":
            work += max(full[s] for s in parts)
        if d == (len(full) - 1) % k:  # the loss's logits in the last stage
            work += b * costs.head_bytes_per_example
        items = memory.state_items(costs, params)
        items["activations"] = float(peak[d])
        items["workspace"] = float(work)
        taken = set().union(*(deferred[s] for s in parts))
        items["graph"] = memory.graph_nodes(costs, b, layers, m, plan.remat, taken)  # nodes; bytes below
        base_nodes += memory.graph_nodes(costs, b, layers, m, plan.remat)
        devices.append(items)
    base = costs.baseline_mib * MIB
    other = memory.state_items(costs, float(costs.other_params))
    other["workspace"] = float(b * m * costs.example_bytes)  # the embedding's output for the batch
    node_bytes = memory.GRAPH_NODE_BYTES
    nodes = sum(dev["graph"] for dev in devices)
    if remote:
        runtime = memory.RUNTIME_BYTES
        processes = [
            ProcessMemory("trainer", {"baseline": base, "runtime": runtime["stage_trainer"], **other})
        ]
        trainer_nodes = base_nodes + memory.TRAINER_DEFERRED_EXTRA * (nodes - base_nodes)
        processes[0].items["graph"] = trainer_nodes * node_bytes["stage_trainer"]
        for d, items in enumerate(devices):
            items["graph"] *= node_bytes["stage"]
            processes.append(
                ProcessMemory(f"stage {d}", {"baseline": base, "runtime": runtime["stage"], **items})
            )
        sent = [float(m * handoff)]
        sent += [float(m * handoff) * ((d < k - 1) + 1) for d in range(k)]
    else:
        total = {"baseline": base, "runtime": memory.RUNTIME_BYTES["in_process"], **other}
        for items in devices:
            items["graph"] *= node_bytes["in_process"]
            for key, value in items.items():
                total[key] = total.get(key, 0.0) + value
        if meshed:
            total["mesh"] = meshed["fixed_bytes"] + meshed["node_bytes"] * nodes
        elif costs.process_memory:  # calibrated in one process, the update's temporaries with it
            total["update"] = 0.0
            fitted = costs.process_memory
            total["calibrated"] = fitted["fixed_bytes"] + fitted["node_bytes"] * nodes
        if plan.replicas > 1:
            total["all_reduce"] = grad_bytes
        name = "process" if plan.replicas == 1 else "each replica"
        processes = [ProcessMemory(name, total)]
        r = plan.replicas
        sent = [2 * (r - 1) / r * grad_bytes] if r > 1 else [0.0]
    return Prediction(plan, step, sim.bubble, processes, sent)
