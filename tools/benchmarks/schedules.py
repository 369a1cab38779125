"""Every pipeline schedule, measured and predicted: ``python -m tools.benchmark schedules [--quick]``.

One model for all: the gpipe benchmark's stack of dense layers (``--depth`` 8 layers of ``--width``
1024, relu, a global batch of ``--batch`` 4096 rows) as a GPipeLayer with K=2 schedule devices, M=8
micro-batches (``--quick``: 4), remat never, the squared error computed per micro-batch in the last
stage (a head, as the tasks do), trained by SGD. The width makes a unit's work (a stage's forward on
a micro-batch: about 20 ms on one core) large against what every unit and hand-off costs besides
(at width 512 the interleaved schedule's 16 more units and 32 more hand-offs per device cost about
as much as its smaller bubble saves).
Per schedule (fill_drain, one_f_one_b, one_f_one_b_split, interleaved_1f1b with virtual_stages=2,
zb_h1, zb_h2, and the V schedules zbv and dualpipe_v: 2K stages, device d holding stages d and
2K - 1 - d, so the last stage and the targets sit on device 0) one JSON line ``{"name": "schedule",
"schedule": ..., "step_s": ..., "predicted_step_s": ..., "peak_activation_bytes": ...,
"predicted_peak_activation_bytes": ...}``
(``value``: the step's relative prediction error; ``*_over_one_f_one_b``: the ratios the targets are
about; ``devices``: which of the two set-ups below measured it). A ratio's two sides differ only in
the schedule: every schedule runs in the same processes, on the same cores, in the same rounds.

``--devices=processes`` (the default; what a real pipeline is: a device cannot lend its compute or
its memory to another):

- The pipeline: one ``tf.distribute.Server`` process per schedule device (``remote.Pipeline``, as
  ``tools.benchmark remote``'s stage processes with ``--stage_cpus=own``), each pinned to its own
  core with 1 intra-op and 2 inter-op threads and the BFC allocator (``TF_CPU_ALLOCATOR_USE_BFC``),
  and a client process (on both cores) that builds the eight schedules' compiled steps with device
  d's stages (d, and d + K for interleaved, 2K - 1 - d for a V) on process d's ``CPU:0``, the batch
  on device 0 and the targets beside the last stage (device 1; device 0 for a V), made once, each
  SGD update on its variable's device. Stage processes answer ``reset`` / ``peak`` lines on stdin
  with their allocator's numbers (``remote.MemoryProbe``).
- ``step_s``: the client's call of the compiled step (forward, backward, update), best of
  ``--steps`` (20; the logical side's 5: a step needs both pinned cores at once, so other work on
  the machine delays more of its steps) rounds: one step of every schedule, the hand-off steps
  and the unit costs per round, so all see the same load (load only ever adds time).
- ``predicted_step_s``: ``layers.parallel.pipeline.simulator.simulate`` of the same schedule with
  unit costs measured in the same run (below), ``alone_speedup`` 1 (a stage owns its core and cannot
  borrow the other's) and ``transfer`` (``transfer_s``) the measured cost of one hand-off: the
  client's step moving a micro-batch's activation (batch / M rows of width) ``HANDOFF_HOPS`` times
  between the two stage processes (a multiplication by a scalar variable on each arrival), less the
  same step with every multiplication on device 0, over the hops.
- ``peak_activation_bytes``: the largest device's peak (``peak_activation_bytes_per_device``: each
  device's, read in its own stage process): the peak of the tensors alive during one step, replayed
  from the allocator's events (``tools.memory_trace.AllocatorTrace``, started by the ``reset`` line
  and stopped by the ``peak`` line: requested bytes, not the BFC allocator's chunks, which may be
  twice a tensor), minus the ``current`` bytes at the reset (weights, the batch or the targets);
  each device's median over ``--peak_steps`` (5) steps of each schedule, run in rounds after the
  timed ones (``peak_activation_bytes_per_step``: each step's, per device; ``allocator_peak_bytes``,
  ``resident_bytes``: the BFC allocator's peak and the resident bytes of the last round, per
  device). It includes the weight-gradient sums and the ops' temporaries, not only the activations.
  The peaks are read on stage processes of their own, started after the timed ones, whose devices
  run one op at a time (1 inter-op thread, ``PEAK_INTER_OP``; as an accelerator's compute stream
  runs its kernels in order): with two inter-op threads two ops of a unit may hold their outputs at
  once or not, and a device's peak moved by up to 4 MiB from one run to the next (the timed steps
  keep two: a receive waits beside the compute). Under ``--quick`` the peaks are the BFC
  allocator's, read on the timed processes.
- ``predicted_peak_activation_bytes``: the largest of the simulated step's per-device peaks
  (``predicted_peak_per_device_bytes``, ``process_peaks``): what the logical side's model holds
  (below), with what a stage process holds besides: the last stage's head keeps its output's
  difference to the target from the forward to the B or I (the square's gradient reads it), and the
  hand-offs are copies (``received_held_changes``): a stage's received input is
  held from the sender's forward's end plus ``transfer`` (TensorFlow starts a receive with the step,
  so it lands as soon as it is sent, not when the forward that reads it starts), and the gradient
  for a stage's output from the next stage's B or I end plus ``transfer`` to the end of the stage's
  own B or I. The backward's transients (a layer's output, activation and input gradients and its
  weight gradient before it is summed) are not modelled: measured, they add 2 to 3 MiB on every
  device of every schedule.
- Unit costs: timed by a worker of their own on one core (1 intra-op, 1 inter-op thread, the BFC
  allocator as the stage processes), as on the logical side below. ``--quick`` (a smoke test: two
  TensorFlow processes, as on the logical side): the client serves stage 0 itself (on stage 0's core
  and threads) and times the unit costs too; its figures mean nothing.

``--devices=logical`` (one process, K logical CPU devices sharing 2 cores):

Three worker processes (``tools/benchmarks/harness.py`` sets each up before TensorFlow starts): the
eight pipelines' steps (2 cores: 1 intra-op thread, 2 inter-op threads, 2 logical CPU devices), the
unit costs (1 core) and the peaks (the BFC allocator); under ``--quick`` two, the pipelines' worker
measuring the peaks too (its steps then use the BFC allocator).
The timed steps run in alternating rounds (one step of every side per round), so all see the same load; a
side's best step counts (load only ever adds time).

- ``step_s``: the compiled training step (forward, backward, update) of the schedule.
- ``predicted_step_s``: ``layers.parallel.pipeline.simulator.simulate`` of the same schedule, fed with unit
  costs measured in the same run on this machine. A unit's work is one stage (a chunk of depth / K
  layers; depth / (K v) for the interleaved schedule) on one micro-batch (batch / M rows), timed
  alone on one core (1 intra-op, 1 inter-op thread) as three compiled steps: the forward (F), the
  forward and what I computes (F + I: the gradient for the chunk's input, and the weight gradients
  of the layers whose W the executor does not defer on that stage, ``deferred_layers``), and the
  forward and every gradient (F + B). So F, I = (F + I) - F, B = (F + B) - F, W = B - I, F and B the
  same for every stage (the head's square is noise next to the matrix products), I and W per stage
  (``unit_costs_s``' ``backward_input_per_stage``, ``backward_weight_per_stage``).
  ``alone_speedup`` (a lone stage in the fill or drain uses the idle core too) is the widest chunk's
  F + B step on one core over the same step on the pipeline's two cores and threads. Hand-offs
  cost nothing (logical devices share memory).
- ``peak_activation_bytes``: a step's peak over what the process holds between steps, both from
  ``tf.config.experimental.get_memory_info("CPU:0")`` under ``TF_CPU_ALLOCATOR_USE_BFC=true``: the
  allocator's peak during one step (stats reset before it) minus its ``current`` bytes just before
  (weights, inputs, targets); the median over ``--peak_steps`` (5) steps of each schedule, run in
  rounds (every schedule's step in turn), since one step's peak moves by up to 2 MB with the order
  the two devices' threads run their ops in (``peak_activation_bytes_per_step``: each step's).
  TensorFlow's logical CPU devices share one allocator and report the same numbers for every device,
  so this is the whole process, both devices together; it includes the weight-gradient sums (the
  weights' size once the first backward of a stage has run) and the ops' temporaries, not only the
  activations.
- ``predicted_peak_activation_bytes``: the simulated step (above), every (stage, micro-batch)
  weighing what the executor counts its forward keeps for the backward (``layer_bytes``,
  ``held_bytes_per_micro_batch``: the stage's input, except the first stage's, a slice of the batch,
  and each layer's output) from its forward's start to the end of its last backward unit (B or W);
  under the split schedules, from the end of its I to the end of its W, what W reads instead
  (``held_bytes_input_to_weight``: each deferred layer's input and the gradient of its product, as
  many layers as the executor defers on that stage, ``deferred_layers_per_stage``); and each stage's
  weight-gradient sums (``sums_bytes``) from the end of its first B or W on. The most held at one
  instant, summed over both devices (as measured). ``predicted_peak_per_device_bytes``: each
  device's own peak (what the zero-bubble papers compare: ZB-H1 holds K micro-batches on every
  device, 1F1B K - d on device d; the executor defers on each device only as much W as keeps it
  within 1F1B's fullest device, ``schedule.weight_budgets``, so ZB-H1's largest per-device peak is
  1F1B's, while both devices together hold more; one_f_one_b_split holds 1F1B's K - d on device d,
  and after I a micro-batch weighs no more than after its forward, so both devices together hold no
  more than under 1F1B).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from tools.benchmarks import gpipe, harness, remote

NUM_DEVICES, NUM_MICRO_BATCHES = 2, 8
QUICK_MICRO_BATCHES = 4  # --quick: every schedule still has a steady phase at K=2, in half the graph
# (schedule, virtual_stages): every built-in schedule (the V ones with their two stages per device).
SCHEDULES = (
    ("fill_drain", 1),
    ("one_f_one_b", 1),
    ("one_f_one_b_split", 1),
    ("interleaved_1f1b", 2),
    ("zb_h1", 1),
    ("zb_h2", 1),
    ("zbv", 2),
    ("dualpipe_v", 2),
)
# A step's allocator peak depends on the order the two devices' threads run their ops in (up to 2 MB
# here from one step to the next): the median of this many steps' peaks counts, for every schedule.
PEAK_STEPS = 5
TARGET_ERROR = 0.15
DEVICES = ("processes", "logical")
# Timed rounds by default: a step over two pinned stage processes needs both cores at once, so other
# work on the machine delays more of its steps than the logical side's (the best step counts); and
# the gains asked of ZB-H1 at K=2 are about 2% of a step, so each side's best needs to be near its own.
STEPS = {"processes": 20, "logical": 5}
# --devices=processes: a hand-off's cost is a chain of this many hops of a micro-batch's activation
# between the two stage processes, less the same chain kept in stage 0's process, over the hops.
HANDOFF_HOPS = 16
# --devices=processes: the peaks are read on stage processes that run one op at a time (as an
# accelerator's compute stream runs its kernels in order): with two inter-op threads two ops of a
# unit may hold their outputs at once or not, and a device's peak moved by up to 4 MiB between runs.
PEAK_INTER_OP = 1


# ------------------------------------------------------------------------------------------ worker
def _chunk(spec: dict) -> tuple[Any, Any, Any]:
    """One stage's layers (``spec["depth"]`` of them) at the micro-batch size: model, input, target."""
    import tensorflow as tf

    from layers import core

    layers = [gpipe._dense_params(f"fc{i}", spec["width"], spec["activation"]) for i in range(spec["depth"])]
    model = core.SequentialLayer.Params().set(name="net", sub=layers).instantiate()
    shape = [spec["batch"], spec["width"]]
    return model, tf.random.stateless_normal(shape, [1, 2]), tf.random.stateless_normal(shape, [3, 4])


