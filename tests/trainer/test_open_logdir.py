"""Every mode opens its logdir through trainer/open_logdir.py: one process, sync and async on
loopback, and a mesh. Pointing another experiment at a used logdir exits 2 with the same one line and
changes nothing under it; ``--allow_params_change`` goes on and records the change in
params_changes.txt.

One finished run of the linear experiment (10 steps) is shared; each case copies it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.trainer import cluster_runner as cr
from tests.trainer import runner
from tests.trainer.runner import data_override, error_lines

STEPS = 10
SMALL = (
    f"task.train.max_steps : {STEPS}; task.train.save_interval_steps : {STEPS}; "
    "task.train.warmup_steps : 1; cluster.intra_op_threads : 1; cluster.inter_op_threads : 1"
)
MESH = "cluster.num_logical_cpu_devices : 2; cluster.mesh_shape : [2]; cluster.mesh_axis_names : ['data']"
OTHER = "--model=image.digits.ConvNet"
TIMEOUT = 300


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    logdir = tmp_path_factory.mktemp("opened") / "run"
    result = runner.run(logdir, data_dir, "--job=controller,trainer", override=SMALL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return logdir


@pytest.fixture
def logdir(finished, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy


def _snapshot(logdir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(logdir)): p.read_bytes() for p in sorted(logdir.rglob("*")) if p.is_file()}


def _refusal(logdir: Path) -> str:
    return (
        f"trainer: error: --logdir={logdir}: it holds a run of {runner.MODEL} (its params.txt), not "
        "image.digits.ConvNet; use another --logdir, or pass --allow_params_change to go on anyway"
    )


def _start(procs: cr.Procs, mode: str, model: str, logdir: Path, override: str, *more: str):
    """The process of one run in ``mode`` that writes the logdir (its peers, if any, run too)."""
    if mode == "mesh":
        override += f"; {MESH}"
    flags = [model, f"--logdir={logdir}", f"--params_override={override}", *more]
    if mode == "sync":
        return cr.sync_workers(procs, 1, flags)[0]
    if mode == "async":
        return cr.async_cluster(procs, 1, 1, flags)[0]
    return procs.trainer(mode, "--job=controller,trainer", *flags)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["one_process", "sync", "async", "mesh"])
def test_another_experiment_is_refused_and_allow_params_change_is_recorded(mode, logdir, data_dir, tmp_path):
    """Another experiment: exit 2, the same one line, nothing under the logdir changed. The same
    experiment with a new learning rate on the finished run (refused without the flag): with
    --allow_params_change it goes on (nothing is left to train) and records the change."""
    before = _snapshot(logdir)
    with cr.Procs(tmp_path) as procs:
        writer = _start(procs, mode, OTHER, logdir, SMALL)
        code, out = procs.wait(writer, TIMEOUT)
    assert code == 2, out[-3000:]
    assert error_lines(out) == [_refusal(logdir)], out[-3000:]
    assert "Traceback" not in out
    assert _snapshot(logdir) == before

    text = data_override(data_dir) + f"; {SMALL}; task.train.learning_rate : 0.25"
    with cr.Procs(tmp_path) as procs:
        writer = _start(procs, mode, f"--model={runner.MODEL}", logdir, text, "--allow_params_change")
        code, out = procs.wait(writer, TIMEOUT)
    assert code == 0, out[-3000:]
    assert f"trainer: warning: its run finished at step {STEPS}" in out
    record = (logdir / "params_changes.txt").read_text()
    assert record.startswith(f"# step {STEPS}, ")
    assert "> task.train.learning_rate : 0.25" in record
    assert "task.train.learning_rate : 0.25" in (logdir / "params.txt").read_text()
