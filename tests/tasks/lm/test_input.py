"""LM inputs: the synthetic Markov corpus, user text files, and vocabularies."""

from __future__ import annotations

import numpy as np
import pytest

from params.errors import ConfigError, UserError
from tasks.lm import markov
from tasks.lm.input import SyntheticLmInput, TextLmInput
from tasks.lm.vocabulary import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary, vocab_params


def _synthetic(**kwargs) -> SyntheticLmInput:
    p = SyntheticLmInput.Params().set(num_states=16, seq_length=12, num_sequences=64, batch_size=8)
    return p.set(**kwargs).instantiate()


def test_synthetic_batches_are_shifted_chain_sequences():
    inp = _synthetic()
    batch = next(iter(inp.dataset()))
    ids, labels = batch["ids"].numpy(), batch["labels"].numpy()
    assert ids.shape == labels.shape == (8, 12)
    np.testing.assert_array_equal(ids[:, 0], BOS_ID)
    np.testing.assert_array_equal(ids[:, 1:], labels[:, :-1])
    assert labels.min() >= 4 and labels.max() < inp.vocab_size == 20
    np.testing.assert_array_equal(batch["paddings"].numpy(), 0.0)
    chain = inp.chain()
    states = labels - 4
    assert (chain.transitions[states[:, :-1], states[:, 1:]] > 0).all()  # only real transitions
    np.testing.assert_allclose(
        batch["label_entropy"].numpy(), markov.token_entropies(chain, states), rtol=1e-6
    )
    assert inp.achievable_log_pplx() == pytest.approx(markov.achievable_log_pplx(chain, 12))


def test_synthetic_input_is_deterministic_by_seed():
    def labels(**kwargs):
        return np.concatenate([b["labels"].numpy() for b in _synthetic(**kwargs).dataset()])

    np.testing.assert_array_equal(labels(), labels())
    assert not np.array_equal(labels(), labels(data_seed=2))
    shuffled = labels(shuffle_seed=3)
    assert not np.array_equal(shuffled, labels())
    np.testing.assert_array_equal(shuffled, labels(shuffle_seed=3))


def test_text_input_reads_lines_with_training_vocabulary(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("the cat sat\nthe dog sat\n\nthe cat ran far away today\n")
    dev = tmp_path / "dev.txt"
    dev.write_text("the bird sat\n")
    vocab = vocab_params(size=9, file=str(train))
    p = TextLmInput.Params().set(file=str(dev), vocab=vocab, seq_length=5, batch_size=1, drop_remainder=False)
    batch = next(iter(p.instantiate().dataset()))
    v = Vocabulary.from_params(vocab)
    # By frequency, then alphabetically: the, cat, sat, away, dog (size 9 = 4 specials + 5).
    assert v.size == 9 and v.encode("the cat sat away dog far") == [4, 5, 6, 7, 8, UNK_ID]
    np.testing.assert_array_equal(batch["ids"].numpy()[0], [BOS_ID, 4, UNK_ID, 6, PAD_ID])
    np.testing.assert_array_equal(batch["labels"].numpy()[0], [4, UNK_ID, 6, EOS_ID, PAD_ID])
    np.testing.assert_array_equal(batch["paddings"].numpy()[0], [0, 0, 0, 0, 1])
    # Long lines are cut; empty lines skipped.
    p.file = str(train)
    rows = np.concatenate([b["labels"].numpy() for b in p.instantiate().dataset()])
    assert rows.shape == (3, 5) and EOS_ID not in rows[2]


def test_char_level_vocabulary_round_trips():
    v = Vocabulary.build(["ab ba", "abc"], size=20, level="char")
    ids = v.encode("ab  c")
    assert v.decode(ids + [EOS_ID, 5]) == "ab c"
    assert v.encode("z") == [UNK_ID]


def test_missing_files_are_user_errors(tmp_path):
    vocab = vocab_params(size=10, file=str(tmp_path / "train.txt"))
    p = TextLmInput.Params().set(file=str(tmp_path / "dev.txt"), vocab=vocab)
    with pytest.raises(UserError, match="train.txt' does not exist"):
        next(iter(p.instantiate().dataset()))
    (tmp_path / "train.txt").write_text("a b\n")
    with pytest.raises(UserError, match="dev.txt' does not exist"):
        next(iter(p.instantiate().dataset()))
    with pytest.raises(ConfigError, match="vocab.file"):
        TextLmInput.Params().set(file="x").instantiate()
    with pytest.raises(ConfigError, match="seq_length must be a positive int"):
        _synthetic(seq_length=0)
