"""A trainer killed mid-run and started again ends with the weights of an uninterrupted run."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from tests.trainer import runner

STEPS = 6000
OVERRIDE = (
    f"task.train.max_steps : {STEPS}; task.train.save_interval_steps : 500; "
    "task.train.summary_interval_steps : 500; task.train.log_interval_steps : 500"
)


@pytest.mark.slow
def test_sigkill_and_rerun_equals_an_uninterrupted_run(tmp_path, data_dir):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = runner.run(straight, data_dir, "--job=controller,trainer", override=OVERRIDE)
    assert result.returncode == 0, result.stderr[-3000:]

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

    expected = runner.read_checkpoint(str(straight / "train" / f"ckpt-{STEPS}"))
    actual = runner.read_checkpoint(str(resumed / "train" / f"ckpt-{STEPS}"))
    expected.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    actual.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
    assert sorted(actual) == sorted(expected)
    assert any(name.startswith("learner/") for name in expected)  # optimizer slots are compared too
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=1e-6, err_msg=name)
    # The run did learn: the weights moved towards the true ones.
    w = expected["task/vars/w/.ATTRIBUTES/VARIABLE_VALUE"].ravel()
    assert np.max(np.abs(w - [1.5, -2.0, 0.5, 3.0])) < 0.5
