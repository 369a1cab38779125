"""Pipeline schedules as data: orders, dependencies, bubble and in-flight counts against the formulas."""

from __future__ import annotations

import itertools

import pytest

from layers.parallel.pipeline import memory as mem
from layers.parallel.pipeline import schedule as ps
from layers.parallel.pipeline import timeline as tl

GRID = list(itertools.product(ps.CLASSIC, ps.REMAT_POLICIES, (1, 2, 3, 4, 8), (1, 2, 4, 8, 16)))


@pytest.mark.parametrize("schedule,remat,k,m", GRID)
def test_every_op_runs_once_in_dependency_order(schedule, remat, k, m):
    evs = tl.events(schedule, k, m, remat)
    ops = [e.op for e in evs]
    assert len(ops) == len(set(ops))
    remat_of = ps.remat_micro_batches(remat, m)
    expected = {ps.Op(s, b, ps.FORWARD) for s in range(k) for b in range(m)}
    expected |= {ps.Op(s, b, ps.BACKWARD) for s in range(k) for b in range(m)}
    expected |= {ps.Op(s, b, ps.RECOMPUTE) for s in range(k) for b in range(m) if remat_of[b]}
    assert set(ops) == expected
    end = {e.op: e.end for e in evs}
    start = {e.op: e.start for e in evs}
    for s, b in itertools.product(range(k), range(m)):
        if s > 0:
            assert start[ps.Op(s, b, ps.FORWARD)] >= end[ps.Op(s - 1, b, ps.FORWARD)]
        grad_from = ps.Op(s + 1, b, ps.BACKWARD) if s < k - 1 else ps.Op(s, b, ps.FORWARD)
        assert start[ps.Op(s, b, ps.BACKWARD)] >= end[grad_from]
        if remat_of[b]:
            assert start[ps.Op(s, b, ps.RECOMPUTE)] >= end[grad_from]
            assert start[ps.Op(s, b, ps.BACKWARD)] >= end[ps.Op(s, b, ps.RECOMPUTE)]
    for s in range(k):  # one op at a time per stage
        mine = sorted((e for e in evs if e.stage == s), key=lambda e: e.start)
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("schedule,remat,k,m", [g for g in GRID if g[1] != "except_last"])
def test_bubble_is_the_closed_form_when_stages_cost_the_same(schedule, remat, k, m):
    evs = tl.events(schedule, k, m, remat)
    assert tl.bubble(evs) == pytest.approx(tl.theoretical_bubble(k, m), abs=1e-12)
    per_micro_batch = 4.0 if remat == "always" else 3.0  # forward 1 + backward 2 (+ recompute 1)
    assert tl.step_time(evs) == pytest.approx((m + k - 1) * per_micro_batch)


@pytest.mark.parametrize(
    "schedule,k,m", [(s, k, m) for s in ps.CLASSIC for k in (1, 2, 4) for m in (2, 4, 8)]
)
def test_except_last_lies_between_never_and_always(schedule, k, m):
    times = [tl.step_time(tl.events(schedule, k, m, r)) for r in ("never", "except_last", "always")]
    assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("k,m", [(k, m) for k in (1, 2, 4, 8) for m in (1, 2, 4, 8, 16, 32)])
def test_in_flight_fill_drain_holds_every_micro_batch_one_f_one_b_at_most_k_minus_stage(k, m):
    assert mem.peak_in_flight(tl.events("fill_drain", k, m)) == [m] * k
    assert mem.peak_in_flight(tl.events("one_f_one_b", k, m)) == [min(k - s, m) for s in range(k)]


def test_one_f_one_b_order_warms_up_then_alternates():
    orders = ps.stage_orders("one_f_one_b", 4, 8)
    kinds = ["F" if op.kind == ps.FORWARD else "B" for op in orders[1]]
    assert "".join(kinds) == "FFF" + "BF" * 5 + "BBB"
    assert [op.micro_batch for op in orders[1] if op.kind == ps.BACKWARD] == list(range(8))
    last = orders[3]
    assert "".join("F" if op.kind == ps.FORWARD else "B" for op in last) == "FB" * 8


