"""Helpers for the trainer's end-to-end tests: run ``python -m trainer`` on the linear experiment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

REPO = Path(__file__).resolve().parents[2]
MODEL = "tests.trainer.linear_experiment.LinearRegression"


def data_override(data_dir: Path) -> str:
    files = {ds: data_dir / f"{ds}.npz" for ds in ("train", "dev", "test")}
    return "; ".join(f"input.{ds}.data_file : '{path}'" for ds, path in files.items())


def trainer_command(logdir: Path, data_dir: Path, *flags: str, override: str = "") -> list[str]:
    text = data_override(data_dir) + (f"; {override}" if override else "")
    return [
        sys.executable,
        "-m",
        "trainer",
        f"--model={MODEL}",
        f"--logdir={logdir}",
        f"--params_override={text}",
        *flags,
    ]


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(logdir: Path, data_dir: Path, *flags: str, override: str = "", timeout: float = 300):
    """Runs the trainer to completion; returns the CompletedProcess (text output)."""
    return subprocess.run(
        trainer_command(logdir, data_dir, *flags, override=override),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(logdir: Path, data_dir: Path, *flags: str, override: str = "", log: Path | None = None):
    """Starts the trainer; stdout and stderr go to ``log`` (default: logdir's sibling file)."""
    log = log or logdir.with_name(logdir.name + f"-{time.monotonic_ns()}.log")
    out = open(log, "w")  # closed by finish()
    proc = subprocess.Popen(
        trainer_command(logdir, data_dir, *flags, override=override),
        cwd=REPO,
        env=_env(),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc.log_path = log
    proc.log_file = out
    return proc


def finish(proc, timeout: float = 300) -> tuple[int, str]:
    """Waits for a started trainer; returns (exit status, its output)."""
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.log_file.close()
    return code, Path(proc.log_path).read_text()


def wait_for(predicate, timeout: float = 120, what: str = "condition", proc=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) before {what}: {Path(proc.log_path).read_text()[-2000:]}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def error_lines(output: str) -> list[str]:
    """The trainer's own error lines (TensorFlow's C++ start-up chatter is not ours)."""
    return [line for line in output.splitlines() if line.startswith("trainer: error:")]


def checkpoint_steps(logdir: Path) -> list[int]:
    state = tf.train.get_checkpoint_state(str(logdir / "train"))
    if state is None:
        return []
    return sorted(int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths)


def read_checkpoint(path: str) -> dict[str, np.ndarray]:
    """Every numeric tensor of a checkpoint (model, learner slots, global step) by name."""
    reader = tf.train.load_checkpoint(path)
    out = {}
    for name, dtype in reader.get_variable_to_dtype_map().items():
        if dtype.is_floating or dtype.is_integer:
            out[name] = np.asarray(reader.get_tensor(name))
    return out


def read_scalars(directory: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the scalar summaries in an event-file directory."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        values = {}
        for event in acc.Tensors(tag):
            array = tf.make_ndarray(event.tensor_proto)
            if array.dtype.kind == "f" and array.shape == ():
                values[event.step] = float(array)
        if values:
            out[tag] = values
    return out


def read_texts(directory: Path) -> dict[str, list[tuple[int, str]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        for event in acc.Tensors(tag):
            array = tf.make_ndarray(event.tensor_proto)
            if array.dtype == object:
                out.setdefault(tag, []).append((event.step, array.item().decode()))
    return out


def signalled(command: list[str], signum: int, after: float) -> subprocess.CompletedProcess:
    """Runs ``command`` and sends ``signum`` ``after`` seconds after launch. A process the signal
    stopped before its first Python instruction (status -signum, or Python's own "Fatal Python
    error" or "Could not import runpy module": no program can answer that early, and on a loaded
    machine the interpreter alone can take 0.2 s) is launched again, up to 5 times, then the test
    is skipped."""
    for _ in range(5):
        proc = subprocess.Popen(
            command,
            cwd=REPO,
            env=_env(),
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


# Each signal a binary answers, its exit code and the words of its line.
SIGNALS = [(signal.SIGTERM, 143, "terminated by SIGTERM"), (signal.SIGINT, 130, "interrupted")]


LINGVO_MODEL = "tests.trainer.lingvo_experiment.LingvoLinear"


def lingvo_command(
    logdir: Path, data_dir: Path, *flags: str, model: str = LINGVO_MODEL, datasets=("train", "dev", "test")
) -> list[str]:
    """The binary on an experiment of tests/trainer/lingvo_experiment.py (Lingvo's Task/Train/Dev/Test);
    the data sets ``datasets`` read from ``data_dir``."""
    data = "; ".join(f"input.{ds}.data_file : '{data_dir / f'{ds}.npz'}'" for ds in datasets)
    return [
        sys.executable,
        "-m",
        "trainer",
        f"--model={model}",
        f"--logdir={logdir}",
        f"--params_override={data}",
        *flags,
    ]


def run_command(command: list[str]) -> subprocess.CompletedProcess:
    """``command`` run to its end in the repository, output captured."""
    return subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