def _cost_step(spec: dict) -> Any:
    """A unit's cost: the chunk's forward, forward + input gradient, or forward + every gradient."""
    import tensorflow as tf

    from layers.base_layer import FPropContext

    model, x, target = _chunk(spec)
    # I also takes the weight gradients of the layers past the first ``deferred`` (the executor's
    # choice, ``deferred_layers``): their variables' names end the chunk's (net.fc<i>.w, net.fc<i>.b).
    variables = model.trainable_variables
    deferred = spec.get("deferred", spec["depth"])
    taken_by_input = [v for v in variables if int(v.name.split(".")[1][2:]) >= deferred]
    sources = {"forward": [], "input": [x, *taken_by_input], "gradients": [x, *variables]}[spec["step"]]

    @tf.function(autograph=False)
    def step() -> tf.Tensor:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tf.square(model(ctx, x) - target))
        if not sources:
            return loss
        grads = tape.gradient(loss, sources)
        return tf.add_n([tf.reduce_sum(g[:1]) for g in grads])  # every gradient, fetched cheaply

    return step


def _steps(spec: dict) -> dict[str, Any]:
    """The worker's compiled steps by name: each schedule's training step (``pipelines``, ``memory``)
    or each unit cost step (``costs``; ``alone`` too in ``pipelines``)."""
    harness.configure(spec)
    if spec["side"] == "costs":
        return {name: _cost_step({**spec, **unit}) for name, unit in spec["units"].items()}
    steps = {
        name: gpipe._dense_step({**spec, "model": "gpipe_head", "schedule": name, "virtual_stages": v})[0]
        for name, v in spec["schedules"]
    }
    if "alone" in spec:
        steps["alone"] = _cost_step({**spec, **spec["alone"]})
    return steps


