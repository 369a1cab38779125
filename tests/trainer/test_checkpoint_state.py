"""The checkpoint state file: damaged or missing is an error, never 'nothing saved'; the rebuild;
an interrupted save's leftovers; what evalers say when retention got there first."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys

import pytest

from params import experiment
from params.errors import UserError
from tests.trainer import runner
from tests.trainer.conftest import copy_finished_run
from trainer import checkpointer
from trainer.evaler_job import Evaler
from trainer.train_job import TrainLoop


def _root(data_dir, override=""):
    text = runner.data_override(data_dir) + "; task.train.save_max_to_keep : 0"
    return experiment.resolve(runner.MODEL, params_override=text + (f"; {override}" if override else ""))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A logdir with checkpoints at steps 10, 20, 30."""
    logdir = tmp_path_factory.mktemp("state") / "run"
    with TrainLoop(_root(data_dir), str(logdir), log=lambda _: None) as loop:
        assert loop.run() == 30
    return logdir


def _copy(trained, tmp_path):
    train = tmp_path / "run" / "train"
    train.mkdir(parents=True)
    for f in (trained / "train").iterdir():
        if not f.name.startswith("events."):
            (train / f.name).write_bytes(f.read_bytes())
    return train


def test_damaged_and_missing_state_files_are_errors_naming_the_newest_checkpoint(trained, tmp_path):
    train = _copy(trained, tmp_path)
    assert [s for s, _ in checkpointer.list_checkpoints(str(train))] == [10, 20, 30]
    for damage in (b"\xff\xfe not text", b"model_checkpoint_path: {", b""):
        (train / "checkpoint").write_bytes(damage)
        with pytest.raises(checkpointer.DamagedStateError) as e:
            checkpointer.check_state(str(train))
        assert str(train / "ckpt-30") in str(e.value) and "--rebuild" in str(e.value)
        with pytest.raises(UserError):
            checkpointer.list_checkpoints(str(train))  # evalers too: one line, not 'nothing saved'
    (train / "checkpoint").unlink()
    with pytest.raises(checkpointer.DamagedStateError, match="is missing but 3 checkpoint"):
        checkpointer.check_state(str(train))
    assert checkpointer.list_checkpoints(str(train)) == []  # a reader: maybe the first save is under way

    rebuilt = checkpointer.rebuild_state(str(train))
    assert [s for s, _ in rebuilt] == [10, 20, 30]
    checkpointer.check_state(str(train))
    assert checkpointer.list_checkpoints(str(train))[-1] == (30, str(train / "ckpt-30"))


def test_a_fresh_logdir_is_not_an_error(tmp_path):
    checkpointer.check_state(str(tmp_path / "train"))
    assert checkpointer.list_checkpoints(str(tmp_path / "train")) == []


def test_only_orphan_save_directories_are_removed(tmp_path):
    for name in ("ckpt-40_temp", "ckpt-7_temp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    (tmp_path / "ckpt-8_temp").write_text("a file, not a save directory")
    (tmp_path / "my_temp").mkdir()
    messages = []
    removed = checkpointer.remove_orphan_temps(str(tmp_path), messages.append)
    assert sorted(removed) == [str(tmp_path / "ckpt-40_temp"), str(tmp_path / "ckpt-7_temp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-8_temp", "my_temp"]
    assert len(messages) == 2


def test_truncated_checkpoint_is_one_user_error_for_an_evaler(trained, data_dir, tmp_path):
    train = _copy(trained, tmp_path)
    data = next(train.glob("ckpt-20.data-*"))
    data.write_bytes(data.read_bytes()[:100])
    evaler = Evaler(_root(data_dir), str(train.parent), "dev", log=lambda _: None)
    with pytest.raises(UserError, match="ckpt-20 cannot be restored") as e:
        evaler.run_pending()
    assert "\n" not in str(e.value) and evaler.done_steps == [10]
    evaler.close()


def test_evaler_names_the_checkpoints_retention_deleted_before_it_scored_them(trained, data_dir, tmp_path):
    train = _copy(trained, tmp_path)
    messages = []
    evaler = Evaler(_root(data_dir), str(train.parent), "dev", log=messages.append)
    assert [s for s, _ in evaler.pending()] == [10, 20, 30]  # seen, not yet scored
    for step in (10, 20):  # retention deletes them, as tf.train.CheckpointManager does
        for f in train.glob(f"ckpt-{step}.*"):
            f.unlink()
    checkpointer.rebuild_state(str(train))
    assert evaler.run_pending() == 1
    assert any("skipped 2 checkpoint(s) (steps 10, 20): deleted by retention" in m for m in messages), (
        messages
    )
    evaler.close()
    # A new evaler that never saw them infers them from save_interval_steps.
    messages.clear()
    (train.parent / "eval_dev" / "scores.jsonl").unlink()
    fresh = Evaler(_root(data_dir), str(train.parent), "dev", log=messages.append)
    assert fresh.run_pending() == 1
    assert any("steps 10, 20" in m for m in messages), messages
    fresh.close()


def _ckpt_digests(train_dir):
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(train_dir.iterdir())
        if p.name.startswith("ckpt-") and p.is_file()
    }


def _checkpoint_state_tool(logdir, *flags):
    return subprocess.run(
        [sys.executable, "-m", "tools.checkpoint_state", f"--logdir={logdir}", *flags],
        cwd=runner.REPO,
        env=runner._env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_damaged_or_missing_state_file_stops_and_the_rebuild_resumes(tmp_path, finished_run):
    logdir, data_dir = copy_finished_run(finished_run, tmp_path)
    train = logdir / "train"
    state = train / "checkpoint"
    params_before = (logdir / "params.txt").read_text()
    for damage in ("garbage", "missing"):
        if damage == "garbage":
            state.write_bytes(b"model_checkpoint_path: \x00\xff{{ not a proto")
        else:
            state.unlink()
        before = _ckpt_digests(train)
        events_before = sorted(p.name for p in train.glob("events.*"))
        result = runner.run(
            logdir, data_dir, "--job=controller,trainer", override="task.train.max_steps : 50"
        )
        assert result.returncode == 1, result.stderr[-3000:]
        (line,) = runner.error_lines(result.stderr)
        assert "Traceback" not in result.stderr
        assert (
            str(train / "ckpt-20") in line and f"tools.checkpoint_state --logdir={logdir} --rebuild" in line
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
    refused = _checkpoint_state_tool(logdir, "--rebuild")
    assert refused.returncode == 1 and "another trainer" in refused.stderr
    assert not state.exists()
    (train / "LOCK").unlink()

    rebuilt = _checkpoint_state_tool(logdir, "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert f"latest {train / 'ckpt-20'}" in rebuilt.stdout
    resumed = runner.run(logdir, data_dir, "--job=controller,trainer", override="task.train.max_steps : 50")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {train / 'ckpt-20'} at step 20" in resumed.stdout
    assert f"removed {orphan}, left by a save that was interrupted" in resumed.stdout
    assert not orphan.exists() and (train / "ckpt-41_temp.keep").exists()
    assert runner.checkpoint_steps(logdir)[-1] == 50
