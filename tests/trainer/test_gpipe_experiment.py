"""A pipelined experiment through the real jobs: image.digits.GPipeConvNet in a subprocess."""

import subprocess
import sys

import pytest

from tests.trainer.runner import REPO, _env, read_scalars


@pytest.mark.slow
def test_gpipe_convnet_trains_on_two_logical_devices(tmp_path):
    logdir = tmp_path / "gpipe"
    result = subprocess.run(
        [
            sys.executable, "-m", "trainer", "--model=image.digits.GPipeConvNet", f"--logdir={logdir}",
            "--params_override=task.train.max_steps : 500",
        ],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    analysis = (logdir / "model_analysis.txt").read_text()
    assert "10 layers in 2 stages" in analysis and "/device:CPU:1" in analysis
    assert read_scalars(logdir / "eval_dev")["accuracy"][500] >= 0.95
    assert read_scalars(logdir / "decoder_test")["accuracy"][500] >= 0.95
