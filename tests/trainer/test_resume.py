"""A trainer killed (SIGKILL) or stopped (SIGTERM, saving at its step) mid-run and started again ends
with the weights of an uninterrupted run."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from tests.trainer import runner

STEPS = 6000
OVERRIDE = (
    f"task.train.max_steps : {STEPS}; task.train.save_interval_steps : 500; "
    "task.train.summary_interval_steps : 500; task.train.log_interval_steps : 100"
)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    """The weights of a run of OVERRIDE that nothing stopped, for every claim of this file."""
    straight = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = runner.run(straight, data_dir, "--job=controller,trainer", override=OVERRIDE)
    assert result.returncode == 0, result.stderr[-3000:]
    return _weights(straight / "train" / f"ckpt-{STEPS}")


def _weights(path):
    values = runner.read_checkpoint(str(path))
    values.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    return values


@pytest.mark.slow
def test_sigkill_and_rerun_equals_an_uninterrupted_run(tmp_path, data_dir, uninterrupted):
    resumed = tmp_path / "resumed"
    killed = runner.start(resumed, data_dir, "--job=controller,trainer", override=OVERRIDE)
    runner.wait_for(lambda: runner.checkpoint_steps(resumed), what="the first checkpoint", proc=killed)
    killed.send_signal(signal.SIGKILL)
    code, _ = runner.finish(killed)
    assert code == -signal.SIGKILL
    saved = runner.checkpoint_steps(resumed)
    assert saved and saved[-1] < STEPS, "the kill came too late to test a resume"

    result = runner.run(resumed, data_dir, "--job=controller,trainer", override=OVERRIDE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {resumed / 'train' / f'ckpt-{saved[-1]}'} at step {saved[-1]}" in result.stdout

    expected = uninterrupted
    actual = _weights(resumed / "train" / f"ckpt-{STEPS}")
    assert sorted(actual) == sorted(expected)
    assert any(name.startswith("learner/") for name in expected)  # optimizer slots are compared too
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=1e-6, err_msg=name)
    # The run did learn: the weights moved towards the true ones.
    w = expected["task/vars/w/.ATTRIBUTES/VARIABLE_VALUE"].ravel()
    assert np.max(np.abs(w - [1.5, -2.0, 0.5, 3.0])) < 0.5


@pytest.mark.slow
def test_sigterm_saves_at_the_current_step_and_the_resume_equals_an_uninterrupted_run(
    tmp_path, data_dir, uninterrupted
):
    stopped = tmp_path / "stopped"
    proc = runner.start(stopped, data_dir, "--job=controller,trainer", override=OVERRIDE)
    runner.wait_for(lambda: "step 200/" in proc.log_path.read_text(), what="step 200", proc=proc)
    proc.send_signal(signal.SIGTERM)
    code, output = runner.finish(proc)
    assert code == 143, output[-3000:]
    assert "Traceback" not in output
    saved = runner.checkpoint_steps(stopped)[-1]
    assert 200 <= saved < STEPS
    assert (
        f"trainer: terminated by SIGTERM at step {saved}; saved {stopped / 'train' / f'ckpt-{saved}'}"
        in output
    )
    assert not (stopped / "train" / "LOCK").exists()

    resumed = runner.run(stopped, data_dir, "--job=controller,trainer", override=OVERRIDE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {stopped / 'train' / f'ckpt-{saved}'} at step {saved}" in resumed.stdout
    actual = _weights(stopped / "train" / f"ckpt-{STEPS}")
    assert sorted(actual) == sorted(uninterrupted)
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)