def _handoff_steps(spec: dict, devices: list[str]) -> dict[str, Any]:
    """Two compiled steps of ``HANDOFF_HOPS`` multiplications each, by a scalar variable of the device
    that runs it, of a micro-batch's activation (``batch / micro_batches`` rows of ``width``) that
    starts on ``devices[0]``: ``handoff_moving`` runs them on devices 1, 0, 1, ..., 0 in turn (every
    hop a hand-off between the stage processes), ``handoff_staying`` all on device 0; their difference
    over the hops is a hand-off's cost. (A variable's scale: nothing for Grappler to fold away.)"""
    import tensorflow as tf

    rows = spec["batch"] // spec["micro_batches"]
    with tf.device(devices[0]):
        x = tf.Variable(tf.random.stateless_normal([rows, spec["width"]], [5, 6]))
    scales = []
    for device in devices[:2]:
        with tf.device(device):
            scales.append(tf.Variable(1.0))

    def chain(moving: bool) -> Any:
        @tf.function(autograph=False)
        def step() -> tf.Tensor:
            y = x.read_value()
            for hop in range(HANDOFF_HOPS):
                d = (hop + 1) % 2 if moving else 0
                with tf.device(devices[d]):
                    y = y * scales[d]
            with tf.device(devices[0]):
                return tf.reduce_sum(y[:1])

        return step

    return {"handoff_moving": chain(True), "handoff_staying": chain(False)}


