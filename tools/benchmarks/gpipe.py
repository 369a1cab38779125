"""GPipe figures as JSON lines: ``python -m tools.benchmark gpipe [--quick] [--figures=a,b]``.

The speed figures train a stack of balanced, compute-bound dense layers with plain SGD at a fixed
global batch. Each side of a ratio runs in its own subprocess (``python -m tools.benchmarks.gpipe
--worker=JSON``), which pins its CPUs and sets its thread counts, allocator and logical devices before
TensorFlow starts. The sides of a figure are started together, warmed up, then step in alternating
rounds, so all see the same machine load; the best step of each side counts (load only adds time).
"Plain" is the stack without a GPipe layer and without re-materialization. Under ``--quick`` (a smoke
test) the timed sides with the same process settings share one worker process.

- speedup (remat never and always): the plain stack on one core (affinity + 1 intra-op thread) over
  the K=2, M=8 pipeline with one core per device (2 cores, 1 intra-op thread per op, 2 inter-op
  threads). Theory 2M/(M+K-1) = 1.78 for never; always recomputes each forward (4 units of work
  against 3), so 1.78 * 3/4 = 1.33.
- op_parallel_control: the plain stack on one core over the plain stack with the pipeline's thread
  settings on its two cores: how much of the speedup TensorFlow gets without any pipelining
  (independent ops, e.g. a layer's input and weight gradients, run on both cores).
- vs_same_cores: the plain stack given both of the pipeline's cores (TensorFlow's default threads)
  over the pipeline, for information: on a shared-memory CPU host, whether pipelining pays at all.
- remat_time: the K=2, M=8 pipeline's step, remat always over never.
- overhead: the layer's own machinery on paths it takes: K=1, M=1, remat=always over the plain stack
  wrapped in TensorFlow's ``tf.recompute_grad``; K=1, M=4, remat=never over the plain stack run on 4
  micro-batches, one gradient tape each, gradients summed (one core each).
- scaling: K in {2, 4, 8} at M = 4K, one core per stage, as per-device efficiency: the speedup over
  the plain stack on one core divided by its theory KM/(M+K-1). A K needs K cores (else a
  ``skipped`` line); K=2 reuses the speedup run's sides (M=8).
- memory: a task's real pipelined training step: ``lm.synthetic.GPipeTransformerLM`` (K=2, M=8
  (``--memory_micro_batches``; 2 under ``--quick``), remat always, the loss in the last stage)
  through the trainer's ``TrainStep`` (its while loop, op determinism on), over the same task with
  ``stack.pipeline = None`` through the same step function.
  Sizes: 8 layers of width 128, FFN 512, 4 heads, sequences of 128 tokens, batch 64, so activations
  outweigh the weights (reported). The figure is the BFC allocator's peak (logical CPU devices share
  it, so this is the process peak); ``live_tensor_ratio`` compares the tensors' own peaks in another,
  traced step (``tools/memory_trace.py``).
- remat_memory: the same task pipelined, remat always over never.
- one_f_one_b_time: the speed figures' stack as a K=2 pipeline (remat never, one core per device),
  its loss computed per micro-batch in the last stage (a head), at M=8 and M=16: the 1F1B step over
  the fill-drain step (target 1.05: the same bubble, so about the same time).
- simulator: the relative error of ``layers.parallel.pipeline.simulator``'s prediction of those K=2 steps
  (both schedules, M in {4, 8, 16}; target 0.10). Its costs are measured in the same run: one stage's
  layers alone on one core, one micro-batch, forward and forward+backward (no update), with no
  hand-off cost; and ``alone_speedup``, that forward+backward on one core over the same on the
  pipeline's two cores and threads (a lone stage, in the fill and drain, uses the idle core too). The
  last stage's head and the split, join and update are not in the model.
- one_f_one_b_memory: the same pipelines' BFC peak, 1F1B over fill-drain, at M=8 and M=16 (target
  0.6 at M=8): a stage holds K - k micro-batches' activations instead of M. Its stack is narrower and
  its batch larger (16 layers of width 512, batch 8192), so activations outweigh the weights, as in
  the models pipelines are for; the inputs, targets, weights and gradients (reported) are on both
  sides.
- bubble (not in the default set): idle fraction of the K=2 pipeline for each M: 1 - T1(M) /
  (K * T2(M)), with T1(M) the same micro-batched work on one core and T2(M) the pipeline's step;
  theory (K-1)/(M+K-1), which assumes a stage never uses more than its own core.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tools.benchmarks import harness

SPEED_FIGURES = ("speedup", "op_parallel_control", "vs_same_cores", "remat_time")  # one shared run
MEMORY_FIGURES = ("memory", "remat_memory")  # _memory_figures: a peak per side, each side measured once
SCHEDULE_FIGURES = ("one_f_one_b_time", "simulator", "one_f_one_b_memory")  # _schedule_figures
FIGURES = (*SPEED_FIGURES, "overhead", "scaling", *MEMORY_FIGURES, *SCHEDULE_FIGURES, "bubble")
DEFAULT_FIGURES = tuple(f for f in FIGURES if f != "bubble")
BUBBLE_MICRO_BATCHES = (1, 2, 4, 8, 16)
SCHEDULE_MICRO_BATCHES = (4, 8, 16)  # the simulator's; the 1F1B figures report 8 and 16 (--quick: 4, 8)
SCALING_STAGES = (2, 4, 8)


# ------------------------------------------------------------------------------------------ worker
def _dense_params(name: str, width: int, activation: str) -> Any:
    from layers import core

    return core.ProjectionLayer.Params().set(
        name=name, input_dim=width, output_dim=width, activation=activation
    )


def _model(spec: dict) -> Any:
    """The dense stack: plain (also for plain_recompute and plain_micro) or as a GPipeLayer."""
    from layers import core
    from layers.parallel.pipeline import gpipe

    layers = [_dense_params(f"fc{i}", spec["width"], spec["activation"]) for i in range(spec["depth"])]
    if not spec["model"].startswith("gpipe"):
        return _instantiate(core.SequentialLayer.Params().set(name="net", sub=layers), spec)
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=layers, num_stages=spec["stages"], num_micro_batches=spec["micro_batches"]
    )
    schedule, virtual = spec.get("schedule", "fill_drain"), spec.get("virtual_stages", 1)
    return _instantiate(p.set(remat=spec["remat"], schedule=schedule, virtual_stages=virtual), spec)


def _instantiate(params: Any, spec: dict) -> Any:
    """The model of ``params``; under ``spec["precision"]`` (a ``task.precision`` policy other than
    float32) built as a task's child, so it computes in that policy's dtype over float32 weights."""
    policy = spec.get("precision", "float32")
    if policy == "float32":
        return params.instantiate()
    from tools.benchmarks.model_task import ModelTask

    return ModelTask.Params().set(name="task", precision=policy, model=params).instantiate().model


def _squared(tf: Any, y: Any, t: Any) -> Any:
    """``(y - t)**2`` in the targets' dtype, for the sums of the loss; a mixed precision model's
    difference in its own dtype (an activation the backward keeps, as the model's others)."""
    return tf.cast(tf.square(y - tf.cast(t, y.dtype)), t.dtype)


def _dense_step(spec: dict) -> tuple[Any, Any]:
    """The dense stack's compiled training step (squared error, SGD)."""
    tf = harness.configure(spec)
    from layers.base_layer import FPropContext

    model = _model(spec)
    shape = [spec["batch"], spec["width"]]
    x = tf.random.stateless_normal(shape, [1, 2])
    target = tf.random.stateless_normal(shape, [3, 4])
    variables = model.trainable_variables
    kind = spec["model"]

    def loss_of(y: Any, t: Any) -> Any:
        return tf.reduce_mean(_squared(tf, y, t))

    def squared_errors(ctx: Any, y: Any, t: Any) -> Any:
        return tf.reduce_sum(_squared(tf, y, t), axis=-1)

    if spec.get("step") in ("forward", "gradients"):  # a stage's costs: no update
        return _cost_step(spec, model, x, target, squared_errors), variables

    @tf.function(autograph=False)
    def step() -> tf.Tensor:
        ctx = FPropContext(training=True)
        if kind == "gpipe_head":  # the loss in the last stage, per micro-batch (as the tasks do)
            with tf.GradientTape() as tape:
                per_example = model(ctx, x, head=squared_errors, head_inputs=target)
                loss = tf.reduce_sum(per_example) / float(spec["batch"] * spec["width"])
            grads = tape.gradient(loss, variables)
        elif kind == "plain_micro":
            # Gradient accumulation by hand: one tape per micro-batch, gradients summed.
            m = spec["micro_batches"]
            grads, loss = None, 0.0
            for i, (xm, tm) in enumerate(zip(tf.split(x, m), tf.split(target, m))):
                with tf.GradientTape() as tape:
                    part = loss_of(model(ctx.for_micro_batch(i), xm), tm) / m
                g = tape.gradient(part, variables)
                grads = g if grads is None else [a + b for a, b in zip(grads, g)]
                loss += part
        else:
            with tf.GradientTape() as tape:
                if kind == "plain_recompute":
                    y = tf.recompute_grad(lambda x: model(ctx, x))(x)
                else:
                    y = model(ctx, x)
                loss = loss_of(y, target)
            grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            v.assign_sub(0.01 * g)
        return loss

    return step, variables


def _cost_step(spec: dict, model: Any, x: Any, target: Any, head: Any) -> Any:
    """One micro-batch through the plain stack: the forward alone, or forward and backward (the
    weight and input gradients; no update): what a stage costs the simulator."""
    import tensorflow as tf

    from layers.base_layer import FPropContext

    variables = model.trainable_variables

    @tf.function(autograph=False)
    def step() -> tf.Tensor:
        ctx = FPropContext(training=True)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(head(ctx, model(ctx, x), target))
        if spec["step"] == "forward":
            return loss
        grads = tape.gradient(loss, [x, *variables])
        return tf.add_n([tf.reduce_sum(g[:1]) for g in grads])  # every gradient, fetched cheaply

    return step


def _task_step(spec: dict) -> tuple[Any, Any]:
    """The LM task's training step as the trainer compiles it (TrainStep: a while loop of steps,
    op determinism on, like ``trainer.tf_settings.configure``)."""
    tf = harness.configure(spec)
    tf.config.experimental.enable_op_determinism()
    from tasks.lm.params.synthetic import GPipeTransformerLM
    from trainer.train_step import TrainStep

    exp = GPipeTransformerLM(
        num_stages=spec["stages"],
        num_micro_batches=spec["micro_batches"],
        remat=spec["remat"],
        num_layers=spec["depth"],
        model_dim=spec["width"],
        hidden_dim=4 * spec["width"],
        seq_length=spec["seq_length"],
        batch_size=spec["batch"],
        num_train_sequences=2 * spec["batch"],
        num_eval_sequences=spec["batch"],
    )
    task = exp.task()
    if spec["model"] == "task_plain":
        task.stack.pipeline = None
    train_step = TrainStep(task, exp.train())

    def step() -> Any:
        finite, _ = train_step.run(1)
        return finite

    return step, train_step.task.trainable_variables


def _step(spec: dict) -> tuple[Any, Any]:
    return (_task_step if spec["model"].startswith("task") else _dense_step)(spec)


def run_worker(spec: dict) -> int:
    """The worker: builds the step, then serves it (``harness.serve``); a memory side also reports the
    weights' bytes and the traced step's live-tensor peak; a worker of several sides (``--quick``:
    ``harness.interleaved``'s ``shared``) serves each side's step by name."""
    if "sides" in spec:
        return harness.serve_sides(spec, lambda side: _step(side)[0])
    step, variables = _step(spec)

    def memory() -> dict:
        from tools.memory_trace import live_tensor_peak

        traced = live_tensor_peak(lambda: step().numpy())
        return {
            "weight_bytes": int(sum(v.numpy().nbytes for v in variables)),
            "live_peak_bytes": traced["live_peak_bytes"],
            "traced_peak_bytes": traced["chunk_peak_bytes"],
            "resting_bytes": traced["resting_bytes"],
        }

    return harness.serve(spec, step, memory)


# ------------------------------------------------------------------------------------------ driver
def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.benchmark gpipe", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--figures",
        default=",".join(DEFAULT_FIGURES),
        help=f"Comma-separated subset of {FIGURES} (default: all but bubble).",
    )
    parser.add_argument("--width", type=int, default=1024, help="Width of each dense layer (speed figures).")
    parser.add_argument("--depth", type=int, default=16, help="Number of dense layers.")
    parser.add_argument(
        "--batch",
        type=int,
        default=4096,
        help="Global batch (speed figures); micro-batches of 512 rows keep "
        "oneDNN matmuls efficient (at 256 rows they lose ~15%%, which the speedup would pay for).",
    )
    parser.add_argument("--activation", default="relu", help="Activation of the dense layers.")
    parser.add_argument("--memory_width", type=int, default=128, help="Model width of the memory task.")
    parser.add_argument("--memory_layers", type=int, default=8, help="Transformer layers of the memory task.")
    parser.add_argument("--memory_seq_length", type=int, default=128, help="Sequence length, memory task.")
    parser.add_argument("--memory_batch", type=int, default=64, help="Global batch of the memory task.")
    parser.add_argument(
        "--memory_micro_batches", type=int, default=8, help="Micro-batches M of the memory task (--quick: 2)."
    )
    parser.add_argument(
        "--schedule_memory_width", type=int, default=512, help="Layer width of one_f_one_b_memory's stack."
    )
    parser.add_argument(
        "--schedule_memory_batch", type=int, default=8192, help="Global batch of one_f_one_b_memory."
    )
    harness.add_run_flags(parser, steps=4, warmup=1, quick_help=harness.SHARED_QUICK_HELP)
    parser.add_argument("--verbose", action="store_true", help="Log each worker run to stderr.")
    args = parser.parse_args(argv)
    if args.quick:
        args.width, args.depth, args.batch = 64, 8, 64
        args.memory_width, args.memory_layers, args.memory_seq_length, args.memory_batch = 16, 2, 16, 16
        args.memory_micro_batches = 2  # still micro-batched: half the graph of M=4
        args.schedule_memory_width, args.schedule_memory_batch = 64, 64
        # A smoke test: one timed round, no untimed step after the compiling one, and the schedule
        # figures at one reported M (M=16 runs the same code as M=8): each worker costs a TF start.
        args.steps, args.warmup = 1, 0
    args.schedule_micro_batches = SCHEDULE_MICRO_BATCHES[:2] if args.quick else SCHEDULE_MICRO_BATCHES
    return args


