"""What a user sees when something goes wrong: one ``trainer: error:`` line and a non-zero exit,
with the last good checkpoint untouched."""

from __future__ import annotations

import hashlib
import signal

import pytest
import tensorflow as tf

from tests.trainer import runner
from tests.trainer.conftest import copy_finished_run


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.slow
def test_nan_loss_stops_at_that_step_without_saving(tmp_path, data_dir):
    logdir = tmp_path / "run"
    result = runner.run(
        logdir,
        data_dir,
        "--job=controller,trainer",
        override="task.nan_at_step : 12; task.train.save_interval_steps : 5",
    )
    assert result.returncode == 1
    (line,) = runner.error_lines(result.stderr)
    assert "diverged" in line and "at step 12" in line and "ckpt-10" in line
    assert runner.checkpoint_steps(logdir) == [5, 10]
    assert not list((logdir / "train").glob("ckpt-15*"))
    # The kept checkpoint is the good state of step 10: finite and restorable.
    values = runner.read_checkpoint(str(logdir / "train" / "ckpt-10"))
    assert int(values["global_step/.ATTRIBUTES/VARIABLE_VALUE"]) == 10
    assert all(tf.reduce_all(tf.math.is_finite(tf.cast(v, tf.float64))) for v in values.values())
    assert not (logdir / "train" / "LOCK").exists()


@pytest.mark.slow
def test_second_trainer_on_a_logdir_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path, data_dir):
    logdir = tmp_path / "run"
    long_run = "task.train.max_steps : 100000000; task.train.save_interval_steps : 100"
    first = runner.start(logdir, data_dir, "--job=controller,trainer", override=long_run)
    try:
        runner.wait_for(lambda: runner.checkpoint_steps(logdir), what="a checkpoint", proc=first)
        # Stopped, not ended: its LOCK names a live process, and it burns no CPU the second
        # trainer's start-up could use.
        first.send_signal(signal.SIGSTOP)
        second = runner.run(logdir, data_dir, "--job=controller,trainer", override=long_run)
        assert second.returncode == 1
        (line,) = runner.error_lines(second.stderr)
        assert f"pid {first.pid}" in line and "LOCK" in line
        assert first.poll() is None  # the first trainer is unharmed
    finally:
        first.send_signal(signal.SIGKILL)
        runner.finish(first)
    assert (logdir / "train" / "LOCK").exists()  # left behind by the killed trainer

    resumed_at = runner.checkpoint_steps(logdir)[-1]
    third = runner.run(
        logdir, data_dir, "--job=controller,trainer", override=f"task.train.max_steps : {resumed_at + 10}"
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"taking over {logdir / 'train' / 'LOCK'} from pid {first.pid}" in third.stdout
    assert runner.checkpoint_steps(logdir)[-1] == resumed_at + 10
    assert not (logdir / "train" / "LOCK").exists()


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_one_error_and_nothing_is_deleted(tmp_path, finished_run):
    logdir, data_dir = copy_finished_run(finished_run, tmp_path)  # checkpoints at 10 and 20
    data = next((logdir / "train").glob("ckpt-20.data-*"))
    data.write_bytes(b"\x00garbage" * 3)
    before = {d.name: _digests(d) for d in logdir.iterdir() if d.is_dir()}

    # Every job in this process (the evalers' and decoders' writers too): none writes an event file.
    result = runner.run(logdir, data_dir, override="task.train.max_steps : 30")
    assert result.returncode == 1
    (line,) = runner.error_lines(result.stderr)
    assert "ckpt-20" in line and "left in place" in line
    assert {d.name: _digests(d) for d in logdir.iterdir() if d.is_dir()} == before  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    ["missing_data", "unwritable_logdir", "unknown_job", "controller_alone"],
)
def test_user_errors_are_one_line(tmp_path, data_dir, case):
    logdir = tmp_path / "run"
    flags, override, code, expected = [], "", 1, ""
    if case == "missing_data":
        override, expected = f"input.train.data_file : '{tmp_path / 'nope.npz'}'", "nope.npz"
    elif case == "unwritable_logdir":
        (tmp_path / "a_file").write_text("x")
        logdir, expected = tmp_path / "a_file" / "run", "not writable"
    elif case == "unknown_job":
        flags, code, expected = ["--job=evaler_valid"], 2, "evaler_dev"
    else:
        flags, code, expected = ["--job=controller"], 2, "--job=controller,trainer"
    result = runner.run(logdir, data_dir, *flags, override=override)
    assert result.returncode == code, result.stderr[-3000:]
    (line,) = runner.error_lines(result.stderr)
    assert expected in line
    assert "Traceback" not in result.stderr