def _client_steps(spec: dict, hosted: list[Any]) -> dict[str, Any]:
    """The client's compiled steps over the stage processes (``--devices=processes``): each schedule's
    training step, the two hand-off steps, and with ``units`` (``--quick``) the unit costs too, run in
    the client's own process. Appends to ``hosted`` the server of stage 0 when the client hosts it."""
    devices, server = remote.connect(spec)
    hosted.extend([server] if server is not None else [])
    steps = {
        name: remote.client_step({**spec, "schedule": name, "virtual_stages": v}, devices)[0]
        for name, v in spec["schedules"]
    }
    steps.update(_handoff_steps(spec, devices))
    for name, unit in spec.get("units", {}).items():
        steps[name] = _cost_step({**spec, **unit})
    return steps


def run_worker(spec: dict) -> int:
    """Builds every step (compiling each, then ``warmup`` more calls); a memory worker prints each
    schedule's peak and resident bytes, a timing worker answers each
    ``step NAME`` line on stdin with ``{"step_s": seconds}`` until stdin closes. A timing worker with
    ``peaks`` (``--quick``) also measures the peaks, as the memory worker would (after at least one
    more call of each step), and gives them in its ready line."""
    if spec.get("peaks"):
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow starts (_steps)
    hosted: list[Any] = []  # the server of stage 0, if this client hosts it: it lives as long as this
    steps = _client_steps(spec, hosted) if spec.get("client") else _steps(spec)
    for step in steps.values():
        for _ in range(1 + spec["warmup"]):
            step().numpy()
    if spec["measure"] == "memory":
        print(json.dumps(_peaks(steps, spec["peak_steps"])), flush=True)
        return 0
    ready: dict[str, Any] = {"ready": True}
    if spec.get("peaks"):
        for _ in range(1 - spec["warmup"]):
            for step in steps.values():
                step().numpy()
        ready["peaks"] = _peaks({name: steps[name] for name, _ in SCHEDULES}, spec["peak_steps"])
    print(json.dumps(ready), flush=True)
    probe = remote.MemoryProbe()  # stage 0's allocator, if this client hosts it
    for line in sys.stdin:
        word, _, name = line.strip().partition(" ")
        if hosted and word in remote.MEMORY_REQUESTS:
            print(json.dumps(probe.answer(word)), flush=True)
            continue
        if word != "step" or name not in steps:
            break
        print(json.dumps({"step_s": harness.timed(steps[name])}), flush=True)
    if spec.get("client"):
        remote.end_serving()
    return 0


def _peaks(steps: dict[str, Any], rounds: int) -> dict[str, dict]:
    """Each step's allocator peak and the bytes the process held just before it (of the last round),
    and ``held_bytes``: the peak over those bytes in each of ``rounds`` rounds (every schedule's step
    in turn)."""
    import tensorflow as tf

    out: dict[str, dict] = {}
    held: dict[str, list[int]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            resident = int(tf.config.experimental.get_memory_info("CPU:0")["current"])
            peak = harness.allocator_peak(step)
            held[name].append(peak - resident)
            out[name] = {"peak_bytes": peak, "resident_bytes": resident}
    for name, peaks in held.items():
        out[name]["held_bytes"] = peaks
    return out


# ------------------------------------------------------------------------------------------ driver
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark schedules", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--width", type=int, default=1024, help="Width of each dense layer.")
    parser.add_argument("--depth", type=int, default=8, help="Number of dense layers (a multiple of 4).")
    parser.add_argument("--batch", type=int, default=4096, help="Global batch (M=8 micro-batches of it).")
    parser.add_argument("--activation", default="relu", help="Activation of the dense layers.")
    harness.add_run_flags(
        parser,
        steps=None,  # STEPS[--devices]
        warmup=1,
        quick_help="Tiny sizes and few steps (a smoke test); two TensorFlow processes: under processes the "
        "client serves stage 0 and times the unit costs, under logical the pipelines' worker measures "
        "the peaks too.",
    )
    parser.add_argument(
        "--peak_steps",
        type=int,
        default=PEAK_STEPS,
        help="Steps whose allocator peak is read per schedule (in rounds); the median counts (per device "
        "under processes).",
    )
    parser.add_argument(
        "--devices",
        choices=DEVICES,
        default="processes",
        help="What a schedule device is: processes (default: a tf.distribute.Server process per device, "
        "each pinned to its own core, 1 intra-op and 2 inter-op threads, driven by a client process; "
        "peaks per device, read on stage processes of 1 inter-op thread, the largest counts) or logical "
        "(two logical CPU devices of one process "
        "sharing 2 cores; peaks of both devices together). --steps defaults to "
        f"{STEPS['processes']} under processes (a step needs both pinned cores at once, so other work "
        f"on the machine delays more of its steps), {STEPS['logical']} under logical.",
    )
    parser.add_argument("--verbose", action="store_true", help="Log each worker run to stderr.")
    args = parser.parse_args(argv)
    args.steps = STEPS[args.devices] if args.steps is None else args.steps
    if args.quick:
        args.width, args.depth, args.batch, args.steps, args.warmup = 16, 4, 32, 1, 0
        args.peak_steps = 1
    args.micro_batches = QUICK_MICRO_BATCHES if args.quick else NUM_MICRO_BATCHES
    if args.depth % (2 * NUM_DEVICES):
        parser.error(f"--depth must be a multiple of {2 * NUM_DEVICES} (K=2 devices x virtual_stages=2)")
    return args


