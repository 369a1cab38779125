"""The checkpoint state file: damaged or missing is an error, never 'nothing saved'; the rebuild;
an interrupted save's leftovers; what evalers say when retention got there first."""

from __future__ import annotations

import pytest

from params import experiment
from params.errors import UserError
from tests.trainer import runner
from trainer import checkpointer
from trainer.evaler_job import Evaler
from trainer.train_job import TrainLoop


def _root(data_dir, override=""):
    text = runner.data_override(data_dir) + "; task.train.save_max_to_keep : 0"
    return experiment.resolve(runner.MODEL, params_override=text + (f"; {override}" if override else ""))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    """A logdir with checkpoints at steps 10, 20, 30."""
    logdir = tmp_path_factory.mktemp("state") / "run"
    with TrainLoop(_root(data_dir), str(logdir), log=lambda _: None) as loop:
        assert loop.run() == 30
    return logdir


def _copy(trained, tmp_path):
    train = tmp_path / "run" / "train"
    train.mkdir(parents=True)
    for f in (trained / "train").iterdir():
        if not f.name.startswith("events."):
            (train / f.name).write_bytes(f.read_bytes())
    return train


def test_damaged_and_missing_state_files_are_errors_naming_the_newest_checkpoint(trained, tmp_path):
    train = _copy(trained, tmp_path)
    assert [s for s, _ in checkpointer.list_checkpoints(str(train))] == [10, 20, 30]
    for damage in (b"\xff\xfe not text", b"model_checkpoint_path: {", b""):
        (train / "checkpoint").write_bytes(damage)
        with pytest.raises(checkpointer.DamagedStateError) as e:
            checkpointer.check_state(str(train))
        assert str(train / "ckpt-30") in str(e.value) and "--rebuild" in str(e.value)
        with pytest.raises(UserError):
            checkpointer.list_checkpoints(str(train))  # evalers too: one line, not 'nothing saved'
    (train / "checkpoint").unlink()
    with pytest.raises(checkpointer.DamagedStateError, match="is missing but 3 checkpoint"):
        checkpointer.check_state(str(train))
    assert checkpointer.list_checkpoints(str(train)) == []  # a reader: maybe the first save is under way

    rebuilt = checkpointer.rebuild_state(str(train))
    assert [s for s, _ in rebuilt] == [10, 20, 30]
    checkpointer.check_state(str(train))
    assert checkpointer.list_checkpoints(str(train))[-1] == (30, str(train / "ckpt-30"))


def test_a_fresh_logdir_is_not_an_error(tmp_path):
    checkpointer.check_state(str(tmp_path / "train"))
    assert checkpointer.list_checkpoints(str(tmp_path / "train")) == []


def test_only_orphan_save_directories_are_removed(tmp_path):
    for name in ("ckpt-40_temp", "ckpt-7_temp"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"partial")
    (tmp_path / "ckpt-8_temp").write_text("a file, not a save directory")
    (tmp_path / "my_temp").mkdir()
    messages = []
    removed = checkpointer.remove_orphan_temps(str(tmp_path), messages.append)
    assert sorted(removed) == [str(tmp_path / "ckpt-40_temp"), str(tmp_path / "ckpt-7_temp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-8_temp", "my_temp"]
    assert len(messages) == 2


def test_truncated_checkpoint_is_one_user_error_for_an_evaler(trained, data_dir, tmp_path):
    train = _copy(trained, tmp_path)
    data = next(train.glob("ckpt-20.data-*"))
    data.write_bytes(data.read_bytes()[:100])
    evaler = Evaler(_root(data_dir), str(train.parent), "dev", log=lambda _: None)
    with pytest.raises(UserError, match="ckpt-20 cannot be restored") as e:
        evaler.run_pending()
    assert "\n" not in str(e.value) and evaler.done_steps == [10]
    evaler.close()


def test_evaler_names_the_checkpoints_retention_deleted_before_it_scored_them(trained, data_dir, tmp_path):
    train = _copy(trained, tmp_path)
    messages = []
    evaler = Evaler(_root(data_dir), str(train.parent), "dev", log=messages.append)
    assert [s for s, _ in evaler.pending()] == [10, 20, 30]  # seen, not yet scored
    for step in (10, 20):  # retention deletes them, as tf.train.CheckpointManager does
        for f in train.glob(f"ckpt-{step}.*"):
            f.unlink()
    checkpointer.rebuild_state(str(train))
    assert evaler.run_pending() == 1
    assert any("skipped 2 checkpoint(s) (steps 10, 20): deleted by retention" in m for m in messages), (
        messages
    )
    evaler.close()
    # A new evaler that never saw them infers them from save_interval_steps.
    messages.clear()
    (train.parent / "eval_dev" / "scores.jsonl").unlink()
    fresh = Evaler(_root(data_dir), str(train.parent), "dev", log=messages.append)
    assert fresh.run_pending() == 1
    assert any("steps 10, 20" in m for m in messages), messages
    fresh.close()
