"""A signal to a binary (the trainer, a tool, a script that installs trainer/signals.py's handler):
one line naming it and exit 143 (SIGTERM) or 130 (SIGINT), whenever it comes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer import runner


@pytest.mark.parametrize("after", [0.2, 1.0, 3.0])
@pytest.mark.parametrize("signum, code, words", runner.SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_start_up_is_one_line(tmp_path, signum, code, words, after):
    """Preemption often comes in the first seconds, while TensorFlow imports."""
    command = [
        sys.executable,
        "-m",
        "trainer",
        "--model=image.digits.ConvNet",
        f"--logdir={tmp_path / 'run'}",
    ]
    result = runner.signalled(command, signum, after)
    assert result.returncode == code, result.stderr[-3000:]
    # inside an import or a trace the trainer says the last checkpoint is intact, later that none
    # was saved yet, and on a quick machine 3 s can be the first step, saved at the signal
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(
        rf"trainer: {words}(; the last saved checkpoint is intact|; no checkpoint was saved yet"
        r"| at step \d+; saved .*; run the same command to resume from it)",
        line,
    ), line


_MANGLED = """
import os, signal, sys
from trainer import signals
signals.install_for_binary("demo")
try:
    os.kill(os.getpid(), int(sys.argv[1]))
    signal.pause()
except BaseException:
    raise ValueError("what TensorFlow's C++ made of the interruption") from None
"""


@pytest.mark.parametrize("signum, code, words", runner.SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_signal_that_comes_back_as_another_error_is_still_one_line(signum, code, words):
    """Raised inside a callback from TensorFlow's C++ (a gradient function while the step is traced,
    seen 3 s into a trainer's start-up), the interruption surfaced as a ValueError from nest."""
    command = [sys.executable, "-c", _MANGLED, str(int(signum))]
    result = subprocess.run(command, cwd=runner.REPO, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.splitlines()) == (code, [f"demo: {words}"]), result.stderr


_NOTE_ASKED_AT_THE_SIGNAL = """
import os, signal, sys
from trainer import signals
state = {"saved": "none yet"}
signals.install_for_binary("demo", note=lambda: f"; saved: {state['saved']}")
state["saved"] = "ckpt-7"  # what the note says is read when the signal comes, not at install
sys.path.insert(0, sys.argv[2])
import slow_module  # the signal arrives inside this import: the fast path, a line and os._exit
"""


@pytest.mark.parametrize("signum, code, words", runner.SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_the_note_is_asked_when_the_signal_arrives(tmp_path, signum, code, words):
    """The trainer's line says whether a checkpoint was saved yet (it said "the last saved checkpoint
    is intact" for a run interrupted while its step was traced, before any save)."""
    (tmp_path / "slow_module.py").write_text(
        f"import os\nos.kill(os.getpid(), {int(signum)})\nimport time\ntime.sleep(30)\n"
    )
    command = [sys.executable, "-c", _NOTE_ASKED_AT_THE_SIGNAL, str(int(signum)), str(tmp_path)]
    result = subprocess.run(command, cwd=runner.REPO, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.splitlines()) == (code, [f"demo: {words}; saved: ckpt-7"]), (
        result.stderr
    )


_TOOLS = [
    ("export", "--logdir=/nonexistent"),
    ("predict", "--export_dir=/nonexistent"),
    ("params_diff", "image.digits.ConvNet", "image.digits.WideConvNet"),
    ("list_models",),
    ("checkpoint_state", "--logdir=/nonexistent"),
    ("memory_trace", "--help"),
    ("benchmark", "--help"),
]  # fmt: skip (every tool that imports TensorFlow; pipeline_sim is plain Python and done in 1 s)


@pytest.mark.parametrize("signum, code, words", runner.SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_every_tool_says_one_line_for_a_signal_during_start_up(signum, code, words):
    """Each tool signalled 1 s after launch, while it imports TensorFlow."""
    for tool, *args in _TOOLS:
        result = runner.signalled([sys.executable, "-m", f"tools.{tool}", *args], signum, 1.0)
        assert (result.returncode, result.stderr.splitlines()) == (code, [f"{tool}: {words}"]), (
            tool,
            result.stdout[-500:],
            result.stderr[-2000:],
        )


@pytest.mark.slow
def test_ctrl_c_before_the_first_checkpoint_says_none_was_saved(tmp_path, data_dir):
    logdir = tmp_path / "interrupted"
    command = runner.lingvo_command(logdir, data_dir)
    command[5] += "; task.train.max_steps : 10000000; task.train.save_interval_steps : 10000000"
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=runner.REPO, env=runner._env(), stdout=out, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 240
            while "trainer: watch it with" not in log.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.1)
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert code == 130, text
    assert "trainer: interrupted; no checkpoint was saved yet" in text, text
    assert "intact" not in text and "Traceback" not in text
