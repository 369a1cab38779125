"""Predicts a pipelined step from per-stage costs: step time, bubble and micro-batches in flight.

The costs are one micro-batch's forward, backward and recompute time on each stage (seconds), and the
time to hand a micro-batch's activation or gradient to the next stage. They can come from a measured
step (time each stage alone at the micro-batch size), from the partition's FLOP counts and a device
speed, or be given by hand; ``simulate`` lays the schedule of ``layers.parallel.pipeline.schedule`` out with
them. The model assumes what the pipeline is built for: each stage owns its device, a stage runs one
op at a time, and nothing but the hand-offs is shared; except that with ``alone_speedup`` > 1 a stage
works that much faster while it is the only one busy, as on a CPU host whose logical devices share
the cores (a lone stage's independent ops spread over the idle ones, e.g. in the fill and drain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from layers.parallel.pipeline import memory, network, timeline
from layers.parallel.pipeline import schedule as schedules

DEFAULT_BACKWARD_RATIO = 2.0  # a dense layer's backward is two matmuls of its forward's size


@dataclasses.dataclass(frozen=True)
class StageCosts:
    """Per-stage durations (seconds) of one micro-batch's forward, backward and recompute."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    recompute: tuple[float, ...]
    transfer: float = 0.0
    # The backward split in two (zero-bubble schedules): input gradient and weight gradient. Empty:
    # half the backward each.
    backward_input: tuple[float, ...] = ()
    backward_weight: tuple[float, ...] = ()
    # How many times faster a stage works while no other stage is busy (1: each owns its device; more
    # where the stages' devices share cores, as logical CPU devices do).
    alone_speedup: float = 1.0

    def __post_init__(self) -> None:
        k = len(self.forward)
        if k == 0:
            raise ValueError("StageCosts needs at least one stage")
        if not self.backward_input:
            object.__setattr__(self, "backward_input", tuple(b / 2 for b in self.backward))
        if not self.backward_weight:
            object.__setattr__(self, "backward_weight", tuple(b / 2 for b in self.backward))
        for name in ("backward", "recompute", "backward_input", "backward_weight"):
            if len(getattr(self, name)) != k:
                raise ValueError(f"StageCosts.{name} has {len(getattr(self, name))} stages, forward {k}")
        for name in ("forward", "backward", "recompute", "backward_input", "backward_weight"):
            if any(not (c >= 0.0) for c in getattr(self, name)):
                raise ValueError(f"StageCosts.{name} must be >= 0 seconds, got {getattr(self, name)}")
        if not self.transfer >= 0.0:
            raise ValueError(f"StageCosts.transfer must be >= 0 seconds, got {self.transfer}")
        if not self.alone_speedup >= 1.0:
            raise ValueError(f"StageCosts.alone_speedup must be >= 1, got {self.alone_speedup}")

    @property
    def num_stages(self) -> int:
        return len(self.forward)

    @classmethod
    def given(
        cls,
        forward: Sequence[float],
        backward: Sequence[float] | None = None,
        recompute: Sequence[float] | None = None,
        transfer: float = 0.0,
        alone_speedup: float = 1.0,
        backward_input: Sequence[float] | None = None,
        backward_weight: Sequence[float] | None = None,
    ) -> StageCosts:
        """Costs by hand: backward defaults to 2x forward, recompute to the forward, the backward's
        input and weight halves to half the backward."""
        fwd = tuple(float(f) for f in forward)
        bwd = tuple(float(b) for b in backward) if backward is not None else tuple(
            DEFAULT_BACKWARD_RATIO * f for f in fwd
        )  # fmt: skip
        rec = tuple(float(r) for r in recompute) if recompute is not None else fwd
        b_in = tuple(float(b) for b in backward_input) if backward_input is not None else ()
        b_w = tuple(float(b) for b in backward_weight) if backward_weight is not None else ()
        return cls(fwd, bwd, rec, float(transfer), b_in, b_w, float(alone_speedup))

    @classmethod
    def from_flops(
        cls,
        flops: Sequence[float],
        flops_per_second: float,
        backward_ratio: float = DEFAULT_BACKWARD_RATIO,
        transfer: float = 0.0,
    ) -> StageCosts:
        """Costs from each stage's forward FLOPs for one micro-batch and the device's sustained speed."""
        if not flops_per_second > 0:
            raise ValueError(f"flops_per_second must be > 0, got {flops_per_second}")
        fwd = [f / flops_per_second for f in flops]
        return cls.given(fwd, [backward_ratio * f for f in fwd], fwd, transfer)

    def chunked(self, virtual_stages: int, placement: Sequence[int] = ()) -> StageCosts:
        """Each stage cut into ``virtual_stages`` chunks of equal cost (K costs -> K * v, in stage order
        d, d + K, ...: chunk c of device d is stage c K + d; or stage s on device ``placement[s]``,
        e.g. a V's ``schedule.v_placement``)."""
        if virtual_stages == 1:
            return self

        def spread(values: tuple[float, ...]) -> tuple[float, ...]:
            n = len(values)
            return tuple(
                values[placement[s] if placement else s % n] / virtual_stages
                for s in range(n * virtual_stages)
            )

        return StageCosts(
            spread(self.forward),
            spread(self.backward),
            spread(self.recompute),
            self.transfer,
            spread(self.backward_input),
            spread(self.backward_weight),
            self.alone_speedup,
        )

    def scaled(self, factor: float) -> StageCosts:
        """The same costs ``factor`` times slower (e.g. a micro-batch ``factor`` times bigger)."""
        return StageCosts(
            tuple(f * factor for f in self.forward),
            tuple(b * factor for b in self.backward),
            tuple(r * factor for r in self.recompute),
            self.transfer * factor,
            tuple(b * factor for b in self.backward_input),
            tuple(b * factor for b in self.backward_weight),
            self.alone_speedup,
        )


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A simulated step."""

    schedule: str
    num_stages: int
    num_micro_batches: int
    remat: str
    step_time: float
    bubble: float
    peak_in_flight: tuple[int, ...]
    events: tuple[timeline.Event, ...]
    virtual_stages: int = 1

    def summary(self) -> dict[str, Any]:
        """The figures, JSON-ready (no events)."""
        return {
            "schedule": self.schedule,
            "num_stages": self.num_stages,
            "num_micro_batches": self.num_micro_batches,
            "remat": self.remat,
            "step_time_s": self.step_time,
            "bubble": self.bubble,
            "virtual_stages": self.virtual_stages,
            # (K - 1) / (v M + K - 1) at equal stage costs; the zero-bubble schedules' depends on the
            # costs ((K - 1)(T_F + T_B - T_W) idle per device for ZB-H1; (K - 1)(T_F + T_B) for
            # one_f_one_b_split; T_B the input half): None.
            "theoretical_bubble": None
            if self.schedule in schedules.SPLIT_BACKWARD
            else timeline.theoretical_bubble(self.num_stages, self.num_micro_batches, self.virtual_stages),
            "peak_in_flight": list(self.peak_in_flight),
        }


def simulate(
    schedule: str | schedules.Schedule,
    num_micro_batches: int,
    remat: str,
    costs: StageCosts,
    virtual_stages: int = 1,
    link: network.Link | None = None,
    handoff_bytes: float = 0.0,
) -> Prediction:
    """Lays ``schedule`` (a name, or a built Schedule) out with ``costs``, one entry per stage: with
    virtual stages, K * v entries over ``costs.num_stages // virtual_stages`` devices. With ``link``,
    the devices are hosts joined by it: each hand-off of ``handoff_bytes`` costs its latency (plus
    ``costs.transfer``) and bytes / rate, one at a time on each direction (``network.timeline``)."""
    if isinstance(schedule, schedules.Schedule):
        sched = schedule
    else:
        if costs.num_stages % virtual_stages:
            raise ValueError(
                f"{costs.num_stages} stage costs cannot be spread over virtual_stages={virtual_stages}"
            )
        devices = costs.num_stages // virtual_stages
        sched = schedules.build(schedule, devices, num_micro_batches, remat, virtual_stages)
    cost = {
        schedules.FORWARD: costs.forward,
        schedules.BACKWARD: costs.backward,
        schedules.RECOMPUTE: costs.recompute,
        schedules.BACKWARD_INPUT: costs.backward_input,
        schedules.BACKWARD_WEIGHT: costs.backward_weight,
    }
    alone = [costs.alone_speedup] * sched.num_devices
    if link is None:
        evs = timeline.timeline(sched.orders, cost, costs.transfer, alone)
    else:
        if costs.alone_speedup != 1.0:
            raise ValueError("simulate: hosts joined by a link share no cores; alone_speedup must be 1")
        hosts = dataclasses.replace(link, latency_s=link.latency_s + costs.transfer)
        evs = network.timeline(sched.orders, cost, hosts, handoff_bytes)
    return Prediction(
        schedule=sched.name,
        num_stages=sched.num_devices,
        num_micro_batches=sched.num_micro_batches,
        remat=remat,
        step_time=timeline.step_time(evs),
        bubble=timeline.bubble(evs),
        peak_in_flight=tuple(memory.peak_in_flight(evs)),
        events=tuple(evs),
        virtual_stages=sched.virtual_stages,
    )


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    if not measured > 0:
        raise ValueError(f"measured must be > 0, got {measured}")
    return abs(predicted - measured) / measured
