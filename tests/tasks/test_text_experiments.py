"""Bring-your-own-text experiments: lm.text.TextTransformerLM and mt.text.Transformer read files whose
paths are Params (a tiny bundled file by default) and one gin knob moves every Params naming the file."""

from __future__ import annotations

import gin
import pytest

from params import experiment


@pytest.fixture(autouse=True)
def _clear_gin():
    yield
    gin.clear_config()


@pytest.mark.parametrize("key", ["lm.text.TextTransformerLM", "mt.text.Transformer"])
def test_default_files_are_in_the_repo_and_make_batches(key):
    root = experiment.resolve(key)
    for name in ("train", "dev"):
        batch = next(iter(root.input.get(name).instantiate().dataset()))
        assert batch[next(iter(batch))].shape[0] == root.input.get(name).batch_size
    task = root.task.instantiate()
    assert 4 < task.vocabulary.size <= root.task.vocab.size  # built from the bundled training file


def test_your_own_text_through_gin_knobs(tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("a b c\tc b a\nb c\tc b\n" * 20)
    dev.write_text("a b\tb a\n")
    knobs = [f"Transformer.train_file = '{train}'", f"Transformer.dev_file = '{dev}'"]
    # The default SentencePiece vocabulary stays the bundled model; the files move.
    root = experiment.resolve("mt.text.Transformer", gin_bindings=knobs)
    files = {key: value for key, value in root if key.endswith("file")}
    assert files["input.train.file"] == str(train) and files["input.dev.file"] == str(dev)
    assert files["task.vocab.file"].endswith("tasks/mt/data/stories.model")
    gin.clear_config()
    # level='word' builds the vocabulary from the training file: every vocab.file names it.
    root = experiment.resolve(
        "mt.text.Transformer",
        gin_bindings=[*knobs, "Transformer.level = 'word'", "Transformer.vocab_size = 64"],
    )
    files = {key: value for key, value in root if key.endswith("file")}
    assert {files["task.vocab.file"], files["input.train.vocab.file"], files["input.dev.vocab.file"]} == {
        str(train)
    }
    assert root.task.instantiate().vocabulary.size == 4 + 3
    batch = next(iter(root.input.dev.instantiate().dataset()))
    assert batch["src_ids"].shape[0] == 1