def test_fill_drain_order_is_gpipes():
    order = ps.stage_orders("fill_drain", 2, 3, remat="always")[0]
    assert [(op.kind[0], op.micro_batch) for op in order] == [
        ("f", 0), ("f", 1), ("f", 2), ("r", 2), ("b", 2), ("r", 1), ("b", 1), ("r", 0), ("b", 0),
    ]  # fmt: skip


def test_except_last_skips_the_last_recompute():
    assert ps.remat_micro_batches("except_last", 4) == [True, True, True, False]
    assert ps.remat_micro_batches("never", 2) == [False, False]
    assert ps.remat_micro_batches("always", 1) == [True]


def test_timeline_uses_each_stage_cost_and_transfer():
    orders = ps.stage_orders("fill_drain", 2, 1)
    evs = tl.timeline(orders, {ps.FORWARD: [1.0, 3.0], ps.BACKWARD: [2.0, 5.0], ps.RECOMPUTE: [0, 0]}, 0.5)
    placed = {(e.stage, e.kind): (e.start, e.end) for e in evs}
    assert placed[(0, ps.FORWARD)] == (0.0, 1.0)
    assert placed[(1, ps.FORWARD)] == (1.5, 4.5)
    assert placed[(1, ps.BACKWARD)] == (4.5, 9.5)
    assert placed[(0, ps.BACKWARD)] == (10.0, 12.0)


def test_a_deadlocked_order_is_an_error():
    bad = [[ps.Op(0, 0, ps.BACKWARD), ps.Op(0, 0, ps.FORWARD)]]
    with pytest.raises(ValueError, match="deadlock"):
        tl.timeline(bad, {kind: [1.0] for kind in ps.KINDS})


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: ps.stage_orders("zigzag", 2, 2), "schedule must be one of"),
        (lambda: ps.stage_orders("fill_drain", 0, 2), "num_stages must be an int >= 1"),
        (lambda: ps.stage_orders("fill_drain", 2, True), "num_micro_batches"),
        (lambda: ps.remat_micro_batches("sometimes", 2), "remat must be one of"),
        (lambda: tl.timeline([[]], {ps.FORWARD: [1.0]}), "one duration per stage"),
    ],
)
def test_bad_arguments_are_one_line_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------- stages sharing the host's cores
CASES = [(2, 4, "never"), (3, 5, "always"), (4, 8, "except_last"), (1, 3, "never")]


@pytest.mark.parametrize("schedule", ps.CLASSIC)
@pytest.mark.parametrize("k, m, remat", CASES)
def test_shared_timeline_without_a_lone_speedup_is_the_plain_timeline(schedule, k, m, remat):
    """The event loop (taken for any speedup other than 1) gives the closed timeline's events."""
    orders = ps.stage_orders(schedule, k, m, remat)
    cost = {kind: [c * (1 + 0.1 * s) for s in range(k)] for kind, c in ps.UNIT_COSTS.items()}
    plain = tl.timeline(orders, cost, transfer=0.25)
    shared = tl.timeline(orders, cost, transfer=0.25, alone_speedup=[1.0 + 1e-12] * k)
    key = lambda e: (e.stage, e.micro_batch, e.kind)  # noqa: E731
    assert sorted(map(key, shared)) == sorted(map(key, plain))
    for a, b in zip(sorted(shared, key=key), sorted(plain, key=key)):
        assert a.start == pytest.approx(b.start) and a.end == pytest.approx(b.end)


@pytest.mark.parametrize("schedule", ps.CLASSIC)
def test_a_lone_stage_runs_faster(schedule):
    """K=2, M=4, forward 1, backward 2, 1.5x alone: stage 0's first forward, stage 1's last forward
    and first backward, and stage 0's last backward run alone (2/3 of their time); the rest in pairs:
    15 - (1 + 1 + 2 + 2) / 3 = 13."""
    orders = ps.stage_orders(schedule, 2, 4, "never")
    cost = {kind: [c] * 2 for kind, c in ps.UNIT_COSTS.items()}
    evs = tl.timeline(orders, cost, alone_speedup=[1.5, 1.5])
    assert tl.step_time(evs) == pytest.approx(13.0)
    with pytest.raises(ValueError, match="alone_speedup needs a factor >= 1 per stage"):
        tl.timeline(orders, cost, alone_speedup=[0.5, 1.0])


