"""The jobs over a shared logdir, run as ``python -m trainer`` processes on the linear experiment."""

from __future__ import annotations

import json
import signal

import pytest

from tests.trainer import runner


def _scores(logdir, job):
    return [json.loads(line) for line in (logdir / job / "scores.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_all_jobs_in_one_process_write_summaries_scores_and_files(tmp_path, data_dir):
    logdir = tmp_path / "run"
    result = runner.run(logdir, data_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 30/30 (100%)" in result.stdout
    assert runner.checkpoint_steps(logdir) == [10, 20, 30]

    params_text = (logdir / "params.txt").read_text()
    assert "task.train.max_steps : 30\n" in params_text
    assert f"input.dev.data_file : '{data_dir / 'dev.npz'}'" in params_text
    analysis = (logdir / "model_analysis.txt").read_text()
    assert "task.w" in analysis and "[4, 1]" in analysis
    assert "trainable parameters: 5" in analysis
    assert analysis.rstrip().endswith("linear regression on 4 features")  # the task's own report

    train = runner.read_scalars(logdir / "train")
    for tag in ("loss", "mae", "learning_rate", "grad_norm", "steps_per_sec", "examples_per_sec"):
        assert sorted(train[tag]) == [5, 10, 15, 20, 25, 30], tag
    assert train["learning_rate"][30] == pytest.approx(0.05)
    assert train["examples_per_sec"][30] == pytest.approx(16 * train["steps_per_sec"][30], rel=1e-5)
    texts = runner.read_texts(logdir / "train")
    assert len(texts["params"]) == 1 and "task.train.max_steps : 30" in texts["params"][0][1]

    for job in ("eval_dev", "eval_test"):
        scores = _scores(logdir, job)
        assert [s["step"] for s in scores] == [10, 20, 30]
        events = runner.read_scalars(logdir / job)
        for record in scores:
            for name in ("loss", "mae"):
                assert events[name][record["step"]] == pytest.approx(record["metrics"][name], rel=1e-5)
    dev = _scores(logdir, "eval_dev")
    assert dev[-1]["metrics"]["loss"] < dev[0]["metrics"]["loss"]  # it trained

    for job, size in (("decoder_dev", 64), ("decoder_test", 24)):
        assert [s["step"] for s in _scores(logdir, job)] == [10, 20, 30]
        records = [json.loads(x) for x in (logdir / job / "decoded-30.jsonl").read_text().splitlines()]
        assert len(records) == size
        mae = sum(abs(r["prediction"] - r["target"]) for r in records) / size
        assert runner.read_scalars(logdir / job)["decode_mae"][30] == pytest.approx(mae, rel=1e-4)
    # The evaler and the decoder see the same checkpoint through the same model.
    assert _scores(logdir, "decoder_dev")[-1]["metrics"]["decode_mae"] == pytest.approx(
        _scores(logdir, "eval_dev")[-1]["metrics"]["mae"], rel=1e-4
    )

    again = runner.run(logdir, data_dir)  # finished run: nothing to do, nothing repeated
    assert again.returncode == 0, again.stderr[-3000:]
    assert [s["step"] for s in _scores(logdir, "eval_dev")] == [10, 20, 30]
    assert len(runner.read_texts(logdir / "train")["params"]) == 1


@pytest.mark.slow
def test_each_job_in_its_own_process(tmp_path, data_dir):
    logdir = tmp_path / "run"
    evaler = runner.start(logdir, data_dir, "--job=evaler_dev")
    decoder = runner.start(logdir, data_dir, "--job=decoder_test")
    trainer = runner.start(logdir, data_dir, "--job=controller,trainer")
    outputs = {
        name: runner.finish(proc)
        for name, proc in (("trainer", trainer), ("evaler", evaler), ("decoder", decoder))
    }
    for name, (code, output) in outputs.items():
        assert code == 0, f"{name}: {output[-3000:]}"
    assert not (logdir / "eval_test").exists() and not (logdir / "decoder_dev").exists()
    assert [s["step"] for s in _scores(logdir, "eval_dev")] == [10, 20, 30]
    assert [s["step"] for s in _scores(logdir, "decoder_test")] == [10, 20, 30]
    assert len((logdir / "decoder_test" / "decoded-30.jsonl").read_text().splitlines()) == 24
    assert "waiting for checkpoints" in outputs["evaler"][1]


@pytest.mark.slow
def test_evaler_evaluates_each_checkpoint_exactly_once_across_restarts(tmp_path, data_dir):
    logdir = tmp_path / "run"
    trained = runner.run(
        logdir,
        data_dir,
        "--job=controller,trainer",
        override="task.train.max_steps : 60; task.train.save_max_to_keep : 0",
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert runner.checkpoint_steps(logdir) == [10, 20, 30, 40, 50, 60]

    evaler = runner.start(
        logdir,
        data_dir,
        "--job=evaler_dev",
        override="task.train.max_steps : 60; task.train.save_max_to_keep : 0",
    )
    scores = logdir / "eval_dev" / "scores.jsonl"
    runner.wait_for(lambda: scores.exists(), what="the first evaluation", proc=evaler)
    evaler.send_signal(signal.SIGKILL)
    runner.finish(evaler)
    done_before = [s["step"] for s in _scores(logdir, "eval_dev")]
    assert done_before and done_before == sorted(set(done_before))

    for _ in range(2):  # a restart finishes the rest; one more finds nothing to do
        result = runner.run(
            logdir,
            data_dir,
            "--job=evaler_dev",
            override="task.train.max_steps : 60; task.train.save_max_to_keep : 0",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert [s["step"] for s in _scores(logdir, "eval_dev")] == [10, 20, 30, 40, 50, 60]
    assert len(runner.read_scalars(logdir / "eval_dev")["loss"]) == 6


@pytest.mark.slow
def test_a_run_with_no_trainer_and_no_checkpoint_exits_2_and_writes_nothing(tmp_path, data_dir):
    logdir = tmp_path / "eval_only"
    model = "tests.trainer.lingvo_experiment.LingvoEvalOnly"
    result = runner.run_command(runner.lingvo_command(logdir, data_dir, model=model, datasets=("dev",)))
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("trainer: error: jobs evaler_dev, decoder_dev would wait forever:")
    assert "has no 'train' data set, so no trainer will write one" in line
    assert not logdir.exists()
