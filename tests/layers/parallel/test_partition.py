"""Cutting layers into stages: uniform cuts, the balanced cut against brute force, the cost estimates
the balanced cut uses (parameters, traced FLOPs, measured time) and the cut GPipeLayer picks from them."""

import itertools

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from layers import core
from layers.base_layer import BaseLayer
from layers.parallel import partition
from layers.parallel.pipeline import gpipe
from params.errors import ConfigError


def _brute_force_best(costs, num_stages):
    n = len(costs)
    best = float("inf")
    for inner in itertools.combinations(range(1, n), num_stages - 1):
        bounds = [0, *inner, n]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
    return best


def _is_valid_cut(bounds, n, num_stages):
    return (
        len(bounds) == num_stages + 1
        and bounds[0] == 0
        and bounds[-1] == n
        and all(a < b for a, b in zip(bounds[:-1], bounds[1:]))
    )


@given(
    costs=st.lists(st.floats(min_value=0.0, max_value=1e3, allow_nan=False), min_size=1, max_size=9),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_balanced_cut_equals_brute_force_optimum(costs, data):
    num_stages = data.draw(st.integers(min_value=1, max_value=len(costs)))
    bounds = partition.balanced_bounds(costs, num_stages)
    assert _is_valid_cut(bounds, len(costs), num_stages)
    got = max(partition.stage_sums(costs, bounds))
    want = _brute_force_best(costs, num_stages)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def test_balanced_cut_examples():
    assert partition.balanced_bounds([10, 1, 1, 1, 1], 2) == [0, 1, 5]
    assert partition.balanced_bounds([1, 1, 1, 1, 10], 2) == [0, 4, 5]
    assert partition.balanced_bounds([1, 2, 3, 4, 5, 6], 3) == [0, 3, 5, 6]
    assert partition.balanced_bounds([0, 0, 0], 3) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "n, k, want",
    [
        (4, 1, [0, 4]),
        (4, 2, [0, 2, 4]),
        (7, 4, [0, 2, 4, 6, 7]),
        (5, 5, [0, 1, 2, 3, 4, 5]),
        (10, 3, [0, 4, 7, 10]),
    ],
)
def test_uniform_cut(n, k, want):
    assert partition.uniform_bounds(n, k) == want


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: partition.uniform_bounds(3, 4), r"num_stages=4 but there are only 3 layers"),
        (lambda: partition.balanced_bounds([1.0, 2.0], 3), r"num_stages=3 but there are only 2 layers"),
        (lambda: partition.balanced_bounds([1.0, -2.0], 2), r"layer costs must be finite and >= 0"),
        (lambda: partition.uniform_bounds(3, 0), r"num_stages must be >= 1, got 0"),
        (lambda: partition.bounds_from_split_points([3, 1], 4), r"split_points must be strictly increasing"),
    ],
)
def test_bad_cuts(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


# ------------------------------------------------------------------------------------------ costs
def _projection(name, i, o, act="none"):
    return core.ProjectionLayer.Params().set(name=name, input_dim=i, output_dim=o, activation=act)


def test_flops_of_a_projection_count_its_multiply_adds():
    layer = _projection("fc", 64, 32, act="relu").instantiate()
    (flops,) = partition.traced_flops([layer], tf.TensorSpec([16, 64]))
    matmul = 2 * 16 * 64 * 32
    elementwise = 2 * 16 * 32  # bias add and relu
    assert flops == matmul + elementwise


def test_flops_of_a_convolution_and_shapes_flow_through_the_stack():
    conv = core.Conv2DLayer.Params().set(name="conv", filter_shape=[3, 3, 2, 4]).instantiate()
    pool = core.PoolingLayer.Params().set(name="pool").instantiate()
    flat = core.FlattenLayer.Params().set(name="flat").instantiate()
    fc = _projection("fc", 4 * 4 * 4, 10).instantiate()
    flops = partition.traced_flops([conv, pool, flat, fc], tf.TensorSpec([None, 8, 8, 2]))
    assert flops[0] == 2 * (8 * 8 * 4) * (3 * 3 * 2) + 8 * 8 * 4  # conv + bias
    assert flops[1] == 4 * 4 * 4 * 4  # 2x2 max over each output
    assert flops[2] == 0
    assert flops[3] == 2 * 64 * 10 + 10  # the batch dimension counts as 1


def test_measured_seconds_rank_a_big_layer_above_small_ones():
    # 256 times the multiply-adds (256x2048 against 2048x1 on 256 rows), so that a burst of other
    # work on a shared machine during two of the repeats cannot reverse the order.
    big = _projection("big", 256, 2048).instantiate()
    small = _projection("small", 2048, 1).instantiate()
    seconds = partition.measured_seconds([big, small], tf.TensorSpec([256, 256]), repeats=5)
    assert all(s > 0 for s in seconds)
    assert seconds[0] > seconds[1]


# ---------------------------------------------------------------------------- GPipeLayer's cut
def _uneven_layers():
    # fc0 costs about as much as the three others together (by parameters and by FLOPs).
    return [
        _projection("fc0", 32, 96),
        _projection("fc1", 96, 8),
        _projection("fc2", 8, 8),
        _projection("fc3", 8, 8),
    ]


@pytest.mark.parametrize("method", ["params", "flops"])
def test_gpipe_balances_by_estimated_cost(method):
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=_uneven_layers(), num_stages=2, partition_method=method, input_shape=[None, 32]
    )
    pipe = p.instantiate()
    assert pipe.stage_bounds == [0, 1, 4]
    uniform = gpipe.GPipeLayer.Params().set(name="net", layers=_uneven_layers(), num_stages=2).instantiate()
    assert uniform.stage_bounds == [0, 2, 4]


