"""The network model (layers/parallel/pipeline/network.py) against hand-worked steps."""

import pytest

from layers.parallel.pipeline import network, schedule, simulator

MIB = 2**20


def test_a_message_costs_latency_plus_bytes_over_rate():
    link = network.Link(100, latency_s=0.001)
    assert link.seconds(MIB) == pytest.approx(0.001 + MIB * 8 / 100e6)
    assert network.Link().seconds(10 * MIB) == 0.0  # no limit, no latency
    with pytest.raises(ValueError, match="rate_mbit must be > 0"):
        network.Link(0)


def test_the_ring_all_reduce_sends_two_n_minus_one_over_n_of_the_gradient():
    link = network.Link(1000, latency_s=0.0005)
    assert network.allreduce_seconds(64 * MIB, 1, link) == 0.0
    assert network.allreduce_seconds(64 * MIB, 2, link) == pytest.approx(2 * 0.0005 + 64 * MIB * 8 / 1e9)
    four = network.allreduce_seconds(64 * MIB, 4, link)
    assert four == pytest.approx(6 * 0.0005 + 1.5 * 64 * MIB * 8 / 1e9)
    assert network.replicas_step(0.5, 64 * MIB, 2, network.Link(1000)) == pytest.approx(0.5 + 0.536870912)


def test_an_unlimited_link_with_latency_is_the_simulators_transfer():
    costs = simulator.StageCosts.given([0.05, 0.04], [0.1, 0.09])
    for name in ("fill_drain", "one_f_one_b", "zb_h1"):
        plain = simulator.simulate(
            name, 8, "never", simulator.StageCosts.given([0.05, 0.04], [0.1, 0.09], transfer=0.003)
        )
        linked = simulator.simulate(
            name, 8, "never", costs, link=network.Link(None, 0.003), handoff_bytes=MIB
        )
        assert linked.step_time == pytest.approx(plain.step_time), name


def test_a_slow_link_queues_the_hand_offs():
    """F 50 ms, B 100 ms, M=8, 2 MiB hand-offs at 100 Mbit/s (168 ms each): the link, not the stages,
    sets the pace; stage 0's forwards arrive one per 168 ms, the last at 0.05 + 8 x 0.168 s, and the
    gradients back likewise after stage 1's first backward."""
    hop = 2 * MIB * 8 / 100e6
    costs = simulator.StageCosts.given([0.05, 0.05])
    step = simulator.simulate("fill_drain", 8, "never", costs, link=network.Link(100), handoff_bytes=2 * MIB)
    last_forward_end = 0.05 + 8 * hop + 0.05
    first_backward_end = last_forward_end + 0.1  # fill-drain: stage 1's backwards after all its forwards
    assert step.step_time == pytest.approx(max(first_backward_end + 8 * hop, last_forward_end + 0.8) + 0.1)
    with pytest.raises(ValueError, match="alone_speedup must be 1"):
        simulator.simulate(
            "fill_drain",
            8,
            "never",
            simulator.StageCosts.given([1, 1], alone_speedup=1.5),
            link=network.Link(1),
        )


def test_crossover_predicted_and_interpolated():
    def pipeline(rate: float) -> float:
        return 1.0 + 10.0 / rate

    def replicas(rate: float) -> float:
        return 0.5 + 100.0 / rate

    # 1 + 10/r = 0.5 + 100/r at r = 180.
    assert network.crossover_mbit(pipeline, replicas) == pytest.approx(180.0, rel=1e-6)
    assert network.crossover_mbit(replicas, pipeline) is None  # the "pipeline" never wins below
    rates = [100, 1000]
    crossed = network.interpolated_crossover(
        rates, [pipeline(r) for r in rates], [replicas(r) for r in rates]
    )
    assert 100 < crossed < 1000
    assert network.interpolated_crossover(rates, [1, 1], [2, 2]) is None


def test_a_deadlocked_order_is_an_error():
    orders = [
        [schedule.Op(0, 0, schedule.BACKWARD), schedule.Op(0, 0, schedule.FORWARD)],
        [schedule.Op(1, 0, schedule.FORWARD), schedule.Op(1, 0, schedule.BACKWARD)],
    ]
    cost = {kind: [0.1, 0.1] for kind in schedule.KINDS}
    with pytest.raises(schedule.ScheduleError, match="deadlocks"):
        network.timeline(orders, cost, network.Link(10), 1000)


def test_the_hosts_own_work_per_byte_overlaps_a_hand_off_adds_to_a_ring_and_is_fitted_back():
    link = network.Link(100, host_mbit=400)
    assert link.busy_seconds(MIB) == pytest.approx(MIB * 8 / 100e6)
    assert network.Link(1000, host_mbit=400).busy_seconds(MIB) == pytest.approx(MIB * 8 / 400e6)
    assert link.busy_seconds(MIB, streamed=False) == pytest.approx(MIB * 8 / 100e6 + MIB * 8 / 400e6)
    assert network.allreduce_seconds(MIB, 2, link) == pytest.approx(link.busy_seconds(MIB, streamed=False))

    def step(host):
        return network.replicas_step(1.0, 64 * MIB, 2, network.Link(10_000, host_mbit=host))

    assert network.fit_host_mbit(step, step(400.0)) == pytest.approx(400.0, rel=1e-6)
    assert network.fit_host_mbit(step, step(None)) is None
