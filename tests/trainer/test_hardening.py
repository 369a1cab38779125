"""Faults around saved state: a damaged or missing state file, a truncated checkpoint under an
evaler, an interrupted save's leftovers, a full disk, SIGTERM. Each ends in one line and leaves every
saved checkpoint as it was; the documented recovery then resumes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.trainer import runner

TRAIN = "--job=controller,trainer"


def _ckpt_digests(train_dir):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(train_dir.iterdir())
        if p.name.startswith("ckpt-") and p.is_file()
    }


def _tool(logdir, *flags):
    return subprocess.run(
        [sys.executable, "-m", "tools.checkpoint_state", f"--logdir={logdir}", *flags],
        cwd=runner.REPO,
        env=runner._env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _weights(path):
    values = runner.read_checkpoint(str(path))
    values.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return values


@pytest.mark.slow
def test_damaged_or_missing_state_file_stops_and_the_rebuild_resumes(tmp_path, data_dir):
    logdir = tmp_path / "run"
    train = logdir / "train"
    first = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 30")
    assert first.returncode == 0, first.stderr[-3000:]
    state = train / "checkpoint"
    params_before = (logdir / "params.txt").read_text()
    for damage in ("garbage", "missing"):
        if damage == "garbage":
            state.write_bytes(b"model_checkpoint_path: \x00\xff{{ not a proto")
        else:
            state.unlink()
        before = _ckpt_digests(train)
        events_before = sorted(p.name for p in train.glob("events.*"))
        result = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 50")
        assert result.returncode == 1, result.stderr[-3000:]
        (line,) = runner.error_lines(result.stderr)
        assert "Traceback" not in result.stderr
        assert (
            str(train / "ckpt-30") in line and f"tools.checkpoint_state --logdir={logdir} --rebuild" in line
        )
        assert ("damaged" if damage == "garbage" else "is missing") in line
        assert _ckpt_digests(train) == before  # every checkpoint's bytes unchanged
        assert sorted(p.name for p in train.glob("events.*")) == events_before  # nothing written
        assert (logdir / "params.txt").read_text() == params_before
        assert not (train / "LOCK").exists()

    # The LOCK of a live trainer keeps the rebuild (and an interrupted save's leftovers) untouched.
    orphan = train / "ckpt-40_temp"
    orphan.mkdir()
    (orphan / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    (train / "ckpt-41_temp.keep").write_text("not an orphan save directory")
    live = {"pid": os.getpid(), "host": socket.gethostname(), "start_time": None}
    (train / "LOCK").write_text(json.dumps(live))
    refused = _tool(logdir, "--rebuild")
    assert refused.returncode == 1 and "another trainer" in refused.stderr
    assert not state.exists()
    (train / "LOCK").unlink()

    rebuilt = _tool(logdir, "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert f"latest {train / 'ckpt-30'}" in rebuilt.stdout
    resumed = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 50")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {train / 'ckpt-30'} at step 30" in resumed.stdout
    assert f"removed {orphan}, left by a save that was interrupted" in resumed.stdout
    assert not orphan.exists() and (train / "ckpt-41_temp.keep").exists()
    assert runner.checkpoint_steps(logdir)[-1] == 50


@pytest.mark.slow
def test_truncated_checkpoint_under_an_evaler_is_one_line(tmp_path, data_dir):
    logdir = tmp_path / "run"
    first = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 20")
    assert first.returncode == 0, first.stderr[-3000:]
    data = next((logdir / "train").glob("ckpt-20.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    result = runner.run(logdir, data_dir, "--job=evaler_dev", override="task.train.max_steps : 20")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    (line,) = runner.error_lines(result.stderr)
    assert "ckpt-20 cannot be restored" in line
    assert "eval_dev: step 10:" in result.stdout  # the good one before it was scored


@pytest.mark.slow
def test_empty_job_names_are_refused(tmp_path, data_dir):
    result = runner.run(tmp_path / "run", data_dir, "--job=,")
    assert result.returncode == 2
    (line,) = runner.error_lines(result.stderr)
    assert "--job: empty job name" in line


@pytest.mark.slow
def test_sigterm_saves_at_the_current_step_and_the_resume_equals_an_uninterrupted_run(tmp_path, data_dir):
    steps = 6000
    override = (
        f"task.train.max_steps : {steps}; task.train.save_interval_steps : 1000; "
        "task.train.summary_interval_steps : 500; task.train.log_interval_steps : 100"
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    proc = runner.start(stopped, data_dir, TRAIN, override=override)
    runner.wait_for(lambda: "step 200/" in proc.log_path.read_text(), what="step 200", proc=proc)
    proc.send_signal(signal.SIGTERM)
    code, output = runner.finish(proc)
    assert code == 143, output[-3000:]
    assert "Traceback" not in output
    saved = runner.checkpoint_steps(stopped)[-1]
    assert 200 <= saved < steps
    assert (
        f"trainer: terminated by SIGTERM at step {saved}; saved {stopped / 'train' / f'ckpt-{saved}'}"
        in output
    )
    assert not (stopped / "train" / "LOCK").exists()

    resumed = runner.run(stopped, data_dir, TRAIN, override=override)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {stopped / 'train' / f'ckpt-{saved}'} at step {saved}" in resumed.stdout
    result = runner.run(straight, data_dir, TRAIN, override=override)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = _weights(straight / "train" / f"ckpt-{steps}")
    actual = _weights(stopped / "train" / f"ckpt-{steps}")
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return result.returncode == 0


@pytest.mark.slow
def test_full_disk_keeps_the_last_checkpoint_and_the_rerun_works(tmp_path, data_dir):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "16m"):
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        logdir = disk / "run"
        long_run = (
            "task.train.max_steps : 100000000; task.train.save_interval_steps : 300; "
            "task.train.summary_interval_steps : 50"
        )
        proc = runner.start(logdir, data_dir, TRAIN, override=long_run, log=tmp_path / "full.log")
        runner.wait_for(lambda: runner.checkpoint_steps(logdir), what="a checkpoint", proc=proc)
        filler = disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)
        code, output = runner.finish(proc)
        assert code == 1, output[-3000:]
        assert "Traceback" not in output
        (line,) = runner.error_lines(output)
        assert "No space left on device" in line
        kept = runner.checkpoint_steps(logdir)[-1]
        weights = _weights(logdir / "train" / f"ckpt-{kept}")  # the last good checkpoint restores
        assert int(weights["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == kept

        filler.unlink()  # space is back
        rerun = runner.run(logdir, data_dir, TRAIN, override=f"task.train.max_steps : {kept + 20}")
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert f"resumed from {logdir / 'train' / f'ckpt-{kept}'} at step {kept}" in rerun.stdout
        assert runner.checkpoint_steps(logdir)[-1] == kept + 20
        assert not list((logdir / "train").glob("*_temp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
