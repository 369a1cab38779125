"""The plans the trainer accepts for a pipelined experiment on N processes, enumerated.

A plan places the experiment's GPipe stack (``Plan``):

    one_process      one stage (the whole stack) on the process's device, M micro-batches
    logical          K stages on K logical devices of one process (cluster.num_logical_cpu_devices)
    stage_processes  K stages in K stage processes (--mode=stages, cluster.stage_job) and a trainer
                     process: K + 1 processes, started by tools.local_cluster --stages=K
    pipeline_mesh    K stages, each on a mesh of S logical devices (stage_mesh_shape [S], the
                     'model' axis) in one process: the pipeline x mesh form

and runs ``replicas`` copies of an in-process plan as --mode=sync workers (each on batch / R of the
global batch). For every K: M from K up to the largest dividing the replica's batch (M from 1 at
K = 1), every schedule that applies (interleaved_1f1b with 2 chunks per device, when M is a multiple
of K and the layers allow 2K stages), every remat policy (except_last only where M > 1), and the cut
balancing the layers' measured forward + backward time at the micro-batch size. What the trainer
would refuse is never enumerated: a stage without a layer, a schedule and M that do not combine
(``schedule.check_combination``), a batch M does not divide, more logical devices than
``devices_per_process`` allows, a stage mesh over a model whose experiment does not shard (only an
experiment whose task already sets ``stage_layout_rules`` gets pipeline_mesh plans).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from trainer.planning.costs import ModelCosts
from trainer.planning.pipeline_api import partition, schedule

PLACEMENTS = ("one_process", "logical", "stage_processes", "pipeline_mesh")
REMATS = ("never", "except_last", "always")
INTERLEAVED_CHUNKS = 2


@dataclasses.dataclass(frozen=True)
class Plan:
    """One placement of the experiment (module doc)."""

    placement: str
    num_stages: int
    num_micro_batches: int
    schedule: str
    remat: str
    split_points: tuple[int, ...] = ()
    virtual_stages: int = 1
    replicas: int = 1
    stage_mesh: int = 1

    @property
    def processes(self) -> int:
        if self.placement == "stage_processes":
            return self.num_stages + 1
        return self.replicas

    @property
    def devices_per_process(self) -> int:
        if self.placement == "stage_processes":
            return 1
        return self.num_stages * self.stage_mesh

    def micro_batch(self, batch: int) -> int:
        return batch // self.replicas // self.num_micro_batches

    def name(self) -> str:
        where = {
            "one_process": "1 process",
            "logical": f"K={self.num_stages} on devices",
            "stage_processes": f"K={self.num_stages} stage processes",
            "pipeline_mesh": f"K={self.num_stages} x mesh {self.stage_mesh}",
        }[self.placement]
        reps = f" x{self.replicas} replicas" if self.replicas > 1 else ""
        chunks = f" v={self.virtual_stages}" if self.virtual_stages > 1 else ""
        return f"{where}{reps} M={self.num_micro_batches} {self.schedule}{chunks} remat={self.remat}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layer_cost(costs: ModelCosts, micro_batch: int) -> list[float]:
    """Each layer's forward + backward seconds at ``micro_batch`` (the cost the cuts balance)."""
    figures = costs.per_size[micro_batch]
    return [f + b for f, b in zip(figures["forward"], figures["backward"])]


def split_points(costs: ModelCosts, micro_batch: int, num_parts: int) -> tuple[int, ...]:
    """The balanced cut's split points (the first layer of parts 1..n-1)."""
    if num_parts == 1:
        return ()
    bounds = partition.balanced_bounds(layer_cost(costs, micro_batch), num_parts)
    return tuple(bounds[1:-1])


def micro_batch_sizes(batch: int, processes: int) -> list[int]:
    """Every micro-batch size some plan uses (the sizes whose costs are measured)."""
    sizes = set()
    for r in range(1, processes + 1):
        if batch % r == 0:
            sizes.update(batch // r // m for m in divisors(batch // r))
    return sorted(sizes)


def enumerate_plans(
    costs: ModelCosts,
    processes: int,
    devices_per_process: int = 0,
    stage_mesh: bool = False,
    max_replicas: int | None = None,
) -> Iterator[Plan]:
    """Every plan of module doc for ``processes`` processes; ``devices_per_process`` 0: any number
    of logical devices; ``stage_mesh``: the experiment shards its stages (pipeline_mesh plans);
    ``max_replicas``: at most that many replicas (None: ``processes``)."""
    batch, layers = costs.batch_size, costs.num_layers
    max_devices = devices_per_process or 2 * layers
    for replicas in range(1, (max_replicas or processes) + 1):
        if batch % replicas or replicas > processes:
            continue
        local = batch // replicas
        shapes = [("one_process", 1, 1)]
        shapes += [("logical", k, 1) for k in range(2, min(layers, max_devices) + 1)]
        if replicas == 1:
            shapes += [("stage_processes", k, 1) for k in range(2, min(layers, processes - 1) + 1)]
        if stage_mesh:
            shapes += [
                ("pipeline_mesh", k, s) for k in range(1, layers + 1) for s in (2, 4) if k * s <= max_devices
            ]
        for placement, k, mesh in shapes:
            for m in divisors(local):
                if m < k:
                    continue
                names = ("fill_drain",) if k == 1 else schedule.SCHEDULES
                for sched in names:
                    v = INTERLEAVED_CHUNKS if sched == "interleaved_1f1b" else 1
                    if sched == "interleaved_1f1b" and (k * v > layers or m % k):
                        continue
                    try:
                        schedule.check_combination(sched, k, m, v)
                    except ValueError:
                        continue
                    cut = split_points(costs, local // m, k * v)
                    for remat in REMATS:
                        if remat == "except_last" and m == 1:
                            continue
                        yield Plan(placement, k, m, sched, remat, cut, v, replicas, mesh)
