"""task.precision: float32 as it always was, mixed_bfloat16 (bfloat16 computation over float32
weights and slots, bfloat16 hand-offs between pipeline stages), mixed_float16 (loss scaling: a step
with non-finite gradients skipped, the scale lowered, in the checkpoint and the summaries)."""

from __future__ import annotations

import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

from layers import core, precision
from layers.base_layer import FPropContext
from params import experiment
from params.errors import ConfigError
from tasks.base_task import BaseTask
from tests.tasks.loop import evaluate
from tests.trainer import runner
from tests.trainer.remote_experiment import WIDTH, RandomRegressionInput
from trainer.train_step import TrainStep

STEPS = 150


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


def _trained(model: str, policy: str, steps: int = STEPS, gin: tuple = ()) -> TrainStep:
    root = experiment.resolve(model, gin_bindings=list(gin), params_override=f"task.precision : '{policy}'")
    step = TrainStep(root.task, root.input.train)
    finite, _ = step.run(steps)
    assert bool(finite)
    return step


@pytest.fixture(scope="module")
def convnets() -> dict[str, tuple[TrainStep, float]]:
    """The digits ConvNet trained STEPS steps under each policy, and its test accuracy (batch
    statistics that settle within those steps)."""
    out = {}
    for policy in ("float32", "mixed_bfloat16"):
        step = _trained("image.digits.ConvNet", policy, gin=("ConvNet.bn_decay = 0.9",))
        test = experiment.resolve("image.digits.ConvNet").input.test.instantiate()
        out[policy] = (step, evaluate(step.task, test.dataset())["accuracy"])
    return out


def test_float32_is_the_default_and_casts_nothing(convnets) -> None:
    step, _ = convnets["float32"]
    assert experiment.resolve("image.digits.ConvNet").task.precision == "float32"
    layers = [step.task, *step.task.submodules]
    assert not any(isinstance(layer, precision.CastWeights) for layer in layers)
    assert {layer.params.dtype for layer in layers if hasattr(layer, "params")} == {tf.float32}


def test_mixed_bfloat16_computes_in_bfloat16_over_float32_weights_and_slots(convnets) -> None:
    step, _ = convnets["mixed_bfloat16"]
    assert {v.dtype for v in step.task.variables} == {tf.float32}
    assert {v.dtype for v in step.learner.slot_variables()} == {tf.float32}
    batch = next(iter(step.input.dataset()))
    predictions = step.task.compute_predictions(FPropContext(training=False), batch)
    assert predictions["logits"].dtype == tf.bfloat16
    loss = step.task.compute_loss(FPropContext(training=False), predictions, batch)["loss"][0]
    assert loss.dtype == tf.float32


def test_mixed_bfloat16_reaches_float32s_test_accuracy(convnets) -> None:
    (_, f32), (_, bf16) = convnets["float32"], convnets["mixed_bfloat16"]
    assert f32 > 0.9
    print(f"test accuracy after {STEPS} steps: float32 {f32:.4f}, mixed_bfloat16 {bf16:.4f}")
    assert abs(bf16 - f32) <= 0.005, (f32, bf16)


