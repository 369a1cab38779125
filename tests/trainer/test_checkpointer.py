"""Checkpoints: retention, a save cut short never becomes the latest, a corrupt one is reported."""

from __future__ import annotations

import signal
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from params.errors import UserError
from tests.trainer import runner
from trainer import checkpointer
from trainer.checkpointer import Checkpointer


class _State(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.zeros([3]))


def _checkpointer(directory, max_to_keep=5):
    state, step = _State(), tf.Variable(0, dtype=tf.int64)
    return Checkpointer(str(directory), max_to_keep, task=state, global_step=step), state, step


def test_retention_keeps_the_newest(tmp_path):
    ckpt, state, step = _checkpointer(tmp_path, max_to_keep=2)
    for s in (10, 20, 30):
        step.assign(s)
        ckpt.save(s)
    assert [s for s, _ in checkpointer.list_checkpoints(str(tmp_path))] == [20, 30]
    assert not list(tmp_path.glob("ckpt-10*"))
    assert ckpt.latest_step == 30


def test_interrupted_save_is_not_the_latest_and_restore_uses_the_previous(tmp_path):
    ckpt, state, step = _checkpointer(tmp_path)
    state.w.assign([1.0, 2.0, 3.0])
    step.assign(10)
    ckpt.save(10)
    # What a kill in the middle of saving step 20 leaves: data written, no index, state not updated.
    (tmp_path / "ckpt-20_temp").mkdir()
    (tmp_path / "ckpt-20_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    (tmp_path / "ckpt-20.data-00000-of-00001").write_bytes(b"partial")

    fresh, fresh_state, fresh_step = _checkpointer(tmp_path)
    assert fresh.latest_step == 10
    assert fresh.restore_latest().endswith("ckpt-10")
    np.testing.assert_array_equal(fresh_state.w.numpy(), [1.0, 2.0, 3.0])
    assert int(fresh_step.numpy()) == 10
    # The next save of step 20 replaces the debris and becomes the latest.
    fresh_step.assign(20)
    fresh.save(20)
    assert _checkpointer(tmp_path)[0].latest_step == 20


def test_checkpoint_of_another_model_is_a_user_error(tmp_path):
    ckpt, _, step = _checkpointer(tmp_path)
    ckpt.save(10)

    class _Other(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(tf.zeros([4]))

    other = Checkpointer(str(tmp_path), 5, task=_Other(), global_step=tf.Variable(0, dtype=tf.int64))
    with pytest.raises(UserError, match="ckpt-10 does not match this run's model or optimizer") as e:
        other.restore_latest()
    assert "move it away" not in str(e.value)  # a sound checkpoint: the Params differ, not the file
    assert (tmp_path / "ckpt-10.index").exists()
    # Objects on one side only (here a learner the checkpoint does not hold): the same line.
    more = Checkpointer(
        str(tmp_path), 5, task=_State(), global_step=tf.Variable(0, dtype=tf.int64), learner=_Other()
    )
    with pytest.raises(UserError, match="ckpt-10 does not match this run's model or optimizer"):
        more.restore_latest()


def test_restore_task_reports_a_deleted_checkpoint(tmp_path):
    ckpt, state, _ = _checkpointer(tmp_path)
    path = ckpt.save(10)
    for f in tmp_path.glob("ckpt-10*"):
        f.unlink()
    with pytest.raises(checkpointer.CheckpointGoneError):
        checkpointer.restore_task(_State(), path)


def _weights(path):
    values = runner.read_checkpoint(str(path))
    values.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return values


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
        proc = runner.start(
            logdir, data_dir, "--job=controller,trainer", override=long_run, log=tmp_path / "full.log"
        )
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
        rerun = runner.run(
            logdir, data_dir, "--job=controller,trainer", override=f"task.train.max_steps : {kept + 20}"
        )
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert f"resumed from {logdir / 'train' / f'ckpt-{kept}'} at step {kept}" in rerun.stdout
        assert runner.checkpoint_steps(logdir)[-1] == kept + 20
        assert not list((logdir / "train").glob("*_temp"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_failed_save_leaves_no_temp_directory(tmp_path):
    """A write the kernel refuses (the file size limit: EFBIG, as a full disk gives ENOSPC) during a
    real save; the save's shards directory goes with it, the earlier checkpoint stays."""
    import resource

    import tensorflow as tf

    from params.errors import UserError
    from trainer import checkpointer

    weights = tf.Variable(tf.zeros([256, 1024]))
    saver = checkpointer.Checkpointer(str(tmp_path), 5, weights=weights)
    saver.save(1)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(UserError, match="cannot save checkpoint ckpt-2: .*File too large"):
            saver.save(2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert not list(tmp_path.glob("*_temp")), sorted(p.name for p in tmp_path.iterdir())
    assert [step for step, _ in checkpointer.list_checkpoints(str(tmp_path))] == [1]
