"""tools/dev.py: ``train`` passes extra arguments on after its defaults, and Ctrl-C is one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.runner import REPO, _env


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_dev_train_appends_extra_arguments_to_the_defaults():
    result = _run(
        [
            sys.executable,
            "tools/dev.py",
            "train",
            "--mode=inspect_params",
            "--params_override=task.train.max_steps : 7; task.train.warmup_steps : 1",
        ]
    )
    assert result.returncode == 0, result.stderr
    assert "model : 'image.digits.ConvNet'" in result.stdout
    assert "task.train.max_steps : 7" in result.stdout


@pytest.mark.slow
def test_ctrl_c_during_dev_train_is_one_line_without_a_traceback(tmp_path):
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "tools/dev.py", "train", f"--logdir={tmp_path / 'run'}"],
            cwd=REPO,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        try:
            deadline = time.monotonic() + 240
            while "trainer: watch it with" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the group
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    text = log.read_text()
    assert code == 130, text
    assert "trainer: interrupted" in text and "Traceback" not in text and "KeyboardInterrupt" not in text
