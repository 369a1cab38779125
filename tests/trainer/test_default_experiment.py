"""The README's first command, as written: the default experiment trains, evaluates and decodes.

The run itself is the session fixture ``default_run`` (tests/conftest.py), shared with the other tests
that need a trained default logdir."""

import json

import pytest

from tests.trainer.runner import read_scalars, read_texts


@pytest.mark.slow
def test_default_experiment_trains_end_to_end_to_095_dev_accuracy(default_run):
    logdir = default_run.logdir
    assert f"tensorboard --logdir={logdir}" in default_run.stdout

    for name in ("params.txt", "model_analysis.txt", "train/checkpoint", "train/ckpt-1500.index"):
        assert (logdir / name).exists(), name
    assert "task.train.learning_rate : 0.003" in (logdir / "params.txt").read_text()
    assert "trainable parameters" in (logdir / "model_analysis.txt").read_text()

    dev = read_scalars(logdir / "eval_dev")
    assert dev["accuracy"][1500] >= 0.95, dev["accuracy"]
    train = read_scalars(logdir / "train")
    for tag in ("loss", "learning_rate", "grad_norm", "steps_per_sec", "examples_per_sec", "accuracy"):
        assert tag in train, sorted(train)
    loss = train["loss"]  # the defaults' loss falls tenfold, first summary to last
    assert loss[max(loss)] < loss[min(loss)] / 10, loss
    assert any(
        "task.train.learning_rate" in text
        for texts in read_texts(logdir / "train").values()
        for _, text in texts
    )

    decoder = read_scalars(logdir / "decoder_test")
    assert decoder["accuracy"][1500] >= 0.95
    records = [
        json.loads(line) for line in (logdir / "decoder_test" / "decoded-1500.jsonl").read_text().splitlines()
    ]
    assert len(records) == 270 and set(records[0]) == {"label", "predicted", "probability"}