# ---------------------------------------------------------------- interleaved and zero-bubble schedules
NEW = [
    (s, k, m, v, r)
    for s, v in [
        ("interleaved_1f1b", 1),
        ("interleaved_1f1b", 2),
        ("interleaved_1f1b", 3),
        ("zb_h1", 1),
        ("zb_h2", 1),
        ("one_f_one_b_split", 1),
    ]
    for k in (1, 2, 3, 4)
    for m in (1, 2, 3, 4, 6, 8, 12)
    for r in ("never", "always")
    if not (s == "interleaved_1f1b" and v > 1 and m % k)
]


@pytest.mark.parametrize("schedule,k,m,v,remat", NEW)
def test_every_unit_runs_once_after_its_inputs(schedule, k, m, v, remat):
    sched = ps.build(schedule, k, m, remat, v)
    evs = tl.timeline(sched.orders, {kind: [1.0] * (k * v) for kind in ps.ALL_KINDS}, transfer=0.1)
    ops = [e.op for e in evs]
    assert len(ops) == len(set(ops))
    split = schedule in ps.SPLIT_BACKWARD
    kinds = (ps.FORWARD, ps.BACKWARD_INPUT, ps.BACKWARD_WEIGHT) if split else (ps.FORWARD, ps.BACKWARD)
    want = {ps.Op(s, b, kind) for s in range(k * v) for b in range(m) for kind in kinds}
    want |= {ps.Op(s, b, ps.RECOMPUTE) for s in range(k * v) for b in range(m) if remat == "always"}
    assert set(ops) == want
    start = {e.op: e.start for e in evs}
    end = {e.op: e.end for e in evs}
    grad = ps.BACKWARD_INPUT if split else ps.BACKWARD
    for s, b in itertools.product(range(k * v), range(m)):
        if s:
            assert start[ps.Op(s, b, ps.FORWARD)] >= end[ps.Op(s - 1, b, ps.FORWARD)]
        source = ps.Op(s + 1, b, grad) if s < k * v - 1 else ps.Op(s, b, ps.FORWARD)
        assert start[ps.Op(s, b, grad)] >= end[source]
        if split:
            assert start[ps.Op(s, b, ps.BACKWARD_WEIGHT)] >= end[ps.Op(s, b, grad)]
    for e in evs:
        assert e.row == sched.device_of(e.stage)


@pytest.mark.parametrize(
    "k,m,v",
    [(k, m, v) for k in (1, 2, 4, 8) for m in (1, 2, 4, 8, 16) for v in (1, 2, 3, 4) if v == 1 or m % k == 0],
)
def test_interleaved_bubble_is_k_minus_1_over_v_m_plus_k_minus_1(k, m, v):
    evs = tl.events("interleaved_1f1b", k, m, "never", v)
    assert tl.bubble(evs) == pytest.approx(tl.theoretical_bubble(k, m, v), abs=1e-9)


@pytest.mark.parametrize("k,m", [(k, m) for k in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16) if m >= k])
@pytest.mark.parametrize("w", [1.0, 0.5, 0.25])
def test_zb_h1_bubble_is_the_closed_form_at_one_f_one_b_memory(k, m, w):
    """(K - 1)(T_F + T_B - T_W) idle per device (T_B: the input half; M >= K, as the paper assumes),
    and no device holds more than
    1F1B's peak (K micro-batches, on its first device)."""
    cost = {ps.FORWARD: [1.0] * k, ps.BACKWARD_INPUT: [1.0] * k, ps.BACKWARD_WEIGHT: [w] * k}
    cost |= {ps.BACKWARD: [1.0 + w] * k, ps.RECOMPUTE: [1.0] * k}
    evs = tl.timeline(ps.build("zb_h1", k, m).orders, cost)
    assert tl.step_time(evs) == pytest.approx(m * (2.0 + w) + tl.zb_h1_bubble_time(k, 1.0, 1.0, w), abs=1e-9)
    one_f_one_b = mem.peak_in_flight(tl.events("one_f_one_b", k, m))
    assert max(mem.peak_in_flight(evs)) <= max(one_f_one_b)
    h2 = tl.timeline(ps.build("zb_h2", k, m).orders, cost)
    assert tl.step_time(h2) <= tl.step_time(evs) + 1e-9