def _total_held_peak(
    events: Any,
    weight: list[float],
    after_input: list[float] | None = None,
    sums: list[float] | None = None,
) -> float:
    """The most bytes held at one instant, summed over the devices (they share one allocator)."""
    from layers.parallel.pipeline import memory

    changes = []
    for row in memory.held_over_time(events, weight, after_input, sums):
        changes += _level_changes(row)
    return _peak_of(changes)


def _level_changes(steps: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A step function's (time, level) points as (time, change of level)."""
    changes, previous = [], 0.0
    for t, level in steps:
        changes.append((t, level - previous))
        previous = level
    return changes


def _peak_of(changes: list[tuple[float, float]]) -> float:
    """The highest level the (time, change) pairs reach from 0, a release before an acquire at one time."""
    level, peak = 0.0, 0.0
    for _, delta in sorted(changes, key=lambda c: (c[0], c[1])):
        level += delta
        peak = max(peak, level)
    return peak


def _units(args: argparse.Namespace) -> tuple[dict[str, dict], list[int]]:
    """The unit cost steps of every stage size the schedules cut (``cost_<depth>_forward``,
    ``cost_<depth>_gradients``, and per number of layers whose W is deferred on some stage,
    ``cost_<depth>_input_<deferred>``), and those sizes (layers per stage), smallest first."""
    from layers.parallel.pipeline import schedule as schedules

    k, m = NUM_DEVICES, args.micro_batches
    rows = args.batch // m
    units: dict[str, dict] = {}
    for name, v in SCHEDULES:
        depth = args.depth // (k * v)
        for step in ("forward", "gradients"):
            units[f"cost_{depth}_{step}"] = {"depth": depth, "batch": rows, "step": step}
        split = name in schedules.SPLIT_BACKWARD
        for count in sorted(set(deferred_layers(name, depth, rows, args.width, m)) if split else ()):
            units[f"cost_{depth}_input_{count}"] = {
                "depth": depth, "batch": rows, "step": "input", "deferred": count
            }  # fmt: skip
    return units, sorted({args.depth // (k * v) for _, v in SCHEDULES})


def measure(args: argparse.Namespace, cpus: list[int]) -> dict[str, Any]:
    """Every side, on the devices ``--devices`` names."""
    if args.devices == "logical":
        return _measure_logical(args, cpus)
    return _measure_processes(args, cpus)


def _measure_logical(args: argparse.Namespace, cpus: list[int]) -> dict[str, Any]:
    """Every side: the schedules' steps and peaks, the units' costs and held bytes. Three workers:
    the pipelines (2 cores), the unit costs (1 core), the peaks (the BFC allocator)."""
    k, m = NUM_DEVICES, args.micro_batches
    model = {"width": args.width, "activation": args.activation, "warmup": args.warmup}
    units, chunks = _units(args)
    pipelines = {
        **model, "side": "pipelines", "depth": args.depth, "batch": args.batch, "stages": k,
        "micro_batches": m, "remat": "never", "schedules": SCHEDULES, "cpus": cpus[:2],
        "intra_op_threads": 1, "inter_op_threads": 2, "logical_devices": k, "measure": "time",
        "alone": units[f"cost_{chunks[-1]}_gradients"],
    }  # fmt: skip
    costs = {
        **model, "side": "costs", "units": units, "cpus": cpus[:1], "intra_op_threads": 1,
        "inter_op_threads": 1, "measure": "time",
    }  # fmt: skip
    memory = {
        **pipelines, "measure": "memory", "warmup": max(1, args.warmup), "batch": args.batch,
        "peak_steps": args.peak_steps,
    }  # fmt: skip
    memory.pop("alone")
    if args.quick:  # a smoke test: the pipelines' worker measures the peaks too (one TensorFlow start less)
        pipelines.update(peaks=True, peak_steps=args.peak_steps)
    if args.verbose:
        print(f"schedules benchmark: {json.dumps([pipelines, costs], sort_keys=True)}", file=sys.stderr)
    workers = {
        "pipelines": harness.Worker("schedules", pipelines),
        "costs": harness.Worker("schedules", costs),
    }
    times: dict[str, list[float]] = {}
    try:
        ready = {side: worker.read() for side, worker in workers.items()}
        names = [(workers["pipelines"], name) for name, _ in SCHEDULES] + [(workers["pipelines"], "alone")]
        names += [(workers["costs"], name) for name in units]
        for _ in range(args.steps):  # alternating rounds: every side sees the same load
            for worker, name in names:
                times.setdefault(name, []).append(worker.ask(f"step {name}")["step_s"])
    finally:
        for worker in workers.values():
            worker.close()
    best = {name: {"best": min(t), "median": statistics.median(t)} for name, t in times.items()}
    peaks = ready["pipelines"].get("peaks") or harness.run_once("schedules", memory, args.verbose)
    return {"times": best, "peaks": peaks, "chunks": chunks}


def _measure_processes(args: argparse.Namespace, cpus: list[int]) -> dict[str, Any]:
    """Every side with each schedule device a stage process of its own (``remote.Pipeline``: pinned to
    its own core, 1 intra-op and 2 inter-op threads, the BFC allocator) and a client process driving
    the eight schedules' steps and the hand-off steps; a worker for the unit costs (1 core, the BFC
    allocator too); under ``--quick`` the client times the unit costs itself. Then ``--peak_steps``
    rounds of every schedule's step on stage processes of one inter-op thread (``PEAK_INTER_OP``;
    under ``--quick`` the same processes), each stage process's allocator reset before it and read
    after."""
    k, m = NUM_DEVICES, args.micro_batches
    model = {"width": args.width, "activation": args.activation, "warmup": args.warmup}
    units, chunks = _units(args)
    client = {
        **model, "depth": args.depth, "batch": args.batch, "stages": k, "micro_batches": m,
        "remat": "never", "schedules": SCHEDULES, "cpus": cpus[:2], "intra_op_threads": 1,
        "inter_op_threads": 2, "measure": "time", "stage_peaks": True, "stage_cpus": "own",
    }  # fmt: skip
    costs = {
        **model, "side": "costs", "units": units, "cpus": cpus[:1], "intra_op_threads": 1,
        "inter_op_threads": 1, "measure": "time", "bfc_allocator": True,
    }  # fmt: skip
    if args.quick:  # a smoke test: the client times the units and serves stage 0 (two starts less)
        client.update(units=units, client_hosts_stage=True)
    if args.verbose:
        print(f"schedules benchmark: {json.dumps([client, costs], sort_keys=True)}", file=sys.stderr)
    times: dict[str, list[float]] = {}
    pipeline = remote.Pipeline(client, cpus, client="schedules")
    workers = {"client": pipeline.client}
    try:
        if not args.quick:
            workers["costs"] = harness.Worker("schedules", costs)
        for worker in workers.values():
            worker.read()  # ready
        names = [(pipeline.client, name) for name, _ in SCHEDULES]
        names += [(pipeline.client, "handoff_moving"), (pipeline.client, "handoff_staying")]
        names += [(workers.get("costs", pipeline.client), name) for name in units]
        for _ in range(args.steps):  # alternating rounds: every side sees the same load
            for worker, name in names:
                times.setdefault(name, []).append(worker.ask(f"step {name}")["step_s"])
        peaks = _peak_rounds(pipeline, args.peak_steps) if args.quick else {}
    finally:
        if "costs" in workers:
            workers["costs"].close()
        pipeline.close()
    if not args.quick:
        peak_client = {**client, "stage_inter_op_threads": PEAK_INTER_OP, "trace_allocations": True}
        pipeline = remote.Pipeline(peak_client, cpus, client="schedules")
        try:
            pipeline.client.read()  # ready
            peaks = _peak_rounds(pipeline, args.peak_steps)
        finally:
            pipeline.close()
    best = {name: {"best": min(t), "median": statistics.median(t)} for name, t in times.items()}
    return {"times": best, "peaks": peaks, "chunks": chunks}


def _peak_rounds(pipeline: Any, rounds: int) -> dict[str, dict]:
    """``rounds`` rounds of every schedule's step (in turn) on ``pipeline``, each stage process's
    allocator reset before the step and read after: per schedule, each step's peak over the bytes
    each device held before it (``held_bytes``), and the last round's peak and resident bytes."""
    held: dict[str, list[list[int]]] = {name: [] for name, _ in SCHEDULES}
    peaks: dict[str, dict] = {}
    for _ in range(rounds):
        for name, _ in SCHEDULES:
            before = pipeline.ask_stages("reset")
            pipeline.client.ask(f"step {name}")
            after = pipeline.ask_stages("peak")
            # The tensors' own peak where traced (``trace_allocations``), else the allocator's.
            held[name].append(
                [
                    a.get("live_peak_bytes", a["peak_bytes"]) - b["current_bytes"]
                    for a, b in zip(after, before)
                ]
            )
            peaks[name] = {
                "peak_bytes": [a["peak_bytes"] for a in after],
                "resident_bytes": [b["current_bytes"] for b in before],
            }
    for name, steps in held.items():
        peaks[name]["held_bytes"] = steps
    return peaks


def layer_bytes(depth: int, rows: int, width: int, stage: int) -> tuple[int, list[int]]:
    """What the executor counts for one (stage, micro-batch) of ``depth`` dense layers (float32, from
    the traced shapes): what its forward keeps for the backward, the stage's input and each layer's
    output (which the next layer's weight gradient and the relu's gradient read; a projection's
    pre-activation is not kept), and per layer what its W would hold from I to W, its input and the
    gradient of its product. The first stage's input is a slice of the batch, held anyway: it counts
    for neither."""
    unit = rows * width * 4
    free = 1 if stage == 0 else 0
    return (depth + 1 - free) * unit, [(2 - (free if i == 0 else 0)) * unit for i in range(depth)]


def deferred_layers(name: str, depth: int, rows: int, width: int, micro_batches: int) -> list[int]:
    """Per stage, how many of its first layers leave their weight gradient to W under schedule
    ``name`` at K=2 (the executor's rule: ``memory.weight_budgets`` and ``deferred_segments``); I
    takes the others'. Schedules without W units: none."""
    from layers.parallel.pipeline import memory
    from layers.parallel.pipeline import schedule as schedules

    v = 2 if name in schedules.V_SCHEDULES else 1
    if name not in schedules.SPLIT_BACKWARD:
        return [0] * NUM_DEVICES * v
    sizes = [layer_bytes(depth, rows, width, s) for s in range(NUM_DEVICES * v)]
    sched = schedules.build(name, NUM_DEVICES, micro_batches, virtual_stages=v)
    budgets = memory.weight_budgets(sched, [kept for kept, _ in sizes])
    return [memory.deferred_segments(b, layers) for b, (_, layers) in zip(budgets, sizes)]


def stage_weights(
    depth: int, rows: int, width: int, stages: int, deferred: list[int]
) -> tuple[list[float], list[float], list[float]]:
    """Per stage (``stages`` of ``depth`` layers): what a micro-batch weighs from its forward
    (``layer_bytes``), what it weighs from its I to its W (the reads of the ``deferred`` first layers
    of each stage, ``deferred_layers``; none without W units) and the weight-gradient sums
    (``held_over_time``'s weights)."""
    held, after_input = [], []
    for s in range(stages):
        kept, layers = layer_bytes(depth, rows, width, s)
        held.append(float(kept))
        after_input.append(float(sum(layers[: deferred[s]])) if deferred else 0.0)
    return held, after_input, [float(sums_bytes(depth, width))] * stages


def sums_bytes(depth: int, width: int) -> int:
    """The stage's weight-gradient sums over micro-batches (kernel and bias per layer, float32),
    alive from its first weight gradient to the update."""
    return depth * (width * width + width) * 4


def received_held_changes(evs: Any, boundary: float, transfer: float) -> list[list[tuple[float, float]]]:
    """Per device, (time, change) of what it holds beyond ``held_over_time`` when the hand-offs are
    copies between processes: a stage's input (``boundary`` bytes, a micro-batch's activation, counted
    from the stage's forward by ``layer_bytes``) is received, so held, from the sender's forward's end
    plus ``transfer`` (a receive waits for nothing on its own device; TensorFlow starts it with the
    step) to that forward's start; and the gradient for a stage's output (``boundary`` bytes) from the
    next stage's B (or I) end plus ``transfer`` to the end of the stage's own B (or I), which reads
    it. Hand-offs within a device (an interleaved stage to the next on the same device: none at K=2;
    a V's middle stages, K - 1 and K, on device K - 1)
    are not copies."""
    from layers.parallel.pipeline import schedule as schedules

    rows = max(e.row for e in evs) + 1
    unit = {(e.stage, e.micro_batch, e.kind): e for e in evs}
    changes: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
    for e in evs:
        if e.stage == 0:
            continue
        if e.kind == schedules.FORWARD:
            sender = unit[(e.stage - 1, e.micro_batch, schedules.FORWARD)]
            if sender.row != e.row:
                changes[e.row] += [(sender.end + transfer, boundary), (e.start, -boundary)]
        if e.kind in (schedules.BACKWARD, schedules.BACKWARD_INPUT):
            receiver = unit.get((e.stage - 1, e.micro_batch, e.kind))
            if receiver is not None and receiver.row != e.row:
                changes[receiver.row] += [(e.end + transfer, boundary), (receiver.end, -boundary)]
    return changes


def process_weights(
    weights: tuple[list[float], list[float], list[float]], boundary: float
) -> tuple[list[float], list[float], list[float]]:
    """The per-stage weights (held, after I, sums) as a stage process holds them: the last stage's
    head keeps the difference of its output and the target (the square's gradient reads it) from its
    forward to its B or I, ``boundary`` more (the executor does not count it: it has no weights)."""
    held, after_input, sums = (list(w) for w in weights)
    held[-1] += boundary
    return held, after_input, sums


def process_peaks(
    evs: Any,
    weights: tuple[list[float], list[float], list[float]],
    boundary: float,
    transfer: float,
) -> list[float]:
    """Per device, the most bytes held at once (``held_over_time`` with ``weights``: held, after I,
    sums) with the hand-offs' received copies (``received_held_changes``)."""
    from layers.parallel.pipeline import memory

    extra = received_held_changes(evs, boundary, transfer)
    out = []
    for row, steps in enumerate(memory.held_over_time(evs, *weights)):
        received = list(extra[row]) if row < len(extra) else []
        out.append(_peak_of(received + _level_changes(steps)))
    return out


def figures(args: argparse.Namespace, measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One figure per schedule (the fields of its JSON line, without the load average)."""
    from layers.parallel.pipeline import memory, simulator

    k, m = NUM_DEVICES, args.micro_batches
    times, peaks = measured["times"], measured["peaks"]
    processes = args.devices == "processes"
    widest = measured["chunks"][-1]
    if processes:  # a stage owns its core; a hand-off is a copy between the stage processes
        alone = 1.0
        moved = times["handoff_moving"]["best"] - times["handoff_staying"]["best"]
        transfer = max(0.0, moved / HANDOFF_HOPS)
    else:  # a lone stage borrows the idle core; a hand-off shares memory
        alone = max(1.0, times[f"cost_{widest}_gradients"]["best"] / times["alone"]["best"])
        transfer = 0.0
    boundary = float(args.batch // m * args.width * 4)  # a micro-batch's activation (or its gradient)
    out = []
    for name, v in SCHEDULES:
        depth = args.depth // (k * v)

        def best(step: str, depth: int = depth) -> float:
            return times[f"cost_{depth}_{step}"]["best"]

        forward = best("forward")
        backward = max(0.0, best("gradients") - forward)
        stages, rows = k * v, args.batch // m
        # Split schedules: I's cost depends on the layers it leaves to W, per stage.
        split = name in simulator.schedules.SPLIT_BACKWARD
        deferred = deferred_layers(name, depth, rows, args.width, m) if split else []
        backward_input = [min(backward, max(0.0, best(f"input_{c}") - forward)) for c in deferred]
        costs = simulator.StageCosts.given(
            [forward] * stages,
            [backward] * stages,
            transfer=transfer,
            alone_speedup=alone,
            backward_input=backward_input if split else None,
            backward_weight=[backward - b for b in backward_input] if split else None,
        )
        prediction = simulator.simulate(name, m, "never", costs, virtual_stages=v)
        step = times[name]["best"]
        weights = stage_weights(depth, rows, args.width, stages, deferred)
        if processes:
            per_step = peaks[name]["held_bytes"]  # per step, per device
            measured_per_device = [statistics.median(s[d] for s in per_step) for d in range(k)]
            peak = max(measured_per_device)
            per_device = process_peaks(
                prediction.events, process_weights(weights, boundary), boundary, transfer
            )
            predicted_peak = max(per_device)
            where: dict[str, Any] = {
                "peak_activation_bytes_per_device": [int(b) for b in measured_per_device],
                "transfer_s": round(transfer, 6),
            }
        else:
            peak = statistics.median(peaks[name]["held_bytes"])
            predicted_peak = _total_held_peak(prediction.events, *weights)
            per_device = memory.peak_held(prediction.events, *weights)
            where = {}
        out.append(
            {
                "name": "schedule",
                "value": simulator.relative_error(prediction.step_time, step),
                "schedule": name,
                "virtual_stages": v,
                "devices": args.devices,
                "step_s": round(step, 6),
                "predicted_step_s": round(prediction.step_time, 6),
                "peak_activation_bytes": int(peak),
                "predicted_peak_activation_bytes": int(predicted_peak),
                **where,
                "median_step_s": round(times[name]["median"], 6),
                "predicted_bubble": round(prediction.bubble, 4),
                "unit_costs_s": {
                    "forward": round(forward, 6),
                    "backward": round(backward, 6),
                    **(
                        {
                            "backward_input_per_stage": [round(b, 6) for b in backward_input],
                            "backward_weight_per_stage": [round(backward - b, 6) for b in backward_input],
                        }
                        if split
                        else {}
                    ),
                },
                "alone_speedup": round(alone, 4),
                "deferred_layers_per_stage": deferred,
                "held_bytes_per_micro_batch": [int(b) for b in weights[0]],
                "held_bytes_input_to_weight": [int(b) for b in weights[1]],
                "gradient_sums_bytes_per_stage": int(weights[2][0]),
                "predicted_peak_per_device_bytes": [int(b) for b in per_device],
                "peak_activation_bytes_per_step": peaks[name]["held_bytes"],
                "allocator_peak_bytes": peaks[name]["peak_bytes"],
                "resident_bytes": peaks[name]["resident_bytes"],
                "target_error": TARGET_ERROR,
                "stages": k,
                "micro_batches": m,
                "remat": "never",
                "width": args.width,
                "depth": args.depth,
                "global_batch": args.batch,
            }
        )
    reference = next(f for f in out if f["schedule"] == "one_f_one_b")
    for f in out:
        f["step_over_one_f_one_b"] = round(f["step_s"] / reference["step_s"], 4)
        f["peak_over_one_f_one_b"] = round(
            f["peak_activation_bytes"] / max(1, reference["peak_activation_bytes"]), 4
        )
    return out


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.worker is not None:
        return run_worker(json.loads(args.worker))
    cpus = harness.usable_cpus("schedules")
    for figure in figures(args, measure(args, cpus)):
        name, value = figure.pop("name"), figure.pop("value")
        harness.emit(name, value, **figure)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