def test_gpipe_balanced_layers_get_their_stage_device_and_same_weights():
    """Costed cuts build the layers twice (estimate, then on their device): weights are unchanged."""
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=_uneven_layers(), num_stages=2, partition_method="params"
    )
    pipe = p.instantiate()
    plain = core.SequentialLayer.Params().set(name="net", sub=_uneven_layers()).instantiate()
    assert pipe.stage_layers(1)[0].vars["w"].device.endswith("CPU:1")
    for got, want in zip(pipe.variables, plain.variables):
        assert got.name == want.name
        assert (got.numpy() == want.numpy()).all()


def test_split_points_override_the_method():
    p = gpipe.GPipeLayer.Params().set(name="net", layers=_uneven_layers(), split_points=[3])
    pipe = p.instantiate()
    assert pipe.num_stages == 2 and pipe.stage_bounds == [0, 3, 4]


def test_report_lists_costs_and_balance():
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=_uneven_layers(), num_stages=2, partition_method="flops", input_shape=[None, 32]
    )
    report = p.instantiate().partition_report()
    assert "partition_method=flops" in report
    assert "0 fc0" in report and "1-3 fc1,fc2,fc3" in report
    assert "flops: slowest stage / mean stage = " in report


class _ShapeRecorder(BaseLayer):
    """A projection whose batch sizes a test can record (by patching fprop)."""

    def __init__(self, params, parent=None):
        super().__init__(params, parent)
        self.create_child("fc", _projection("fc", 8, 8))

    def fprop(self, ctx, x):
        return self.fc(ctx, x)


def _recorders():
    return [_ShapeRecorder.Params().set(name=f"r{i}") for i in range(3)]


@pytest.mark.parametrize(
    "settings, micro",
    [
        ({"input_shape": [32, 8], "num_micro_batches": 4}, 8),
        ({"input_shape": [None, 8], "micro_batch_size": 2}, 2),
    ],
)
def test_measured_partitioning_times_each_layer_at_the_micro_batch_size(settings, micro, monkeypatch):
    pipe = gpipe.GPipeLayer.Params().set(
        name="net", layers=_recorders(), num_stages=2, partition_method="measured", **settings
    )
    # The estimate runs on throw-away copies of the layers: record on the class to see them.
    seen = []
    original = _ShapeRecorder.fprop

    def recording(self, ctx, x):
        seen.append(x.shape[0])
        return original(self, ctx, x)

    monkeypatch.setattr(_ShapeRecorder, "fprop", recording)
    pipe.instantiate()
    assert seen and set(seen) == {micro}


def test_measured_partitioning_needs_the_micro_batch_size():
    p = gpipe.GPipeLayer.Params().set(
        name="net", layers=_recorders(), num_stages=2, partition_method="measured", input_shape=[None, 8]
    )
    with pytest.raises(ConfigError, match=r"measured' times each layer at the micro-batch size"):
        p.instantiate()


def test_cut_is_the_one_partitioner_of_stages_and_blocks():
    asked = []

    def costs(method: str) -> list[float]:
        asked.append(method)
        return [1.0, 1.0, 1.0, 9.0]

    assert partition.cut(4, 2, [1], "flops", costs) == [0, 1, 4]  # split points win
    assert partition.cut(4, 2, [], "uniform", costs) == [0, 2, 4]
    assert asked == []  # no estimate unless the cut balances a cost
    assert partition.cut(4, 2, [], "params", costs) == [0, 3, 4]
    assert asked == ["params"]
    with pytest.raises(ConfigError):
        partition.cut(2, 3, [], "flops", costs)
    assert asked == ["params"]  # the counts are checked before any estimate