@pytest.mark.parametrize("k,m", [(k, m) for k in (1, 2, 3, 4, 8) for m in (1, 2, 4, 8, 16) if m >= k])
def test_zb_h1_warms_up_as_one_f_one_b_and_holds_k_on_every_device(k, m):
    """Qi et al. 2023, ZB-H1: device d runs 1F1B's K - d forwards before its first I, then delays W
    so that every device holds K micro-batches (forward started, W not finished): the first device's,
    1F1B's peak, is never exceeded."""
    sched = ps.build("zb_h1", k, m)
    for d, order in enumerate(sched.orders):
        first_input = next(i for i, op in enumerate(order) if op.kind == ps.BACKWARD_INPUT)
        assert [op.kind for op in order[:first_input]] == [ps.FORWARD] * (k - d)
    assert mem.peak_in_flight(tl.events("zb_h1", k, m)) == [k] * k


@pytest.mark.parametrize("k,m", [(k, m) for k in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 16)])
@pytest.mark.parametrize("f,i,w", [(1.0, 1.0, 1.0), (1.0, 1.0, 0.25), (0.5, 1.5, 2.0)])
def test_one_f_one_b_split_holds_what_one_f_one_b_holds_on_each_device_with_less_bubble(k, m, f, i, w):
    """Device d holds at most 1F1B's K - d micro-batches (forward started, W not done), so devices
    sharing one memory hold no more together either; idle (K - 1)(T_F + T_I) per device, 1F1B's
    less (K - 1) T_W, whatever the costs."""
    cost = {ps.FORWARD: [f] * k, ps.BACKWARD_INPUT: [i] * k, ps.BACKWARD_WEIGHT: [w] * k}
    cost |= {ps.BACKWARD: [i + w] * k, ps.RECOMPUTE: [f] * k}
    evs = tl.timeline(ps.build("one_f_one_b_split", k, m).orders, cost)
    one_f_one_b = tl.timeline(ps.build("one_f_one_b", k, m).orders, cost)
    assert mem.peak_in_flight(evs) == mem.peak_in_flight(one_f_one_b) == [min(k - d, m) for d in range(k)]
    want = m * (f + i + w) + tl.one_f_one_b_split_bubble_time(k, f, i)
    assert tl.step_time(evs) == pytest.approx(want, abs=1e-9)
    assert tl.step_time(one_f_one_b) - tl.step_time(evs) == pytest.approx((k - 1) * w, abs=1e-9)


def _split_events() -> list[tl.Event]:
    """Two devices, one micro-batch: F0 [0, 1], F1 [1, 2], I1 [2, 3], I0 [3, 4], W1 [3, 5], W0 [4, 6]."""
    f, i, w = ps.FORWARD, ps.BACKWARD_INPUT, ps.BACKWARD_WEIGHT
    return [
        tl.Event(0, 1, 0, 0, f, 0),
        tl.Event(1, 2, 1, 0, f, 1),
        tl.Event(2, 3, 1, 0, i, 1),
        tl.Event(3, 4, 0, 0, i, 0),
        tl.Event(3, 5, 1, 0, w, 1),
        tl.Event(4, 6, 0, 0, w, 0),
    ]


def test_held_after_input_weighs_what_w_reads_and_sums_stay_from_the_first_w():
    evs = _split_events()
    assert mem.held_over_time(evs, [5.0, 5.0]) == [[(0, 5.0), (6, 0.0)], [(1, 5.0), (5, 0.0)]]
    # From the end of its I to the end of its W a micro-batch weighs 9 (inputs and output gradients).
    held = mem.held_over_time(evs, [5.0, 5.0], after_input=[9.0, 9.0])
    assert held == [[(0, 5.0), (4, 9.0), (6, 0.0)], [(1, 5.0), (3, 9.0), (5, 0.0)]]
    # The weight-gradient sums (8, 3) stay from the end of the stage's first W (released first).
    held = mem.held_over_time(evs, [5.0, 5.0], [9.0, 9.0], sums=[8.0, 3.0])
    assert held == [[(0, 5.0), (4, 9.0), (6, 0.0), (6, 8.0)], [(1, 5.0), (3, 9.0), (5, 0.0), (5, 3.0)]]
    assert mem.peak_held(evs, [5.0, 5.0], [9.0, 9.0], sums=[10.0, 3.0]) == [10.0, 9.0]
    # A full backward (B) has no I: after_input changes nothing.
    one_f_one_b = tl.events("one_f_one_b", 2, 4)
    assert mem.held_over_time(one_f_one_b, [5.0, 5.0], after_input=[9.0, 9.0]) == mem.held_over_time(
        one_f_one_b, [5.0, 5.0]
    )


