"""tools.vocab trains SentencePiece models that round-trip text; tools.make_shards writes TFRecord shards
holding every line once."""

from __future__ import annotations

import subprocess
import sys

import tensorflow as tf

from tasks.lm import grammar
from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary, train_model
from tasks.lm.vocabulary import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tests.trainer.runner import REPO, _env


def _corpus(path, n=400):
    import random

    rng = random.Random(3)
    lines = [grammar.sentence(rng) for _ in range(n)]
    path.write_text("".join(line + "\n" for line in lines))
    return lines


def _tool(*args):
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300
    )


def test_the_tools_model_round_trips_text(tmp_path):
    lines = _corpus(tmp_path / "a.txt")
    out = tmp_path / "vocab" / "a.model"
    proc = _tool("tools.vocab", f"--input={tmp_path}/*.txt", "--vocab_size=100", f"--output={out}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"vocab: wrote {out}: 100 pieces (unigram)")
    model = SentencePieceVocabulary(out.read_bytes())
    assert model.size == 100
    for line in lines[:50]:
        ids = model.encode(line)
        assert min(ids) >= 4 and model.decode(ids + [EOS_ID, 7]) == line  # stops at EOS
    assert [model.token(i) for i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID)] == ["<pad>", "<s>", "</s>", "<unk>"]


def test_bpe_round_trips_too_and_a_vocabulary_too_large_is_one_line(tmp_path):
    lines = _corpus(tmp_path / "b.txt")
    model = SentencePieceVocabulary(train_model([str(tmp_path / "b.txt")], 80, "bpe"))
    assert all(model.decode(model.encode(line)) == line for line in lines[:50])
    proc = _tool(
        "tools.vocab", f"--input={tmp_path}/b.txt", "--vocab_size=5000", f"--output={tmp_path}/x.model"
    )
    assert proc.returncode == 1 and proc.stderr.startswith("vocab: error: Vocabulary size too high (5000)")
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.model").exists()


def test_make_shards_deals_every_line_once(tmp_path):
    lines = _corpus(tmp_path / "c.txt", n=50)
    proc = _tool(
        "tools.make_shards", f"--input={tmp_path}/c.txt", f"--output={tmp_path}/s/train", "--num_shards=3"
    )
    assert proc.returncode == 0, proc.stderr
    shards = sorted((tmp_path / "s").iterdir())
    assert [p.name for p in shards] == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]
    feature = {"text": tf.io.FixedLenFeature([], tf.string)}
    read = [
        tf.io.parse_single_example(r, feature)["text"].numpy().decode()
        for p in shards
        for r in tf.data.TFRecordDataset(str(p))
    ]
    assert sorted(read) == sorted(lines)
