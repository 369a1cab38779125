"""torch.distributed.pipelining's schedule format: a CSV kept under tests/data loads, validates, runs
(the unpipelined gradients) and exports back identical; every schedule round-trips; the validator
names the first bad action."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe, torch_format
from layers.parallel.pipeline import schedule as ps
from params.errors import ConfigError

CSV = Path(__file__).resolve().parents[3] / "data" / "pipeline_schedule_k2_m4.csv"


def test_the_kept_csv_loads_validates_and_exports_back_identical():
    text = CSV.read_text()
    sched = torch_format.from_actions(torch_format.read_csv(text))
    assert (sched.num_devices, sched.num_stages, sched.num_micro_batches) == (2, 2, 4)
    assert torch_format.write_csv(torch_format.to_actions(sched, with_transfers=True)) == text
    # Rank 0 defers every weight gradient to the end: a schedule none of the built-in ones is.
    assert [op.kind for op in sched.orders[0][-4:]] == [ps.BACKWARD_WEIGHT] * 4


@pytest.mark.parametrize(
    "name, k, m, v",
    [(s, 2, 4, 1) for s in ps.SCHEDULES]
    + [("interleaved_1f1b", 2, 4, 2), ("zbv", 2, 4, 2), ("zbv", 4, 8, 2), ("dualpipe_v", 4, 8, 2)],
)
def test_every_schedule_round_trips(name, k, m, v):
    sched = ps.build(name, k, m, "never", v)
    for transfers in (False, True):
        rows = torch_format.to_actions(sched, with_transfers=transfers)
        back = torch_format.from_actions(torch_format.read_csv(torch_format.write_csv(rows)), name)
        assert back.orders == sched.orders and back.placement == sched.placement


@pytest.mark.parametrize(
    "rows, match",
    [
        ([["0B0", "0F0"]], r"rank 0, column 1 \(0B0\): a backward before its forward \(0F0\)"),
        ([["0F0", "0W0", "0I0"]], r"column 2 \(0W0\): a weight gradient before its input gradient"),
        (
            [["0F0", "0B0"], ["1RECV_F0", "1F0", "1B0"]],
            r"rank 1, column 1 \(1RECV_F0\): a receive with no send",
        ),
        (
            [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0"]],
            r"micro-batch 1 is missing on stage 1: no 1F1 on rank 1",
        ),
        (
            [["0F0", "0B0", "0F1", "0B1"], ["1F0", "1B0", "", "1F2", "1B2"]],
            r"rank 1, column 4 \(1F2\): micro-batch 2 is past the schedule's 2 \(0 to 1",
        ),
        (
            [["0F0", "1F0", "1B0"], ["1F1", "0F1"]],
            r"rank 1, column 1 \(1F1\): stage 1 runs on rank 0, not rank 1",
        ),
        (
            [["0F0", "1F0", "2F0", "2B0", "1B0", "0B0"], ["3F0", "3B0"]],
            r"each rank must hold 2 of the 4 stages; the ranks hold rank 0: \[0, 1, 2\], rank 1: \[3\]",
        ),
        ([["0F0", "0X0"]], r"rank 0, column 2: '0X0' is not an action TensorPipe runs"),
        ([["0F0", "0REDUCE_GRAD", "0B0"]], r"column 2 \(0REDUCE_GRAD\): stage 0's gradient reduction"),
        ([["0F0", "0B0", "0F0"]], r"column 3 \(0F0\): 0F0 runs twice"),
        ([["0F0", "0B0"], ["1B0", "1F0"]], r"rank 1, column 1 \(1B0\): a backward before its forward"),
        ([["0F0", "0B0", "0F1", "0B1"], ["1F1", "1B1", "1F0", "1B0"]], r"deadlock"),
    ],
)
def test_the_validator_names_the_first_bad_action(rows, match):
    with pytest.raises(ps.ScheduleError, match=match):
        torch_format.validate(rows)


def _layers():
    return [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=5, output_dim=5, activation="tanh")
        for i in range(3)
    ]


def _head(ctx, y, target):
    return tf.reduce_sum(tf.square(y - target), axis=-1)


# PyTorch's dumps end each stage with REDUCE_GRAD; its older form writes a split backward as B ... W.
_OLDER_FORM = (
    "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3,0W0,0W1,0W2,0W3,0REDUCE_GRAD\n"
    "1F0,1B0,1F1,1B1,1W0,1F2,1B2,1W1,1F3,1B3,1W2,1W3,1REDUCE_GRAD\n"
)


def test_reduce_grad_is_a_no_op_and_an_older_b_before_w_is_the_input_gradient():
    sched = torch_format.from_actions(torch_format.read_csv(_OLDER_FORM))
    assert [op.kind for op in sched.orders[0][4:8]] == [ps.BACKWARD_INPUT] * 4
    assert len(sched.orders[1]) == 12  # REDUCE_GRAD adds no unit
    full = torch_format.from_actions([["0F0", "0B0", "0REDUCE_GRAD"]])
    assert full.orders[0][1].kind == ps.BACKWARD  # a B with no W is a full backward


@pytest.mark.parametrize(
    "remat, text", [("never", None), ("always", None), ("never", _OLDER_FORM)], ids=["kept", "remat", "older"]
)
def test_a_schedule_file_named_in_params_runs_with_the_unpipelined_gradients(remat, text, tmp_path):
    path = CSV
    if text is not None:
        path = tmp_path / "older.csv"
        path.write_text(text)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(8, 5)).astype(np.float32))
    target = tf.constant(rng.normal(size=(8, 5)).astype(np.float32))

    def grads(**kw):
        pipe = gpipe.GPipeLayer.Params().set(name="net", layers=_layers(), **kw).instantiate()

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = (
                    tf.reduce_sum(pipe(FPropContext(training=True), x, head=_head, head_inputs=target)) / 8.0
                )
            return tape.gradient(loss, pipe.trainable_variables)

        return [g.numpy() for g in step()]

    got = grads(num_stages=2, num_micro_batches=4, remat=remat, schedule_file=str(path))
    want = grads(num_stages=1, num_micro_batches=1, remat="never")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_a_schedule_file_that_does_not_fit_the_layer_is_one_line():
    pipe = (
        gpipe.GPipeLayer.Params()
        .set(name="net", layers=_layers(), num_stages=2, num_micro_batches=2, schedule_file=str(CSV))
        .instantiate()
    )
    with pytest.raises(
        ConfigError,
        match=r"has 2 ranks, 2 stages and 4 micro-batches; the layer has 2 devices, 2 stages and 2",
    ):
        pipe.schedule_for(2)


# A V at K=2 (rank 0 holds stages 0 and 3, rank 1 stages 1 and 2), M=2, with PyTorch's DualPipeV
# cell that pairs a forward with a backward meant to overlap (run here one after the other).
_V = (
    "0F0,0F1,3F0,3B0,(3F1;0B0)OVERLAP_F_B,3B1,0B1,0REDUCE_GRAD,3REDUCE_GRAD\n"
    "1F0,2F0,1F1,2F1,2I0,1I0,2I1,1I1,2W0,1W0,2W1,1W1\n"
)


def _v_layers():
    return [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=5, output_dim=5, activation="tanh")
        for i in range(4)
    ]


def test_a_v_placement_is_read_from_the_rows_and_runs_each_stage_on_its_rank(tmp_path):
    sched = torch_format.from_actions(torch_format.read_csv(_V))
    assert sched.placement == (0, 1, 1, 0) and sched.virtual_stages == 2
    assert [sched.device_of(s) for s in range(4)] == [0, 1, 1, 0]
    rows = torch_format.to_actions(sched, with_transfers=True)
    assert "3RECV_F0" in rows[0] and "2SEND_F0" in rows[1] and "1SEND_B0" in rows[1]
    assert torch_format.from_actions(rows).orders == sched.orders
    path = tmp_path / "v.csv"
    path.write_text(_V)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(4, 5)).astype(np.float32))
    target = tf.constant(rng.normal(size=(4, 5)).astype(np.float32))

    def run(**kw):
        pipe = gpipe.GPipeLayer.Params().set(name="net", layers=_v_layers(), **kw).instantiate()

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(pipe(FPropContext(training=True), x, head=_head, head_inputs=target))
            return loss, tape.gradient(loss, pipe.trainable_variables)

        loss, grads = step()
        return pipe, loss.numpy(), [g.numpy() for g in grads]

    devices = ["/device:CPU:0", "/device:CPU:1"]
    pipe, loss, got = run(
        num_stages=2, virtual_stages=2, num_micro_batches=2, schedule_file=str(path), devices=devices
    )
    assert pipe.schedule_for(2).placement == (0, 1, 1, 0)
    assert f"schedule=file:{path}, virtual_stages=2" in pipe.partition_report()  # the schedule run
    assert pipe.schedule_for(2).name == f"file:{path}"
    assert [d[-5:] for d in pipe.stage_devices] == ["CPU:0", "CPU:1", "CPU:1", "CPU:0"]
    # Each stage's weights live on its rank's device: the first and last stage share CPU:0.
    where = {v.name.split(".")[1]: v.device[-5:] for v in pipe.trainable_variables}
    assert where == {"fc0": "CPU:0", "fc1": "CPU:1", "fc2": "CPU:1", "fc3": "CPU:0"}
    _, want_loss, want = run(num_stages=1, num_micro_batches=1)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5)