def test_bubbles_at_k4_m8_with_equal_unit_costs():
    """The issue's figures: 1F1B 27%, interleaved v=2 16%, ZB-H1 11%."""
    assert tl.bubble(tl.events("one_f_one_b", 4, 8)) == pytest.approx(3 / 11)
    assert tl.bubble(tl.events("interleaved_1f1b", 4, 8, virtual_stages=2)) == pytest.approx(3 / 19)
    assert tl.bubble(tl.events("zb_h1", 4, 8)) == pytest.approx(3 / 27)
    assert mem.peak_in_flight(tl.events("zb_h2", 4, 8)) == [7, 7, 7, 7]


@pytest.mark.parametrize(
    "schedule,k,m,v,match",
    [
        (
            "interleaved_1f1b",
            4,
            6,
            2,
            r"num_micro_batches \(6\) to be a multiple of num_stages \(4\); use num_micro_batches=8",
        ),
        ("one_f_one_b", 2, 4, 2, r"virtual_stages=2 needs schedule='interleaved_1f1b'"),
        ("zb_h1", 2, 4, 0, r"virtual_stages must be an int >= 1"),
    ],
)
def test_impossible_combinations_are_one_line_errors(schedule, k, m, v, match):
    with pytest.raises(ps.ScheduleError, match=match):
        ps.build(schedule, k, m, virtual_stages=v)


def test_interleaved_device_holds_stages_d_d_plus_k():
    sched = ps.build("interleaved_1f1b", 2, 4, virtual_stages=2)
    assert [sorted({op.stage for op in order}) for order in sched.orders] == [[0, 2], [1, 3]]
    assert [op.micro_batch for op in sched.stage_order(2) if op.kind == ps.FORWARD] == [0, 1, 2, 3]


@pytest.mark.parametrize("schedule,v", [("interleaved_1f1b", 2), ("one_f_one_b", 1), ("zb_h1", 1)])
def test_shared_cores_timeline_runs_free_units(schedule, v):
    """A unit measured at no cost (a loaded machine's cost differences can come out 0) ends where it
    starts, and what waits on it runs: the shared-cores event loop once called that a deadlock."""
    k, m = 2, 4
    sched = ps.build(schedule, k, m, "never", v)
    cost = {kind: [1.0] * (k * v) for kind in ps.ALL_KINDS}
    cost[ps.BACKWARD] = cost[ps.BACKWARD_WEIGHT] = [0.0] * (k * v)
    evs = tl.timeline(sched.orders, cost, transfer=0.0, alone_speedup=[1.5] * k)
    assert len(evs) == sum(len(order) for order in sched.orders)


def test_held_counts_are_a_devices_forwards_and_ws_waiting_at_each_forward():
    order = ps.build("zb_h1", 2, 3).orders[1]  # F0 I0 F1 I1 W0 F2 I2 W1 W2
    assert mem.held_counts(order) == [(1, 0), (1, 1), (1, 1)]
    assert mem.held_counts(ps.build("one_f_one_b", 2, 3).orders[0]) == [(1, 0), (2, 0), (2, 0)]


@pytest.mark.parametrize("k,m", [(2, 2), (2, 8), (3, 5), (4, 4), (4, 8)])
@pytest.mark.parametrize("kept", [(5, 5, 5, 5), (4, 5, 5, 6), (4, 6, 6, 6), (8, 2, 3, 9), (1, 9, 9, 9)])
def test_zb_h1_budgets_keep_every_device_within_one_f_one_b_s_fullest(k, m, kept):
    """Stages keeping different bytes (``kept``): with each micro-batch weighing its budget from I to
    W, no device under ZB-H1 holds more at once than 1F1B's fullest device; no budget exceeds what
    the stage's forward keeps, and with equal stages every budget is that (Qi et al.'s premise)."""
    kept = list(kept[:k])
    sched = ps.build("zb_h1", k, m)
    budgets = mem.weight_budgets(sched, kept)
    assert all(0 <= b <= c for b, c in zip(budgets, kept))
    if len(set(kept)) == 1:
        assert budgets == kept
    cost = {kind: [c] * k for kind, c in ps.UNIT_COSTS.items()}
    zb = tl.timeline(sched.orders, cost)
    one_f_one_b = tl.events("one_f_one_b", k, m)
    limit = max(mem.peak_held(one_f_one_b, kept))
    assert max(mem.peak_held(zb, kept, after_input=budgets)) <= limit + 1e-9
    # The premise's budgets alone would pass it here: a device beyond the first holds K.
    if kept[-1] * min(k, m) > limit:
        assert max(mem.peak_held(zb, kept, after_input=kept)) > limit


