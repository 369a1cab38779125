"""CorpusLmInput: text files or TFRecord shards, tokenized in the graph by a SentencePiece model, packed
(or bucketed, or padded) without losing or repeating a sentence."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from params import experiment
from params.errors import ConfigError
from tasks.lm.input import CorpusLmInput
from tasks.lm.params.text import DATA
from tasks.lm.sentencepiece_vocab import SentencePieceVocabulary, read_model
from tools.make_shards import write_shards

DEV = f"{DATA}/stories_dev.txt"
MODEL = f"{DATA}/stories.model"


def _params(**kw):
    p = CorpusLmInput.Params().set(
        name="train", file_pattern=DEV, seq_length=256, batch_size=4, shuffle_buffer_size=64
    )
    p.vocab.set(file=MODEL, size=160)
    return p.set(**kw)


def _sentences(rows, vocab):
    """The sentences of packed rows, decoded segment by segment."""
    out = []
    for labels, segments in rows:
        for seg in range(1, int(segments.max()) + 1):
            out.append(vocab.decode(labels[segments == seg]))
    return out


def _epoch(p):
    return [(b["labels"].numpy(), b["segment_ids"].numpy()) for b in p.instantiate().dataset()]


def _rows(batches):
    return [(labels[i], seg[i]) for labels, seg in batches for i in range(len(labels))]


def _lines(path):
    return [line.strip() for line in open(path, encoding="utf-8") if line.strip()]


def test_an_epoch_of_packed_rows_holds_every_sentence_once():
    vocab = SentencePieceVocabulary(read_model(MODEL))
    p = _params(shuffle_seed=5, drop_remainder=False)
    seen = _sentences(_rows(_epoch(p)), vocab)
    assert collections.Counter(seen) == collections.Counter(_lines(DEV))


def test_tfrecord_shards_read_in_parallel_give_the_same_sentences(tmp_path):
    paths, count = write_shards([DEV], str(tmp_path / "dev"), num_shards=3)
    assert len(paths) == 3 and count == len(_lines(DEV))
    vocab = SentencePieceVocabulary(read_model(MODEL))
    p = _params(file_pattern=str(tmp_path / "dev-*.tfrecord"), file_format="tfrecord", drop_remainder=False)
    assert collections.Counter(_sentences(_rows(_epoch(p)), vocab)) == collections.Counter(_lines(DEV))


def test_sync_workers_share_every_global_batch():
    p = _params(shuffle_seed=5, repeat=True)
    whole = p.instantiate().dataset()
    workers = []
    for index in range(2):
        inp = p.instantiate()
        inp.shard(index, 2)
        workers.append(iter(inp.dataset()))
    for batch in whole.take(3):
        halves = [next(w)["ids"].numpy() for w in workers]
        together = np.stack([halves[i % 2][i // 2] for i in range(4)])  # examples index, index+count, ...
        np.testing.assert_array_equal(together, batch["ids"].numpy())


def test_packing_beats_padding_on_the_bundled_corpus():
    root = experiment.resolve("lm.text.TextTransformerLM")
    train = root.input.train.copy().set(file_pattern=DEV, repeat=False, shuffle_seed=None)  # train's lengths
    packed = np.concatenate([b["paddings"].numpy() for b in train.instantiate().dataset()])
    padded = np.concatenate(
        [b["paddings"].numpy() for b in train.copy().set(batching="pad").instantiate().dataset()]
    )
    assert 1 - packed.mean() >= 0.9 > 0.5 > 1 - padded.mean()


def test_bucketing_groups_similar_lengths():
    batches = list(_params(batching="bucket", bucket_boundaries=[16, 32]).instantiate().dataset())
    for b in batches:
        lengths = (b["paddings"].numpy() == 0).sum(axis=1)
        assert b["ids"].shape[1] == lengths.max()  # padded to its own longest only
        assert len({int(np.digitize(n, [16, 32])) for n in lengths}) == 1


def test_vocabulary_size_must_match_the_model_and_the_model_is_kept():
    with pytest.raises(ConfigError, match="vocab.size = 160"):
        p = _params()
        p.vocab.size = 100
        next(iter(p.instantiate().dataset()))
    assert _params().instantiate().files_to_keep() == [MODEL]


def test_a_cached_corpus_gives_the_batches_of_the_streamed_files(tmp_path):
    paths, _ = write_shards([DEV], str(tmp_path / "dev"), num_shards=2)  # interleaved: order matters
    p = _params(file_pattern=",".join(paths), shuffle_seed=5, repeat=True, shuffle_buffer_size=32)
    cached, streamed = p.instantiate(), p.copy().set(max_cached_bytes=0).instantiate()
    assert cached.cached_pieces() is not None and streamed.cached_pieces() is None
    assert p.copy().set(max_cached_bytes=100).instantiate().cached_pieces() is None  # over the limit
    with pytest.raises(ConfigError, match="max_cached_bytes must be an int >= 0"):
        p.copy().set(max_cached_bytes=-1).instantiate()
    rows = sum(
        len(b["ids"]) for b in p.copy().set(repeat=False, drop_remainder=False).instantiate().dataset()
    )
    for a, b in zip(cached.dataset().take(rows // 4 + 5), streamed.dataset()):  # into a second epoch
        for key in a:
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())


@pytest.mark.parametrize("max_cached_bytes", [16 << 20, 0], ids=["cached", "streamed"])
def test_sentences_longer_than_seq_length_are_counted(tmp_path, max_cached_bytes):
    """What a user reads before a cut sentence trains: the count in the trainer's start (a cached corpus,
    counted as it is tokenized) and in --mode=inspect_datasets (either)."""
    lines = ["the old miller slept", "a fox " * 40, "the river", "the dog ran " * 30]
    (tmp_path / "corpus.txt").write_text("".join(f"{line.strip()}\n" for line in lines))
    gen = _params(file_pattern=str(tmp_path / "corpus.txt"), seq_length=16, max_cached_bytes=max_cached_bytes)
    gen = gen.instantiate()
    assert gen.cut_sentences() == (2, 4)
    line = "input 'train': 2 of 4 sentences are longer than seq_length 16"
    assert gen.notes()[0].startswith(line) if max_cached_bytes else gen.notes() == []
    assert line in gen.inspect()


def test_inspect_datasets_marks_a_sentencepiece_vocabularys_level_unused():
    from tasks.lm.vocabulary import unused_level_marked

    text = experiment.resolve("lm.text.TextTransformerLM").input.train.to_text()
    assert "vocab.level : 'word'  # unused: a sentencepiece vocabulary's tokens are its pieces" in (
        unused_level_marked(text).splitlines()
    )
    built = experiment.resolve(
        "lm.text.TextTransformerLM",
        gin_bindings=["TextTransformerLM.level = 'word'", "TextTransformerLM.vocab_size = 200"],
    )
    assert unused_level_marked(built.input.train.to_text()) == built.input.train.to_text()


TRAIN = f"{DATA}/stories_train.txt"


# (sentences, batch size, the step saved): corpora smaller and larger than the packing window of 1024
# sentences, each saved where the pipeline (which reads ahead: the row shuffle, the prefetch) has a
# batch of sentences that read the last of an epoch: any step of a corpus below the window, a few
# steps an epoch of one above it.
SMALL_CORPORA = [(40, 2, 4), (695, 8, 60), (1100, 16, 57), (1724, 16, 85)]


@pytest.mark.parametrize("lines, batch_size, stop", SMALL_CORPORA)
def test_a_restored_iterator_reads_the_batches_of_an_uninterrupted_one(tmp_path, lines, batch_size, stop):
    """An iterator saved and restored reads on, past the next epoch's start, as the uninterrupted one
    does: the epochs after a restore reshuffled as in one run."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line + "\n" for line in _lines(TRAIN)[:lines]))
    p = _params(file_pattern=str(corpus), seq_length=64, batch_size=batch_size, shuffle_seed=5, repeat=True)
    p.set(shuffle_buffer_size=10000)
    epoch = sum(1 for _ in p.copy().set(repeat=False).instantiate().dataset())  # batches of one epoch
    end = stop + epoch + 40  # past the next epoch's start, and the 64 rows the row shuffle reads ahead
    stream = p.instantiate()
    iterator = iter(stream.dataset())
    straight = [next(iterator)["ids"].numpy() for _ in range(stop)]
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    straight += [next(iterator)["ids"].numpy() for _ in range(stop, end)]
    restored = iter(stream.dataset())
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    for step in range(stop, end):
        np.testing.assert_array_equal(next(restored)["ids"].numpy(), straight[step], err_msg=f"step {step}")
