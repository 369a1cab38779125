"""Faults around saved state: a damaged or missing state file, a truncated checkpoint under an
evaler, an interrupted save's leftovers, a full disk, SIGTERM. Each ends in one line and leaves every
saved checkpoint as it was; the documented recovery then resumes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.trainer import runner
from tests.trainer.conftest import FINISHED, copy_finished_run

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
        result = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 50")
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
    refused = _tool(logdir, "--rebuild")
    assert refused.returncode == 1 and "another trainer" in refused.stderr
    assert not state.exists()
    (train / "LOCK").unlink()

    rebuilt = _tool(logdir, "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert f"latest {train / 'ckpt-20'}" in rebuilt.stdout
    resumed = runner.run(logdir, data_dir, TRAIN, override="task.train.max_steps : 50")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {train / 'ckpt-20'} at step 20" in resumed.stdout
    assert f"removed {orphan}, left by a save that was interrupted" in resumed.stdout
    assert not orphan.exists() and (train / "ckpt-41_temp.keep").exists()
    assert runner.checkpoint_steps(logdir)[-1] == 50


@pytest.mark.slow
def test_truncated_checkpoint_under_an_evaler_is_one_line(tmp_path, finished_run):
    logdir, data_dir = copy_finished_run(finished_run, tmp_path)
    shutil.rmtree(logdir / "eval_dev")  # as if no evaler_dev had run: it scores ckpt-10, then ckpt-20
    data = next((logdir / "train").glob("ckpt-20.data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    result = runner.run(logdir, data_dir, "--job=evaler_dev", override=FINISHED)
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


def _signalled(command: list[str], signum: int, after: float) -> subprocess.CompletedProcess:
    """Runs ``command`` and sends ``signum`` ``after`` seconds after launch. A process the signal
    stopped before its first Python instruction (status -signum, or Python's own "Fatal Python
    error" or "Could not import runpy module": no program can answer that early, and on a loaded
    machine the interpreter alone can take 0.2 s) is launched again, up to 5 times, then the test
    is skipped."""
    for _ in range(5):
        proc = subprocess.Popen(
            command,
            cwd=runner.REPO,
            env=runner._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(after)
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        python_stopped = "Fatal Python error" in err or "Could not import runpy module" in err
        if proc.returncode != -signum and not python_stopped:
            return subprocess.CompletedProcess(command, proc.returncode, out, err)
    pytest.skip(f"{command[2]}: the interpreter had not started {after} s after launch in 5 tries (load)")


_SIGNALS = [(signal.SIGTERM, 143, "terminated by SIGTERM"), (signal.SIGINT, 130, "interrupted")]


@pytest.mark.parametrize("after", [0.2, 1.0, 3.0])
@pytest.mark.parametrize("signum, code, words", _SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_start_up_is_one_line(tmp_path, signum, code, words, after):
    """Preemption often comes in the first seconds, while TensorFlow imports."""
    command = [
        sys.executable,
        "-m",
        "trainer",
        "--model=image.digits.ConvNet",
        f"--logdir={tmp_path / 'run'}",
    ]
    result = _signalled(command, signum, after)
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


@pytest.mark.parametrize("signum, code, words", _SIGNALS, ids=["SIGTERM", "SIGINT"])
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


@pytest.mark.parametrize("signum, code, words", _SIGNALS, ids=["SIGTERM", "SIGINT"])
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


@pytest.mark.parametrize("signum, code, words", _SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_local_cluster_forwards_a_signal_and_says_so_once(tmp_path, signum, code, words):
    """Its own stderr is one line; each process's line comes on stdout with the process's prefix."""
    command = [sys.executable, "-m", "tools.local_cluster", "--workers=2", "--model=image.digits.ConvNet"]
    result = _signalled([*command, f"--logdir={tmp_path / 'run'}"], signum, 3.0)
    assert result.returncode == code, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"local_cluster: {words}")


_TOOLS = [
    ("export", "--logdir=/nonexistent"),
    ("predict", "--export_dir=/nonexistent"),
    ("params_diff", "image.digits.ConvNet", "image.digits.WideConvNet"),
    ("list_models",),
    ("checkpoint_state", "--logdir=/nonexistent"),
    ("memory_trace", "--help"),
    ("benchmark", "--help"),
]  # fmt: skip (every tool that imports TensorFlow; pipeline_sim is plain Python and done in 1 s)


@pytest.mark.parametrize("signum, code, words", _SIGNALS, ids=["SIGTERM", "SIGINT"])
def test_every_tool_says_one_line_for_a_signal_during_start_up(signum, code, words):
    """Each tool signalled 1 s after launch, while it imports TensorFlow."""
    for tool, *args in _TOOLS:
        result = _signalled([sys.executable, "-m", f"tools.{tool}", *args], signum, 1.0)
        assert (result.returncode, result.stderr.splitlines()) == (code, [f"{tool}: {words}"]), (
            tool,
            result.stdout[-500:],
            result.stderr[-2000:],
        )


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


def _tree(logdir):
    return {str(p.relative_to(logdir)): p.stat().st_mtime_ns for p in sorted(logdir.rglob("*"))}


@pytest.mark.slow
def test_a_finished_run_asked_again_says_so_and_writes_nothing(tmp_path, finished_run):
    logdir, data_dir = copy_finished_run(finished_run, tmp_path)
    before = _tree(logdir)
    again = runner.run(logdir, data_dir, override=FINISHED)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.splitlines() == [
        f"trainer: {logdir} holds a finished run (checkpoint at step 20, task.train.max_steps 20; every "
        "job done): nothing to do, nothing written (raise task.train.max_steps to continue it)"
    ]
    assert _tree(logdir) == before  # no new events file, nothing touched