def test_budgets_other_schedules_and_unknown_sizes():
    """Other schedules keep the premise (what the forward keeps); a size not known yet gives no budget
    and leaves 1F1B's peak to the stages known (the first: traced before the others)."""
    assert mem.weight_budgets(ps.build("zb_h2", 2, 4), [4, 6]) == [4, 6]
    assert mem.weight_budgets(ps.build("one_f_one_b_split", 2, 4), [4, 6]) == [4, 6]
    zb = ps.build("zb_h1", 2, 4)
    assert mem.weight_budgets(zb, [4, 6]) == [4, 2]  # last device: 6 + 2 = 8, 1F1B's first device
    assert mem.weight_budgets(zb, [4, None]) == [4, None]
    assert mem.weight_budgets(zb, [None, 6]) == [None, 0]  # only its own 1F1B peak (6) is known
    assert mem.deferred_segments(None, [2, 2]) == 2


def test_zbv_is_a_v_and_its_unit_time_step_beats_zb_h1():
    """ZB-V at K=2, M=4 in unit time (a V stage is half a device's work: F = I = W = 1 per stage,
    2 for zb_h1's whole-device stages): the last stage runs on device 0, and the step is shorter."""
    zbv = ps.build("zbv", 2, 4, virtual_stages=2)
    assert zbv.placement == (0, 1, 1, 0) and zbv.num_stages == 4
    assert {op.stage for op in zbv.orders[0]} == {0, 3}
    evs = tl.timeline(zbv.orders, {kind: [1.0] * 4 for kind in ps.ALL_KINDS})
    assert {e.row for e in evs if e.stage == 3} == {0}
    zb = ps.build("zb_h1", 2, 4)
    zb_evs = tl.timeline(zb.orders, {kind: [2.0] * 2 for kind in ps.ALL_KINDS})
    assert tl.step_time(evs) == 25.0 < tl.step_time(zb_evs) == 26.0


@pytest.mark.parametrize("k, m", [(2, 8), (4, 8), (4, 5)])
def test_v_schedules_hold_1f1b_peak_and_beat_zb_h1_in_unit_time(k, m):
    """ZB-V holds at most 2K half-device stages per device (K whole micro-batches, 1F1B's peak);
    DualPipeV half a micro-batch more. Both step faster than ZB-H1 in unit time (F = I = W per half
    device, B = I + W)."""
    unit = {kind: [1.0] * (2 * k) for kind in ps.ALL_KINDS} | {ps.BACKWARD: [2.0] * (2 * k)}
    whole = {kind: [2.0] * k for kind in ps.ALL_KINDS} | {ps.BACKWARD: [4.0] * k}
    zb = tl.step_time(tl.timeline(ps.build("zb_h1", k, m).orders, whole))
    one_f_one_b = max(mem.peak_held(tl.timeline(ps.build("one_f_one_b", k, m).orders, whole), [1.0] * k))
    for name, extra in (("zbv", 0.0), ("dualpipe_v", 0.5)):
        if name == "dualpipe_v" and m < 2 * k:
            with pytest.raises(
                ps.ScheduleError, match=r"dualpipe_v' needs num_micro_batches \(5\) of at least"
            ):
                ps.build(name, k, m, virtual_stages=2)
            continue
        sched = ps.build(name, k, m, virtual_stages=2)
        assert sched.placement == ps.v_placement(k)
        evs = tl.timeline(sched.orders, unit)
        assert max(mem.peak_held(evs, [0.5] * (2 * k))) == one_f_one_b + extra == min(k, m) + extra
        assert tl.step_time(evs) < zb