def _speed_figures(args: argparse.Namespace, figures: list[str], cpus: list[int]) -> None:
    k, m = 2, 8
    base = {
        "model": "plain", "width": args.width, "depth": args.depth, "batch": args.batch,
        "activation": args.activation, "stages": 1, "micro_batches": 1, "remat": "never",
        "measure": "time", "warmup": args.warmup,
    }  # fmt: skip
    one_core = {**base, "cpus": cpus[:1], "intra_op_threads": 1, "inter_op_threads": 1}
    two_cores = {**base, "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2}
    pipeline = {**two_cores, "model": "gpipe", "stages": k, "logical_devices": k, "micro_batches": m}
    sizes = {
        "width": args.width, "depth": args.depth, "global_batch": args.batch, "activation": args.activation,
    }  # fmt: skip

    def measure(**specs: dict) -> dict[str, dict]:
        return harness.interleaved("gpipe", specs, args.steps, args.verbose, shared=args.quick)

    def best(t: dict, name: str) -> float:
        return t[name]["best"]

    theory_never = 2 * m / (m + k - 1)
    if set(SPEED_FIGURES + ("scaling",)) & set(figures):
        t = measure(
            plain_one_core=one_core,
            pipeline_never=pipeline,
            pipeline_always={**pipeline, "remat": "always"},
            control=two_cores,
            same_cores={**base, "cpus": cpus[:2]},
        )
        plain = best(t, "plain_one_core")
        for remat, theory, target in (("never", theory_never, 1.6), ("always", theory_never * 0.75, 1.25)):
            pipe = best(t, f"pipeline_{remat}")
            if "speedup" in figures:
                harness.emit(
                    "speedup", plain / pipe, remat=remat, theory=round(theory, 4), target=target,
                    plain_one_core_step_s=plain, pipeline_step_s=pipe, stages=k, micro_batches=m,
                    median_ratio=round(t["plain_one_core"]["median"] / t[f"pipeline_{remat}"]["median"], 4),
                    **sizes,
                )  # fmt: skip
        if "op_parallel_control" in figures:
            control = best(t, "control")
            harness.emit(
                "op_parallel_control", plain / control, plain_one_core_step_s=plain,
                control_step_s=control, control_threads="1 intra-op, 2 inter-op on 2 cores",
                speedup_never_over_control=round(control / best(t, "pipeline_never"), 4), **sizes,
            )  # fmt: skip
        if "vs_same_cores" in figures:
            same = best(t, "same_cores")
            harness.emit(
                "vs_same_cores", same / best(t, "pipeline_never"), remat="never",
                remat_always_value=round(same / best(t, "pipeline_always"), 4), same_cores_step_s=same,
                pipeline_never_step_s=best(t, "pipeline_never"),
                pipeline_always_step_s=best(t, "pipeline_always"), cores=len(cpus[:2]), **sizes,
            )  # fmt: skip
        if "remat_time" in figures:
            always, never = best(t, "pipeline_always"), best(t, "pipeline_never")
            harness.emit(
                "remat_time", always / never, always_step_s=always, never_step_s=never, stages=k,
                micro_batches=m, **sizes,
            )  # fmt: skip
        if "scaling" in figures:
            _emit_scaling(k, m, plain, best(t, "pipeline_never"), sizes)
    if "scaling" in figures:
        for stages in SCALING_STAGES[1:]:
            micro = 4 * stages
            if len(cpus) < stages or args.depth < stages:
                print(
                    f"gpipe benchmark: scaling K={stages} skipped: it needs {stages} cores and layers, "
                    f"this process has {len(cpus)} cores and {args.depth} layers",
                    file=sys.stderr,
                )
                harness.emit("scaling", None, stages=stages, micro_batches=micro, skipped=True, **sizes)
                continue
            spec = {
                **pipeline, "cpus": cpus[:stages], "inter_op_threads": stages, "stages": stages,
                "logical_devices": stages, "micro_batches": micro,
            }  # fmt: skip
            t = measure(plain_one_core=one_core, pipeline=spec)
            _emit_scaling(stages, micro, best(t, "plain_one_core"), best(t, "pipeline"), sizes)
    if "overhead" in figures:
        t = measure(
            gpipe_remat={**one_core, "model": "gpipe", "remat": "always"},
            recompute_grad={**one_core, "model": "plain_recompute"},
            gpipe_micro={**one_core, "model": "gpipe", "micro_batches": 4},
            plain_micro={**one_core, "model": "plain_micro", "micro_batches": 4},
        )
        for side, reference, path in (
            ("gpipe_remat", "recompute_grad", "K=1, M=1, remat=always against tf.recompute_grad"),
            ("gpipe_micro", "plain_micro", "K=1, M=4, remat=never against 4 micro-batches, summed grads"),
        ):
            layer, plain = best(t, side), best(t, reference)
            harness.emit(
                "overhead", layer / plain, path=path, target=1.05, gpipe_step_s=layer,
                reference_step_s=plain, **sizes,
            )  # fmt: skip
    if "bubble" in figures:
        for micro in BUBBLE_MICRO_BATCHES:
            t = measure(
                one_core={**one_core, "model": "gpipe", "micro_batches": micro, "remat": "always"},
                pipeline={**pipeline, "micro_batches": micro, "remat": "always"},
            )
            busy, step = best(t, "one_core"), best(t, "pipeline")
            harness.emit(
                "bubble", 1.0 - busy / (k * step), theory=round((k - 1) / (micro + k - 1), 4), stages=k,
                micro_batches=micro, one_core_step_s=busy, pipeline_step_s=step, remat="always", **sizes,
            )  # fmt: skip


def _emit_scaling(stages: int, micro: int, plain: float, pipe: float, sizes: dict) -> None:
    theory = stages * micro / (micro + stages - 1)
    harness.emit(
        "scaling", plain / pipe / theory, stages=stages, micro_batches=micro, speedup=round(plain / pipe, 4),
        theory_speedup=round(theory, 4), plain_one_core_step_s=plain, pipeline_step_s=pipe,
        remat="never", **sizes,
    )  # fmt: skip


def _memory_figures(args: argparse.Namespace, figures: list[str], cpus: list[int]) -> None:
    k, m = 2, args.memory_micro_batches
    spec = {
        "model": "task", "width": args.memory_width, "depth": args.memory_layers,
        "seq_length": args.memory_seq_length, "batch": args.memory_batch, "stages": k,
        "micro_batches": m, "remat": "always", "measure": "memory", "warmup": args.warmup,
        "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2, "logical_devices": k,
    }  # fmt: skip
    sizes = {
        "task": "lm.synthetic.GPipeTransformerLM", "model_dim": args.memory_width,
        "hidden_dim": 4 * args.memory_width, "num_layers": args.memory_layers,
        "seq_length": args.memory_seq_length, "global_batch": args.memory_batch, "stages": k,
        "micro_batches": m,
    }  # fmt: skip
    peaks: dict[str, dict] = {}

    def peak(name: str, **changes: Any) -> dict:
        if name not in peaks:
            peaks[name] = harness.run_once("gpipe", {**spec, **changes}, args.verbose)
        return peaks[name]

    def emit(figure: str, sides: tuple[str, str], a: dict, b: dict, **details: Any) -> None:
        harness.emit(
            figure, a["peak_bytes"] / b["peak_bytes"],
            live_tensor_ratio=round(a["live_peak_bytes"] / b["live_peak_bytes"], 4),
            **{f"{side}_peak_bytes": x["peak_bytes"] for side, x in zip(sides, (a, b))},
            **{f"{side}_live_peak_bytes": x["live_peak_bytes"] for side, x in zip(sides, (a, b))},
            **{f"{side}_traced_peak_bytes": x["traced_peak_bytes"] for side, x in zip(sides, (a, b))},
            weight_bytes=a["weight_bytes"], **details, **sizes,
        )  # fmt: skip

    if "memory" in figures:
        emit(
            "memory", ("pipeline", "plain"), peak("always"),
            peak("plain", model="task_plain", stages=1, micro_batches=1, remat="never"), target=0.35,
            remat="always", loss="in the last stage, per micro-batch (the task's own fprop)",
            step="trainer.train_step.TrainStep (while loop, op determinism)",
        )  # fmt: skip
    if "remat_memory" in figures:
        emit("remat_memory", ("always", "never"), peak("always"), peak("never", remat="never"))


def _schedule_figures(args: argparse.Namespace, figures: list[str], cpus: list[int]) -> None:
    """1F1B against fill-drain on the speed figures' stack (K=2, remat never, the loss in the last
    stage, one core per device), and the simulator's prediction of those steps."""
    from layers.parallel.pipeline import simulator

    k = 2
    base = {
        "model": "gpipe_head", "width": args.width, "depth": args.depth, "batch": args.batch,
        "activation": args.activation, "stages": k, "remat": "never", "warmup": args.warmup,
        "cpus": cpus[:2], "intra_op_threads": 1, "inter_op_threads": 2, "logical_devices": k,
    }  # fmt: skip
    sizes = {
        "width": args.width, "depth": args.depth, "global_batch": args.batch, "activation": args.activation,
        "stages": k, "remat": "never", "loss": "in the last stage, per micro-batch",
    }  # fmt: skip
    all_micro_batches = args.schedule_micro_batches
    micro_batches = all_micro_batches if "simulator" in figures else all_micro_batches[1:]
    if {"one_f_one_b_time", "simulator"} & set(figures):
        specs = {
            f"{schedule}_m{m}": {**base, "measure": "time", "schedule": schedule, "micro_batches": m}
            for m in micro_batches
            for schedule in ("fill_drain", "one_f_one_b")
        }
        if "simulator" in figures:  # one stage's layers on one micro-batch, on one core
            stage = {
                **base, "model": "plain", "depth": args.depth // k, "cpus": cpus[:1], "inter_op_threads": 1,
                "logical_devices": 1, "stages": 1, "micro_batches": 1, "measure": "time",
            }  # fmt: skip
            for m in micro_batches:
                for step in ("forward", "gradients"):
                    specs[f"stage_{step}_m{m}"] = {**stage, "batch": args.batch // m, "step": step}
                # The same stage alone on the pipeline's cores and threads: how much faster a lone
                # stage works (in the fill and drain) when the other stage's core is idle.
                specs[f"stage_alone_m{m}"] = {
                    **specs[f"stage_gradients_m{m}"], "cpus": cpus[:2], "inter_op_threads": 2,
                }  # fmt: skip
        t = harness.interleaved("gpipe", specs, args.steps, args.verbose, shared=args.quick)
        for m in micro_batches:
            fill, one = t[f"fill_drain_m{m}"]["best"], t[f"one_f_one_b_m{m}"]["best"]
            if "one_f_one_b_time" in figures and m in all_micro_batches[1:]:
                harness.emit(
                    "one_f_one_b_time", one / fill, micro_batches=m, target=1.05, one_f_one_b_step_s=one,
                    fill_drain_step_s=fill, **sizes,
                )  # fmt: skip
            if "simulator" in figures:
                forward = t[f"stage_forward_m{m}"]["best"]
                backward = max(0.0, t[f"stage_gradients_m{m}"]["best"] - forward)
                alone = max(1.0, t[f"stage_gradients_m{m}"]["best"] / t[f"stage_alone_m{m}"]["best"])
                costs = simulator.StageCosts.given([forward] * k, [backward] * k, alone_speedup=alone)
                for schedule, measured in (("fill_drain", fill), ("one_f_one_b", one)):
                    predicted = simulator.simulate(schedule, m, "never", costs).step_time
                    harness.emit(
                        "simulator", simulator.relative_error(predicted, measured), schedule=schedule,
                        micro_batches=m, target=0.10, predicted_step_s=round(predicted, 6),
                        measured_step_s=measured, stage_forward_s=forward, stage_backward_s=backward,
                        alone_speedup=round(alone, 4),
                        costs="one stage's layers alone on one core, at the micro-batch size", **sizes,
                    )  # fmt: skip
    if "one_f_one_b_memory" in figures:
        width, batch = args.schedule_memory_width, args.schedule_memory_batch
        sizes = {**sizes, "width": width, "global_batch": batch}
        for m in all_micro_batches[1:]:
            memory = {**base, "measure": "memory", "micro_batches": m, "width": width, "batch": batch}
            peaks = {
                schedule: harness.run_once("gpipe", {**memory, "schedule": schedule}, args.verbose)
                for schedule in ("fill_drain", "one_f_one_b")
            }
            one, fill = peaks["one_f_one_b"], peaks["fill_drain"]
            harness.emit(
                "one_f_one_b_memory", one["peak_bytes"] / fill["peak_bytes"], micro_batches=m, target=0.6,
                live_tensor_ratio=round(one["live_peak_bytes"] / fill["live_peak_bytes"], 4),
                one_f_one_b_peak_bytes=one["peak_bytes"], fill_drain_peak_bytes=fill["peak_bytes"],
                weight_bytes=one["weight_bytes"], **sizes,
            )  # fmt: skip


def main(argv: list[str]) -> int:
    args = _parse(argv[1:])
    if args.worker is not None:
        return run_worker(json.loads(args.worker))
    figures = harness.chosen_figures("gpipe", args.figures, FIGURES)
    if figures is None:
        return 2
    cpus = harness.usable_cpus("gpipe")
    _speed_figures(args, figures, cpus)
    if set(MEMORY_FIGURES) & set(figures):
        _memory_figures(args, figures, cpus)
    if set(SCHEDULE_FIGURES) & set(figures):
        _schedule_figures(args, figures, cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
