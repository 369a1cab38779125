"""Files in PyTorch's schedule CSV format (written here by ``torch_schedules``, PyTorch's text) for
all seven of its schedule classes at 2 and 4 ranks, M=8: each loads as a ``schedule_file`` and runs
with the unpipelined model's loss and gradients (1e-5); an inconsistent file is refused at the bad
action, by its rank and column."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from layers import core
from layers.base_layer import FPropContext
from layers.parallel.pipeline import gpipe, torch_format
from params.errors import ConfigError
from tests.layers.parallel.pipeline import torch_schedules

M, WIDTH, DEPTH = 8, 3, 8  # 8 layers: one per stage at 4 ranks x 2 stages


def _layers() -> list:
    return [
        core.ProjectionLayer.Params().set(name=f"fc{i}", input_dim=WIDTH, output_dim=WIDTH, activation="tanh")
        for i in range(DEPTH)
    ]


def _data() -> tuple[tf.Tensor, tf.Tensor]:
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(M, WIDTH)).astype(np.float32))
    return x, tf.constant(rng.normal(size=(M, WIDTH)).astype(np.float32))


def _head(ctx, y, target):
    return tf.reduce_sum(tf.square(y - target), axis=-1)


def _run(**kw) -> tuple[float, list[np.ndarray]]:
    pipe = gpipe.GPipeLayer.Params().set(name="net", layers=_layers(), **kw).instantiate()
    x, target = _data()

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(pipe(FPropContext(training=True), x, head=_head, head_inputs=target))
        return loss, tape.gradient(loss, pipe.trainable_variables)

    loss, grads = step()
    return float(loss), [g.numpy() for g in grads]


@pytest.fixture(scope="module")
def unpipelined() -> tuple[float, list[np.ndarray]]:
    return _run(num_stages=1, num_micro_batches=1)


def test_the_writer_writes_pytorchs_text():
    text = torch_schedules.dump_csv(torch_schedules.actions("DualPipeV", 2, M))
    rows = text.split("\r\n")
    assert rows[-1] == "" and len(rows) == 3  # csv.writer's \r\n after each rank's row
    assert rows[0].startswith("0F0,0F1,0F2,3F0,3I0,3W0,") and rows[1].startswith(
        ",1F0,"
    )  # rank 1 idles first
    assert "(0F4;3B2)OVERLAP_F_B" in rows[0].split(",")
    assert torch_schedules.dump_csv(torch_schedules.actions("GPipe", 2, 2)) == (
        "0F0,0F1,0B0,0B1,0REDUCE_GRAD\r\n,1F0,1F1,1B0,1B1,1REDUCE_GRAD\r\n"
    )


@pytest.mark.parametrize("name", torch_schedules.CLASSES)
@pytest.mark.parametrize("k", [2, 4])
def test_every_class_loads_and_runs_with_the_unpipelined_gradients(name, k, unpipelined, tmp_path):
    v = torch_schedules.stages_per_rank(name)
    path = tmp_path / f"{name}_{k}.csv"
    path.write_text(torch_schedules.dump_csv(torch_schedules.actions(name, k, M)), newline="")
    sched = torch_format.from_actions(torch_format.read_csv(path.read_bytes().decode()))
    assert (sched.num_devices, sched.num_stages, sched.num_micro_batches) == (k, k * v, M)
    v_shaped = name in ("ZBVZeroBubble", "DualPipeV")
    assert [sched.device_of(s) for s in range(k * v)] == (
        [s if s < k else 2 * k - 1 - s for s in range(2 * k)] if v_shaped else [s % k for s in range(k * v)]
    )
    loss, got = _run(num_stages=k, virtual_stages=v, num_micro_batches=M, schedule_file=str(path))
    want_loss, want = unpipelined
    assert loss == pytest.approx(want_loss, abs=1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, err_msg=name)


def test_a_forward_of_a_micro_batch_past_m_is_refused_at_its_column(tmp_path):
    """DualPipeV at 2 ranks with rank 1's forward of micro-batch 7 on stage 1 written as 8: named by
    its rank and its 1-based column (PyTorch's idle cells count)."""
    rows = torch_schedules.actions("DualPipeV", 2, M)
    column = next(i for i, cell in enumerate(rows[1]) if cell and "1F7" in cell)
    rows[1][column] = rows[1][column].replace("1F7", "1F8")  # an OVERLAP_F_B cell's forward
    path = tmp_path / "bad.csv"
    path.write_text(torch_schedules.dump_csv(rows), newline="")
    p = gpipe.GPipeLayer.Params().set(
        name="net",
        layers=_layers(),
        num_stages=2,
        virtual_stages=2,
        num_micro_batches=M,
        schedule_file=str(path),
    )
    with pytest.raises(
        ConfigError,
        match=rf"rank 1, column {column + 1} \(1F8\): micro-batch 8 is past the schedule's 8 \(0 to 7",
    ):
        p.instantiate().schedule_for(M)
