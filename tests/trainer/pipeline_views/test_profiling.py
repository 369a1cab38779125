"""--mode=profile_pipeline: a measured picture of a real pipelined step, and its simulation."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import tensorflow as tf
from PIL import Image

from layers.parallel.pipeline import schedule as ps
from layers.parallel.pipeline import timeline as tl
from tests.trainer.runner import REPO, _env
from trainer.pipeline_views import profiling


def test_pipeline_events_group_ops_by_scope_and_kind():
    ops = [
        ("stage_0_micro_batch_0/conv/Conv2D:Conv2D", 1.0, 2.0),
        ("stage_0_micro_batch_0/bn/Mean:Mean", 2.0, 2.5),
        ("stage_0_micro_batch_0/conv/ReadVariableOp:ReadVariableOp", 0.0, 0.1),  # ignored: a read
        ("stage_1_micro_batch_0/dense/MatMul:_MklMatMul", 2.6, 3.0),
        ("stage_1_micro_batch_0_grad/recompute/dense/MatMul:_MklMatMul", 3.1, 3.4),
        ("gradient_tape/stage_1_micro_batch_0_grad/MatMul_1:_MklMatMul", 3.5, 4.0),
        ("gradient_tape/stage_1_micro_batch_0/stage_1_micro_batch_0_grad/MatMul:MatMul", 3.6, 3.9),
        ("gradient_tape/stage_1_micro_batch_0/IdentityN_grad/x:AddV2", 3.7, 3.8),
        ("stage_10_micro_batch_12/x:AddV2", 4.0, 4.5),
        ("loss/Sum:Sum", 4.0, 4.2),  # no pipeline scope
    ]
    evs = profiling.pipeline_events(ops)
    assert [(e.stage, e.micro_batch, e.kind, e.start, e.end) for e in evs] == [
        (0, 0, ps.FORWARD, 0.0, 1.5),
        (1, 0, ps.FORWARD, 1.6, 2.0),
        (1, 0, ps.RECOMPUTE, pytest.approx(2.1), pytest.approx(2.4)),
        (1, 0, ps.BACKWARD, 2.5, 3.0),
        (10, 12, ps.FORWARD, 3.0, 3.5),
    ]
    assert profiling.pipeline_events([("loss:Sum", 0.0, 1.0)]) == []


def test_split_kinds_make_i_and_w_boxes_of_their_own():
    """I and W share the tape's op names; the ops each unit created (recorded while tracing) tell
    them apart, so a W deferred long after its I does not stretch one backward box over both."""
    ops = [
        ("stage_0_micro_batch_0/dense/MatMul:MatMul", 0.0, 1.0),
        ("gradient_tape/stage_0_micro_batch_0/dense/MatMul/MatMul:MatMul", 1.0, 2.0),
        ("gradient_tape/stage_0_micro_batch_0/dense/MatMul/MatMul_1:MatMul", 5.0, 6.5),
    ]
    kinds = {
        "gradient_tape/stage_0_micro_batch_0/dense/MatMul/MatMul": ps.BACKWARD_INPUT,
        "gradient_tape/stage_0_micro_batch_0/dense/MatMul/MatMul_1": ps.BACKWARD_WEIGHT,
    }
    evs = profiling.pipeline_events(ops, kinds)
    assert [(e.kind, e.start, e.end) for e in evs] == [
        (ps.FORWARD, 0.0, 1.0),
        (ps.BACKWARD_INPUT, 1.0, 2.0),
        (ps.BACKWARD_WEIGHT, 5.0, 6.5),
    ]
    costs = profiling.measured_costs(evs, 1)
    assert (costs.backward, costs.backward_input, costs.backward_weight) == ((2.5,), (1.0,), (1.5,))
    assert [e.kind for e in profiling.pipeline_events(ops)] == [ps.FORWARD, ps.BACKWARD]


def test_measured_costs_are_per_stage_medians():
    evs = [
        tl.Event(0.0, 1.0, 0, 0, ps.FORWARD),
        tl.Event(1.0, 3.0, 0, 1, ps.FORWARD),
        tl.Event(3.0, 4.0, 0, 2, ps.FORWARD),
        tl.Event(4.0, 7.0, 1, 0, ps.BACKWARD),
    ]
    costs = profiling.measured_costs(evs, 2)
    assert costs.forward == (1.0, 0.0)
    assert costs.backward == (0.0, 3.0)
    assert costs.recompute == (0.0, 0.0)


def _trainer(logdir, model: str, override: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            f"--model={model}",
            f"--logdir={logdir}",
            "--mode=profile_pipeline",
            *([f"--params_override={override}"] if override else []),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_profile_pipeline_writes_pictures_json_and_image_summaries(tmp_path):
    logdir = tmp_path / "run"
    out = _trainer(logdir, "image.digits.GPipeConvNet")
    assert out.returncode == 0, out.stderr
    want = "profile_pipeline: image.digits.GPipeConvNet: K=2, M=4, remat=always, fill_drain: measured step"
    assert want in out.stdout
    for name in ("pipeline_step.png", "pipeline_step_simulated.png"):
        assert Image.open(logdir / name).size[0] == 1200
    record = json.loads((logdir / "pipeline_step.json").read_text())
    seen = {(e["stage"], e["micro_batch"], e["kind"]) for e in record["events"]}
    # remat=always: every (stage, micro-batch) has a forward, a recompute and a backward.
    assert seen == {(k, m, kind) for k in range(2) for m in range(4) for kind in ps.KINDS}
    starts = {(e["stage"], e["micro_batch"], e["kind"]): e["start"] for e in record["events"]}
    for m in range(4):  # the pipeline's order, as measured: stage 1 after stage 0 forward, before backward
        assert starts[(1, m, ps.FORWARD)] >= starts[(0, m, ps.FORWARD)]
        assert starts[(0, m, ps.BACKWARD)] >= starts[(1, m, ps.BACKWARD)]
    assert record["measured"]["step_time_s"] > 0
    assert record["simulated"]["schedule"] == "fill_drain"
    assert not (logdir / "train").exists()  # nothing trained, nothing saved

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir / "pipeline"), size_guidance={"tensors": 0})
    acc.Reload()
    assert set(acc.Tags()["tensors"]) == {"pipeline_step", "pipeline_step_simulated"}
    for tag in acc.Tags()["tensors"]:
        width, height, png = tf.make_ndarray(acc.Tensors(tag)[0].tensor_proto)
        assert Image.open(io.BytesIO(png)).size == (int(width), int(height))


@pytest.mark.slow
def test_profile_pipeline_shows_the_one_f_one_b_order(tmp_path):
    """The experiment's pipeline switched to 1F1B: the measured step runs each stage in that order
    (stage 0: F0 F1 then R/B 0, F2, ...) and the simulated step uses the same schedule."""
    logdir = tmp_path / "run"
    out = _trainer(logdir, "image.digits.GPipeConvNet", "task.body.sub[0].schedule : 'one_f_one_b'")
    assert out.returncode == 0, out.stderr
    record = json.loads((logdir / "pipeline_step.json").read_text())
    assert record["schedule"] == record["simulated"]["schedule"] == "one_f_one_b"
    for k, order in enumerate(ps.stage_orders("one_f_one_b", 2, 4, "always")):
        events = sorted((e for e in record["events"] if e["stage"] == k), key=lambda e: e["start"])
        assert [(e["kind"], e["micro_batch"]) for e in events] == [(op.kind, op.micro_batch) for op in order]


@pytest.mark.slow
def test_profile_pipeline_on_a_model_without_a_pipeline_is_one_line(tmp_path):
    out = _trainer(tmp_path / "run", "image.digits.ConvNet")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (
        "trainer: error: image.digits.ConvNet has no GPipe layer: --mode=profile_pipeline pictures a "
        "pipelined step (e.g. image.digits.GPipeConvNet)"
    )


@pytest.mark.slow
def test_profile_pipeline_of_zbv_boxes_i_and_w_apart_on_the_v(tmp_path):
    """ZB-V: four stages in a V on two devices (stage 3 beside stage 0), each I and W a box of its
    own, and the schedule named in the record as run."""
    logdir = tmp_path / "run"
    override = "task.body.sub[0].schedule : 'zbv'\ntask.body.sub[0].virtual_stages : 2"
    out = _trainer(logdir, "image.digits.GPipeConvNet", override)
    assert out.returncode == 0, out.stderr
    record = json.loads((logdir / "pipeline_step.json").read_text())
    assert record["schedule"] == record["simulated"]["schedule"] == "zbv"
    kinds = {e["kind"] for e in record["events"]}
    assert {ps.BACKWARD_INPUT, ps.BACKWARD_WEIGHT} <= kinds and ps.BACKWARD not in kinds
    assert {e["device"] for e in record["events"] if e["stage"] == 3} == {0}