def test_float32_checkpoint_restores_under_mixed_bfloat16_and_back(convnets, tmp_path) -> None:
    (f32, _), (bf16, _) = convnets["float32"], convnets["mixed_bfloat16"]
    back = experiment.resolve("image.digits.ConvNet").task.instantiate()  # a float32 task, untrained
    mixed = tf.train.Checkpoint(task=bf16.task).write(str(tmp_path / "mixed"))
    tf.train.Checkpoint(task=back).read(mixed).assert_existing_objects_matched()
    for a, b in zip(bf16.task.variables, back.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    path = tf.train.Checkpoint(task=f32.task).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(task=bf16.task).read(path).assert_existing_objects_matched()
    for a, b in zip(f32.task.variables, bf16.task.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_decoder_and_export_take_and_return_float32s_dtypes_under_mixed_bfloat16(convnets, tmp_path) -> None:
    """The decoder's outputs and the SavedModel's signature (images in, classes and probabilities
    out) have the same dtypes under mixed_bfloat16 as under float32, and agree on the classes."""
    root = experiment.resolve("image.digits.ConvNet")
    generator = root.input.test.instantiate()
    batch = next(iter(generator.dataset()))
    decoded, served = {}, {}
    for policy, (step, _) in convnets.items():
        out = step.task.decode(FPropContext(training=False), batch)
        decoded[policy] = {k: v.dtype for k, v in out.items()}
        module = tf.Module()
        module.task = step.task
        signature = step.task.inference(generator)["serving_default"]
        tf.saved_model.save(module, str(tmp_path / policy), signatures=signature.get_concrete_function())
        loaded = tf.saved_model.load(str(tmp_path / policy)).signatures["serving_default"]
        served[policy] = loaded(images=batch["image"])
    assert decoded["mixed_bfloat16"] == decoded["float32"], decoded
    (f32, bf16) = (served[p] for p in ("float32", "mixed_bfloat16"))
    assert {k: v.dtype for k, v in bf16.items()} == {k: v.dtype for k, v in f32.items()}
    assert f32["probabilities"].dtype == tf.float32
    assert np.mean(f32["classes"].numpy() == bf16["classes"].numpy()) >= 0.9


def _gpipe_step() -> TrainStep:
    root = experiment.resolve(
        "image.digits.GPipeConvNet", params_override="task.precision : 'mixed_bfloat16'"
    )
    step = TrainStep(root.task, root.input.train)
    assert bool(step.run(3)[0])
    return step


@pytest.fixture(scope="module")
def gpipe_step() -> TrainStep:
    """The digits GPipeConvNet (K=2, M=4) trained 3 steps under mixed_bfloat16."""
    return _gpipe_step()


def _step_ops(step: TrainStep) -> list[tf.Operation]:
    """Every op of the traced step, its functions' included."""
    ops, graphs = [], [step.step_graph()]
    while graphs:
        graph = graphs.pop()
        graphs.extend(f.graph for f in graph._functions.values() if hasattr(f, "graph"))
        ops += graph.get_operations()
    return ops


def test_gpipe_hands_bfloat16_between_stages(gpipe_step) -> None:
    """Every float tensor a stage's forward hands to the next device is bfloat16."""

    def index(op: tf.Operation) -> int | None:
        return tf.DeviceSpec.from_string(op.device).device_index if op.device else None

    handed = []
    for op in _step_ops(gpipe_step):
        for x in op.inputs:
            src, dst = index(x.op), index(op)
            if x.op.name.startswith("stage_0_micro_batch") and None not in (src, dst) and src != dst:
                handed.append(x.dtype)
    assert len(handed) == 4 and set(handed) == {tf.bfloat16}  # one per micro-batch


def test_gpipe_casts_each_weight_once_a_step_and_trains_as_casting_at_use(gpipe_step, monkeypatch) -> None:
    """A pipelined step casts each float32 weight to bfloat16 once (not once per micro-batch, which
    the schedule would keep M times), and trains to the same weights as a cast at every use."""

    def read_source(t: tf.Tensor) -> tf.Operation:
        while t.op.type in ("StopGradient", "Identity"):
            t = t.op.inputs[0]
        return t.op

    casts = [
        op
        for op in _step_ops(gpipe_step)
        if op.type == "Cast" and op.get_attr("DstT") == tf.bfloat16
        and read_source(op.inputs[0]).type == "ReadVariableOp"
    ]  # fmt: skip
    handles = {read_source(op.inputs[0]).inputs[0].name for op in casts}
    assert len(handles) >= 4 and len(casts) == len(handles), [op.name for op in casts]  # one per weight
    monkeypatch.setattr(precision.SharedCasts, "read", lambda self, var, dtype: tf.cast(var, dtype))
    at_use = _gpipe_step()
    for a, b in zip(gpipe_step.task.trainable_variables, at_use.task.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=a.name)


def test_mixed_float16_skips_a_step_with_infinite_gradients_and_lowers_the_scale() -> None:
    root = experiment.resolve("image.digits.ConvNet", params_override="task.precision : 'mixed_float16'")
    step = TrainStep(root.task, root.input.train)
    before = [v.numpy() for v in step.task.trainable_variables]
    step.loss_scale.scale.assign(3e38)  # the scaled loss overflows: every gradient is Inf or NaN
    finite, outputs = step.run(1)
    assert bool(finite) and int(step.global_step.numpy()) == 1
    assert float(outputs["learner"]["skipped_steps"]) == 1.0
    assert float(outputs["learner"]["loss_scale"]) == pytest.approx(1.5e38)
    for a, v in zip(before, step.task.trainable_variables):
        np.testing.assert_array_equal(a, v.numpy())
    assert {v.dtype for v in step.learner.slot_variables()} == {tf.float32}
    step.loss_scale.scale.assign(2.0**20)
    assert bool(step.run(30)[0])  # the scale comes down to where gradients are finite and it trains
    assert float(step.loss_scale.scale.numpy()) < 2.0**20
    assert any(not np.array_equal(a, v.numpy()) for a, v in zip(before, step.task.trainable_variables))


@pytest.mark.slow
def test_mixed_float16_loss_scale_in_the_checkpoint_and_summaries(tmp_path) -> None:
    logdir = tmp_path / "run"
    override = (
        "task.precision : 'mixed_float16'; task.train.max_steps : 20; task.train.warmup_steps : 5; "
        "task.train.summary_interval_steps : 10; task.train.save_interval_steps : 20"
    )
    result = runner.run_command(
        [
            sys.executable,
            "-m",
            "trainer",
            "--model=image.digits.ConvNet",
            f"--logdir={logdir}",
            f"--params_override={override}",
            "--job=controller,trainer",
        ]
    )
    assert result.returncode == 0, result.stderr[-2000:]
    scalars = runner.read_scalars(logdir / "train")
    assert set(scalars["loss_scale"]) == {10, 20} and scalars["loss_scale"][20] > 1.0
    assert "skipped_steps" in scalars
    saved = runner.read_checkpoint(str(logdir / "train" / "ckpt-20"))
    names = [name for name in saved if "loss_scale" in name]
    assert any("scale" in n and saved[n] == scalars["loss_scale"][20] for n in names), names


def test_an_unknown_policy_is_one_config_error() -> None:
    root = experiment.resolve("image.digits.ConvNet", params_override="task.precision : 'float8'")
    with pytest.raises(ConfigError, match="task.precision: expected float32 or mixed_bfloat16"):
        root.task.instantiate()


@pytest.mark.slow
def test_mixed_bfloat16_lm_dev_loss_within_two_percent_of_float32s() -> None:
    model = "lm.synthetic.TransformerLM"
    losses = {}
    for policy in ("float32", "mixed_bfloat16"):
        step = _trained(model, policy, steps=60)
        dev = experiment.resolve(model).input.dev.instantiate()
        losses[policy] = evaluate(step.task, dev.dataset())["loss"]
    assert losses["mixed_bfloat16"] == pytest.approx(losses["float32"], rel=0.02), losses


# ------------------------------------------------------------------------------ every placement kind
LM_KNOBS = (
    "model_dim = 16",
    "hidden_dim = 32",
    "num_heads = 2",
    "batch_size = 8",
    "seq_length = 8",
    "num_layers = 2",
    "num_train_sequences = 64",
    "warmup_steps = 2",
    "max_steps = 40",
)
PLACED_STEPS = 8


def _lm(model: str, policy: str, *knobs: str):
    name = model.rsplit(".", 1)[1]
    bindings = [f"{name}.{k}" for k in (*LM_KNOBS, *knobs)]
    return experiment.resolve(model, gin_bindings=bindings, params_override=f"task.precision : '{policy}'")


def _placed_step(kind: str, policy: str) -> TrainStep:
    """A tiny experiment's TrainStep in placement ``kind`` under ``policy``."""
    from trainer.distributed import mesh_placement

    if kind == "stage_processes":  # RemoteStages' step, its stages on this process's devices
        from trainer.distributed import remote_stages

        class StagesHere(remote_stages.RemoteStages):
            def build_task(self, task_params):
                return task_params.instantiate()

        root = experiment.resolve(
            "tests.trainer.remote_experiment.PipelinedRegression",
            gin_bindings=["PipelinedRegression.num_stages = 2"],
            params_override=f"task.precision : '{policy}'",
        )
        cluster = remote_stages.stage_cluster(
            root.cluster.copy().set(stage_job="worker"), "worker=127.0.0.1:1"
        )
        return TrainStep(experiment.task_params_for(root, "train"), root.input.train, StagesHere(cluster))
    model, knobs = {
        "mesh": ("lm.synthetic.MeshTransformerLM", ("num_layers = 1",)),
        "pipeline_x_mesh": ("lm.synthetic.StageMeshTransformerLM", ("num_stages = 2",)),
        "local": ("lm.synthetic.LocalTransformerLM", ("num_blocks = 2",)),
    }[kind]
    root = _lm(model, policy, *knobs)
    return mesh_placement.make_train_step(
        root.cluster, experiment.task_params_for(root, "train"), root.input.train
    )


def _losses(step: TrainStep) -> tuple[float, float]:
    """The loss of the second step (the first whose every part has an input: local parallelism's
    blocks of two take their hand-off a step later) and of the last of PLACED_STEPS."""
    first = step.run(2)
    last = step.run(PLACED_STEPS - 2)
    assert bool(first[0]) and bool(last[0])
    return tuple(float(tf.convert_to_tensor(out["task"]["loss"]).numpy()) for _, out in (first, last))


@pytest.mark.parametrize("kind", ["mesh", "pipeline_x_mesh", "stage_processes", "local"])
def test_every_placement_trains_under_mixed_bfloat16_like_float32(kind) -> None:
    """A DTensor mesh, pipeline x mesh, stage processes (RemoteStages' step, its stages on this
    process's logical devices) and local parallelism: bfloat16 layers over float32 weights, the loss
    after a few steps within a fifth of float32's fall over those steps from float32's."""
    losses = {}
    for policy in ("float32", "mixed_bfloat16"):
        step = _placed_step(kind, policy)
        if policy == "mixed_bfloat16":
            dtypes = {layer.params.dtype for layer in step.task.submodules if hasattr(layer, "params")}
            assert tf.bfloat16 in dtypes and {v.dtype for v in step.task.trainable_variables} == {tf.float32}
        losses[policy] = _losses(step)
    print(f"{kind}: first and last loss of {PLACED_STEPS} steps {losses}")
    (first, last), (_, mixed) = losses["float32"], losses["mixed_bfloat16"]
    assert np.isfinite(mixed) and last < first
    # Trained as far as float32 (not left where it started): within a fifth of float32's progress.
    assert abs(mixed - last) <= 0.2 * (first - last), losses


# ---------------------------------------------------------------------------- float16's underflow
class _TinyLossRegression(BaseTask):
    """One projection of width 8 regressing a fixed function, its loss weighted by 1e-7: every
    gradient of the loss is below float16's smallest subnormal number (6e-8)."""

    def __init__(self, params, parent=None) -> None:
        super().__init__(params, parent)
        layer = core.ProjectionLayer.Params().set(input_dim=WIDTH, output_dim=WIDTH, activation="none")
        self.create_child("fc", layer)

    def compute_predictions(self, ctx: FPropContext, batch):
        return self.fc(ctx, batch["x"])

    def compute_loss(self, ctx: FPropContext, predictions, batch):
        error = tf.square(tf.cast(predictions, tf.float32) - batch["y"])
        return {"loss": (1e-7 * tf.reduce_mean(error), tf.constant(1.0))}


def _tiny_loss_step(policy: str) -> TrainStep:
    task = _TinyLossRegression.Params().set(name="task", precision=policy)
    task.train.set(optimizer="adam", lr_schedule="constant", learning_rate=0.01)
    return TrainStep(task, RandomRegressionInput.Params().set(name="train", batch_size=32))


@pytest.mark.parametrize("scaled", [False, True], ids=["scale_1", "dynamic_scale"])
def test_float16_gradients_underflow_without_loss_scaling_and_scaling_recovers_them(scaled) -> None:
    """mixed_float16 with the loss scale held at 1 (no scaling): the gradients round to zero in
    float16 and Adam's update is zero, weights unchanged; the dynamic scale (2^15) lifts them into
    float16's range and the same step moves every weight, as float32's does."""
    step = _tiny_loss_step("mixed_float16")
    if not scaled:
        step.loss_scale.scale.assign(1.0)
    before = [v.numpy() for v in step.task.trainable_variables]
    finite, outputs = step.run(3)
    assert bool(finite) and float(outputs["learner"]["skipped_steps"]) == 0.0
    moved = [not np.array_equal(a, v.numpy()) for a, v in zip(before, step.task.trainable_variables)]
    assert len(moved) == 2 and moved == [scaled, scaled], moved  # w and b
    if scaled:
        reference = _tiny_loss_step("float32")
        reference.run(3)
        for a, b in zip(reference.task.trainable_variables, step.task.trainable_variables):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2e-3)


@pytest.mark.parametrize(
    "kind, placement", [("mesh", "MeshPlacement"), ("stage_processes", "StagesHere")], ids=["mesh", "stages"]
)
def test_mixed_float16_beyond_one_process_is_one_config_error(kind, placement) -> None:
    with pytest.raises(ConfigError) as info:
        _placed_step(kind, "mixed_float16")
    assert str(info.value) == (
        f"task.precision 'mixed_float16' (loss scaling) runs in one process only, not under the "
        f"{placement} placement; use mixed_bfloat16"
    )
