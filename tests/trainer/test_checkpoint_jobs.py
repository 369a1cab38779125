"""Evalers and decoders in process: which checkpoints they take, and what they record."""

from __future__ import annotations

import json
import shutil

import pytest

from params import experiment
from params.errors import ConfigError
from tests.trainer import runner
from tests.trainer.conftest import FINISHED, copy_finished_run
from trainer import checkpointer
from trainer.checkpoint_job import SharedTasks
from trainer.decoder_job import Decoder
from trainer.evaler_job import Evaler
from trainer.train_job import TrainLoop


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A logdir with checkpoints at steps 10, 20, 30 (all kept)."""
    logdir = tmp_path_factory.mktemp("jobs") / "run"
    root = _root(data_dir)
    with TrainLoop(root, str(logdir), log=lambda _: None) as loop:
        assert loop.run() == 30
    return logdir


def _copy_run(trained, tmp_path, skip=()):
    """A fresh logdir holding the trained run's checkpoints (minus the files named in ``skip``)."""
    logdir = tmp_path / "run"
    (logdir / "train").mkdir(parents=True)
    for f in (trained / "train").iterdir():
        if not f.name.startswith("events.") and f.name not in skip:
            (logdir / "train" / f.name).write_bytes(f.read_bytes())
    return logdir


def _root(data_dir, override=""):
    text = runner.data_override(data_dir) + "; task.train.save_max_to_keep : 0"
    if override:
        text += f"; {override}"
    return experiment.resolve(runner.MODEL, params_override=text)


def test_evaler_skips_a_checkpoint_deleted_under_it_and_records_the_rest(trained, data_dir, tmp_path):
    logdir = _copy_run(trained, tmp_path, skip=("ckpt-10.index",))  # as if retention deleted it
    messages = []
    evaler = Evaler(_root(data_dir), str(logdir), "dev", log=messages.append)
    assert [s for s, _ in evaler.pending()] == [10, 20, 30]
    assert evaler.run_pending() == 2
    assert any("skipped" in m and "ckpt-10" in m for m in messages)
    assert evaler.done_steps == [20, 30] and evaler.finished
    assert evaler.pending() == []
    evaler.close()
    # A new evaler on the same directory reads the record: nothing left to do.
    again = Evaler(_root(data_dir), str(logdir), "dev", log=messages.append)
    assert again.done_steps == [20, 30] and again.run_pending() == 0
    again.close()


def test_latest_mode_takes_only_the_newest_checkpoint(trained, data_dir, tmp_path):
    root = _root(data_dir, "task.eval.checkpoints : 'latest'")
    logdir = _copy_run(trained, tmp_path)
    evaler = Evaler(root, str(logdir), "test", log=lambda _: None)
    assert evaler.run_pending() == 1
    assert evaler.done_steps == [30]
    record = json.loads((logdir / "eval_test" / "scores.jsonl").read_text())
    assert record["step"] == 30 and set(record["metrics"]) == {"loss", "mae"}
    evaler.close()


def test_eval_metrics_are_averaged_by_weight_over_the_whole_set(trained, data_dir):
    # 24 test examples in batches of 8 and 16 (a partial last batch kept) must give the same average.
    values = {}
    for batch_size in (8, 16):
        root = _root(data_dir, f"input.test.batch_size : {batch_size}; input.test.drop_remainder : False")
        evaler = Evaler(root, str(trained), "test", log=lambda _: None)
        checkpointer.restore_task(evaler.task, str(trained / "train" / "ckpt-30"))
        values[batch_size] = evaler.process(30)
        evaler.close()
    assert values[8]["loss"] == pytest.approx(values[16]["loss"], rel=1e-5)
    assert values[8]["mae"] == pytest.approx(values[16]["mae"], rel=1e-5)


def test_decoder_and_evaler_need_a_known_data_set(trained, data_dir):
    with pytest.raises(ConfigError, match="no data set 'valid'"):
        Decoder(_root(data_dir), str(trained), "valid")
    with pytest.raises(ConfigError, match="repeats forever"):
        Evaler(_root(data_dir, "input.dev.repeat : True"), str(trained), "dev").batches()


def test_samples_per_summary_limits_the_examples_decoded(trained, data_dir, tmp_path):
    logdir = _copy_run(trained, tmp_path)
    root = _root(data_dir, "task.decode.samples_per_summary : 12")  # 12 examples: 2 batches of 8
    decoder = Decoder(root, str(logdir), "test", log=lambda _: None)
    assert decoder.run_pending() == 3
    lines = (logdir / "decoder_test" / "decoded-30.jsonl").read_text().splitlines()
    assert len(lines) == 16
    assert [
        json.loads(x)["metrics"]["num_decoded"]
        for x in (logdir / "decoder_test" / "scores.jsonl").read_text().splitlines()
    ] == [16, 16, 16]
    decoder.close()


def test_jobs_with_equal_task_params_share_one_task_and_its_traces(trained, data_dir, tmp_path):
    """An evaler and a decoder per data set, as one trainer process runs them: one model, one trace
    per kind, and the scores of jobs that each built their own."""
    logdir, alone_dir = _copy_run(trained, tmp_path / "shared"), _copy_run(trained, tmp_path / "alone")
    root = _root(data_dir)
    shared = SharedTasks()
    jobs = [
        kind(root, str(logdir), dataset, log=lambda _: None, shared=shared)
        for dataset in ("dev", "test")
        for kind in (Evaler, Decoder)
    ]
    assert len({id(job.task) for job in jobs}) == 1
    assert jobs[0]._eval_batch is jobs[2]._eval_batch and jobs[1]._decode_batch is jobs[3]._decode_batch
    assert [job.run_pending() for job in jobs] == [3, 3, 3, 3]
    for job in jobs:
        job.close()
    for name in ("eval_dev", "decoder_dev", "eval_test", "decoder_test"):
        alone = {"eval": Evaler, "decoder": Decoder}[name.split("_")[0]](
            root, str(alone_dir), name.split("_")[1], log=lambda _: None
        )
        assert alone.run_pending() == 3
        alone.close()
        assert (logdir / name / "scores.jsonl").read_text() == (alone_dir / name / "scores.jsonl").read_text()
    # A different task (dev's overrides) gets a task of its own.
    other = Evaler(
        _root(data_dir, "input.dev.task_overrides : {'eval.samples_per_summary': 8}"),
        str(logdir),
        "dev",
        log=lambda _: None,
        shared=shared,
    )
    assert other.task is not jobs[0].task
    other.close()


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
