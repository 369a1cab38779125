"""tools.benchmark capacity without running it (a run takes minutes): every row's experiment resolves
with its bindings at every size of the ladder, and the mesh rows ask for one device per process."""

import pytest

from params import experiment
from tools.benchmarks import capacity


@pytest.mark.parametrize("row", capacity.ROWS, ids=[r.placement for r in capacity.ROWS])
def test_every_row_resolves_at_every_size(row):
    for layers, width in capacity.LADDER + capacity.QUICK_LADDER:
        root = experiment.resolve(row.model, gin_bindings=capacity.bindings(row, layers, width))
        assert root.task.train.max_steps == capacity.BASE["max_steps"]
        assert str(width) in root.to_text() and str(4 * width) in root.to_text()
        if row.mode == "stages":  # a layer for each stage process, or the size is refused
            assert layers >= row.processes and root.task.stack.pipeline.num_stages == row.processes
        if row.mode == "mesh":
            shape = list(root.cluster.mesh_shape)
            assert shape == [1, row.processes] and root.cluster.num_logical_cpu_devices == row.processes


def test_unknown_rows_are_refused(capsys):
    assert capacity.main(["capacity", "--rows=one_process_plain,nope"]) == 2
    assert "unknown figures ['nope']" in capsys.readouterr().err


@pytest.mark.parametrize("largest", [-1, 0, 1, 5, 10, len(capacity.LADDER) - 1])
def test_climb_finds_the_largest_size_that_fits_in_few_trials(monkeypatch, largest):
    """Galloping then bisection over the ladder: the same answer as trying every rung in order."""
    tried = []

    def fake_trial(row, layers, width, train_steps, timeout, budget_mib):
        i = capacity.LADDER.index((layers, width))
        tried.append(i)
        peak = 1000.0 + i
        return {"ok": True, "over": i > largest, "peak_rss_mib": peak, "peaks_mib": [peak], "params": i + 1}

    monkeypatch.setattr(capacity, "trial", fake_trial)
    best = capacity.climb(capacity.ROWS[0], capacity.LADDER, 2000.0, 3, 60.0, verbose=False)
    assert best["params"] == largest + 1
    assert len(set(tried)) == len(tried) <= 2 * len(capacity.LADDER).bit_length()
    if largest == len(capacity.LADDER) - 1:
        assert best["stopped_by"].startswith("the ladder's largest size fits")
    else:
        layers, width = capacity.LADDER[largest + 1]
        assert best["stopped_by"].startswith(f"{layers}x{width}: ")
