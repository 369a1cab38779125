"""lm.text.TextTransformerLM end to end through the binaries: a run on a small corpus stopped in its
second epoch and resumed reads the rows of an uninterrupted run, epochs on; the SentencePiece model
is kept in the logdir (the export still works once the original is gone); the exported SavedModel
turns raw strings into strings in a fresh process that only imports tensorflow and tensorflow_text."""

from __future__ import annotations

import collections
import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from params.hyperparams import Params
from tasks.lm import grammar
from tasks.lm.params.text import DATA
from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary, read_model
from tests.trainer.runner import REPO, _env

pytestmark = pytest.mark.slow

SERVE = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401 (registers the SentencePiece ops the SavedModel uses)
fn = tf.saved_model.load(sys.argv[1]).signatures["generate"]
out = fn(text=tf.constant(json.loads(sys.argv[2])))
print(json.dumps({"text": [t.decode() for t in out["text"].numpy()], "ids": out["ids"].numpy().tolist()}))
"""


def _run(args, timeout=300):
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _sentences(n=40):
    rng, out = random.Random(7), []
    while len(out) < n:
        s = grammar.sentence(rng)
        if s not in out and len(s.split()) <= 14:
            out.append(s)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("text_lm")
    lines = _sentences()
    (tmp / "corpus.txt").write_text("".join(s + "\n" for s in lines))
    model = tmp / "my.model"
    shutil.copy(f"{DATA}/stories.model", model)
    logdir = tmp / "run"

    def train(max_steps):
        return _run(
            [
                "-m",
                "trainer",
                "--model=lm.text.TextTransformerLM",
                f"--logdir={logdir}",
                "--job=controller,trainer",
                f"--gin_param=TextTransformerLM.train_files='{tmp / 'corpus.txt'}'",
                f"--gin_param=TextTransformerLM.dev_files='{tmp / 'corpus.txt'}'",
                f"--gin_param=TextTransformerLM.vocab_file='{model}'",
                "--gin_param=TextTransformerLM.model_dim=16",
                "--gin_param=TextTransformerLM.num_heads=2",
                "--gin_param=TextTransformerLM.hidden_dim=32",
                "--gin_param=TextTransformerLM.num_layers=1",
                "--gin_param=TextTransformerLM.batch_size=1",
                "--gin_param=TextTransformerLM.seq_length=64",
                "--gin_param=TextTransformerLM.warmup_steps=1",
                f"--gin_param=TextTransformerLM.max_steps={max_steps}",
            ]
        )

    train_params = _train_input(tmp / "corpus.txt", model)
    rows = sum(1 for _ in train_params.copy().set(repeat=False).instantiate().dataset())  # an epoch's
    # The row shuffle reads 64 rows (here several epochs) ahead: the end is well past it.
    stop = rows + rows // 2
    end = stop + 64 + 2 * rows
    first = train(stop)
    second = train(end)
    return {"tmp": tmp, "logdir": logdir, "lines": lines, "stop": stop, "end": end, "logs": (first, second)}


def _train_input(corpus, model):
    """The train input Params the trainer resolves from the same knobs (row count of an epoch)."""
    import gin

    from params import experiment

    knobs = [f"train_files='{corpus}'", f"vocab_file='{model}'", "batch_size=1", "seq_length=64"]
    try:
        return experiment.resolve(
            "lm.text.TextTransformerLM", gin_bindings=[f"TextTransformerLM.{k}" for k in knobs]
        ).input.train
    finally:
        gin.clear_config()


def _decoded(batches, vocab):
    out = []
    for b in batches:
        labels, segments = b["labels"].numpy()[0], b["segment_ids"].numpy()[0]
        out += [vocab.decode(labels[segments == s]) for s in range(1, int(segments.max()) + 1)]
    return out


def test_a_resumed_run_reads_the_rows_of_an_uninterrupted_one(run):
    first, second = run["logs"]
    stop, end = run["stop"], run["end"]
    assert f"resumed from {run['logdir']}/train/ckpt-{stop} at step {stop}" in second
    root = Params.from_text((run["logdir"] / "params.txt").read_text())
    vocab = SentencePieceVocabulary(read_model(root.input.train.vocab.file))
    fresh = list(root.input.train.instantiate().dataset().take(end + 1))
    # The first process trained on the stream's first `stop` rows; the second went on from the
    # iterator its checkpoint holds: read that position back, as the second process restored it.
    resumed = iter(root.input.train.instantiate().dataset())
    tf.train.Checkpoint(iterator=resumed).read(str(run["logdir"] / f"train/ckpt-{stop}")).expect_partial()
    for step in range(stop, end):
        np.testing.assert_array_equal(next(resumed)["ids"].numpy(), fresh[step]["ids"].numpy(), f"{step}")
    # And the second process consumed exactly those rows: its final position is the uninterrupted one's.
    final = iter(root.input.train.instantiate().dataset())
    tf.train.Checkpoint(iterator=final).read(str(run["logdir"] / f"train/ckpt-{end}")).expect_partial()
    np.testing.assert_array_equal(next(final)["ids"].numpy(), fresh[end]["ids"].numpy())
    assert collections.Counter(_decoded(fresh[:end], vocab)).keys() == set(run["lines"])  # all trained on


def test_the_exported_lm_serves_raw_strings_after_the_vocabulary_moved(run):
    kept = run["logdir"] / "my.model"
    assert kept.read_bytes() == (run["tmp"] / "my.model").read_bytes()  # copied beside params.txt
    (run["tmp"] / "my.model").unlink()  # the original is gone: export uses the run's copy
    out = _run(["-m", "tools.export", f"--logdir={run['logdir']}", "--dataset=dev"])
    assert "generate" in out
    export_dir = next((run["logdir"] / "export").iterdir())
    prompts = ["The old miller", "A fox watched"]
    out = _run(["-I", "-c", SERVE, str(export_dir), json.dumps(prompts)])
    # The JSON line is stdout's; TensorFlow's start-up lines on stderr may come after it.
    served = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    vocab = SentencePieceVocabulary(kept.read_bytes())
    assert len(served["text"]) == 2
    for prompt, ids, text in zip(prompts, served["ids"], served["text"]):
        pieces = vocab.encode(prompt)  # the graph tokenized the prompt as sentencepiece does in Python
        assert ids[: len(pieces)] == pieces
        assert text == vocab.decode(ids[len(pieces) :])  # and detokenized the continuation
