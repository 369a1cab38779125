"""A multi-task experiment written as Lingvo writes it (image.digits_multitask.DigitsMultiTask, a tiny
encoder) through the trainer binary: per-task evalers, decoders and summaries, a SIGKILL resumed with
the uninterrupted run's scheduler choices and weights, --model_task_name, and an export per task."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from params.errors import ConfigError
from tests.conftest import made_once
from tests.trainer.runner import REPO, _env, checkpoint_steps, read_checkpoint, read_scalars, wait_for

MODEL = "image.digits_multitask.DigitsMultiTask"
FLAGS = (
    f"--model={MODEL}",
    "--gin_param=DigitsMultiTask.num_layers = 1",
    "--gin_param=DigitsMultiTask.filters = 4",
    "--gin_param=DigitsMultiTask.hidden_dim = 8",
    "--gin_param=DigitsMultiTask.batch_size = 16",
    "--gin_param=DigitsMultiTask.max_steps = 16",
    "--params_override=task.train.save_interval_steps : 8; task.train.summary_interval_steps : 1; "
    "task.train.warmup_steps : 2; task.train.log_interval_steps : 8",
)


def _command(logdir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "trainer", *FLAGS, f"--logdir={logdir}", *flags]


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted run of every job, made once for the test run."""

    def train(directory: Path) -> None:
        directory.mkdir()
        result = _run(*_command(directory / "run"))
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]

    return made_once(tmp_path_factory, "multi_task_run", train) / "run"


def test_every_task_is_evaluated_decoded_and_summarized(reference):
    for job in ("eval_dev", "eval_test", "decoder_dev", "decoder_test"):
        for task in ("digit", "parity"):
            scores = (reference / f"{job}_{task}" / "scores.jsonl").read_text().splitlines()
            assert len(scores) == 2 and '"accuracy"' in scores[-1], (job, task)
    assert not (reference / "eval_dev").exists()
    train = read_scalars(reference / "train")
    assert {"digit/loss", "parity/accuracy", "task_schedule/prob_digit", "task_schedule/task"} <= set(train)
    assert set(train["task_schedule/task"].values()) == {0.0, 1.0}  # both tasks trained


def test_a_rerun_of_the_finished_run_says_so(reference):
    from params import experiment
    from trainer import launcher, preflight

    bindings = [f.split("=", 1)[1] for f in FLAGS if f.startswith("--gin_param=")]
    override = next(f.split("=", 1)[1] for f in FLAGS if f.startswith("--params_override="))
    root = experiment.resolve(MODEL, gin_bindings=bindings, params_override=override)
    assert "holds a finished run" in preflight.finished(root, str(reference), launcher.check_jobs(root, []))


@pytest.mark.slow
def test_a_sigkilled_run_resumes_with_the_same_choices_and_weights(reference, tmp_path):
    logdir = tmp_path / "killed"
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(
            _command(logdir, "--job=controller,trainer"), cwd=REPO, env=_env(), stdout=out, stderr=out
        )
        try:
            wait_for(lambda: 8 in checkpoint_steps(logdir), timeout=300, what="ckpt-8")
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait()
    result = _run(*_command(logdir, "--job=controller,trainer"))
    assert result.returncode == 0 and "done at step 16" in result.stdout, result.stdout + result.stderr
    expected, got = (
        read_checkpoint(str(reference / "train" / "ckpt-16")),
        read_checkpoint(str(logdir / "train" / "ckpt-16")),
    )
    assert sorted(expected) == sorted(got) and any("task_schedule" in name for name in got)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    choices = read_scalars(reference / "train")["task_schedule/task"]
    resumed = read_scalars(logdir / "train")["task_schedule/task"]
    assert {s: resumed[s] for s in range(9, 17)} == {s: choices[s] for s in range(9, 17)}


def test_model_task_name_runs_one_tasks_evaler(reference, tmp_path):
    logdir = tmp_path / "copy"
    shutil.copytree(reference, logdir)
    shutil.rmtree(logdir / "eval_dev_parity")
    before = (logdir / "eval_dev_digit" / "scores.jsonl").read_text()
    result = _run(*_command(logdir, "--job=evaler_dev", "--model_task_name=parity"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert len((logdir / "eval_dev_parity" / "scores.jsonl").read_text().splitlines()) == 2
    assert (logdir / "eval_dev_digit" / "scores.jsonl").read_text() == before


def test_model_task_name_must_name_a_task_of_a_multi_task_model():
    from params import experiment
    from trainer import multi_task_jobs

    root = experiment.resolve(MODEL, gin_bindings=["DigitsMultiTask.filters = 4"])
    assert multi_task_jobs.model_tasks(root, "decoder") == ["digit", "parity"]
    assert multi_task_jobs.model_tasks(root, "evaler", "parity") == ["parity"]
    with pytest.raises(
        ConfigError, match=f"^--model_task_name=colour: no such task; {MODEL} has digit, parity$"
    ):
        multi_task_jobs.model_tasks(root, "evaler", "colour")
    single = experiment.resolve("image.digits.ConvNet")
    assert multi_task_jobs.model_tasks(single, "evaler") == [""]
    with pytest.raises(ConfigError, match="image.digits.ConvNet is a single-task experiment"):
        multi_task_jobs.check_model_task_name(single, "digit")


def test_export_writes_a_signature_per_task(reference, tmp_path):
    target = tmp_path / "export"
    result = _run(sys.executable, "-m", "tools.export", f"--logdir={reference}", f"--export_dir={target}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "signatures: digit, parity, serving_default" in result.stdout
    import tensorflow as tf

    loaded = tf.saved_model.load(str(target))
    images = tf.zeros([3, 8, 8, 1])
    assert loaded.signatures["parity"](images=images)["probabilities"].shape == (3, 2)
    assert loaded.signatures["digit"](images=images)["probabilities"].shape == (3, 10)


def test_an_adaptive_scheduler_on_replicas_is_one_config_error():
    from params import experiment
    from trainer import multi_task_jobs
    from trainer.placement import OnDevice, Replicas

    root = experiment.resolve(MODEL, gin_bindings=["DigitsMultiTask.filters = 4"])
    multi_task_jobs.check_placement(OnDevice(), root.task)
    with pytest.raises(
        ConfigError, match="SimpleAdaptiveScheduler keeps scores .* the Replicas placement"
    ) as e:
        multi_task_jobs.check_placement(object.__new__(Replicas), root.task)
    assert "\n" not in str(e.value)
    two_heads = experiment.resolve(
        "image.digits_multitask.DigitsTwoHeads", gin_bindings=["DigitsTwoHeads.filters = 4"]
    )
    multi_task_jobs.check_placement(object.__new__(Replicas), two_heads.task)  # exponential: no state
