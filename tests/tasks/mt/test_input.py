"""Seq2seq inputs: algorithmic tasks, bucketing, packing, and user text files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from params.errors import ConfigError, UserError
from tasks.lm.vocabulary import BOS_ID, EOS_ID, PAD_ID, UNK_ID, vocab_params
from tasks.mt import corpus
from tasks.mt.input import AlgorithmicMtInput, TextMtInput


def _algorithmic(**kwargs) -> AlgorithmicMtInput:
    p = AlgorithmicMtInput.Params().set(num_examples=40, batch_size=8, min_length=2, max_length=6)
    return p.set(**kwargs).instantiate()


def _tokens(row: np.ndarray) -> list[int]:
    """Ids before the first EOS/PAD, BOS dropped."""
    out = []
    for i in row:
        if i in (EOS_ID, PAD_ID):
            break
        if i != BOS_ID:
            out.append(int(i))
    return out


@pytest.mark.parametrize(
    "algorithm, fn",
    [("reverse", lambda s: s[::-1]), ("sort", sorted), ("copy", list), ("noisy_copy", None)],
)
def test_algorithmic_batches(algorithm, fn):
    inp = _algorithmic(algorithm=algorithm)
    batch = next(iter(inp.dataset()))
    src, tgt_ids, labels = (batch[k].numpy() for k in ("src_ids", "tgt_ids", "tgt_labels"))
    assert src.shape == (8, inp.source_positions) and labels.shape == (8, 7)
    for i in range(8):
        source, target = _tokens(src[i]), _tokens(labels[i])
        assert 2 <= len(target) <= 6
        assert src[i][len(source)] == EOS_ID and labels[i][len(target)] == EOS_ID
        np.testing.assert_array_equal(tgt_ids[i][: len(target) + 1], [BOS_ID] + target)
        if fn is None:  # noisy copy: the source is the target with noise symbols (id 19) inserted
            noise = 4 + inp.num_symbols
            assert [s for s in source if s != noise] == target and noise not in target
        else:
            assert fn(source) == target
    np.testing.assert_array_equal(batch["src_paddings"].numpy(), (src == PAD_ID).astype(np.float32))
    np.testing.assert_array_equal(batch["tgt_paddings"].numpy(), (labels == PAD_ID).astype(np.float32))


def test_algorithmic_data_is_deterministic_by_seed():
    def all_sources(**kwargs):
        return np.concatenate([b["src_ids"].numpy() for b in _algorithmic(**kwargs).dataset()])

    np.testing.assert_array_equal(all_sources(), all_sources())
    assert not np.array_equal(all_sources(), all_sources(data_seed=9))


def test_bucketing_pads_batches_to_bucket_boundaries():
    inp = _algorithmic(num_examples=200, bucket_boundaries=[5], min_length=1, drop_remainder=False)
    widths = set()
    total = 0
    for batch in inp.dataset():
        width = batch["src_ids"].shape[1]
        assert batch["tgt_labels"].shape[1] == width
        lengths = (batch["src_paddings"].numpy() == 0).sum(1)
        assert lengths.max() < width + 1 and (lengths < 5).all() == (width == 4)
        widths.add(width)
        total += batch["src_ids"].shape[0]
    assert widths == {4, 7} and total == 200  # boundaries 5 and (longest + 1) = 8, padded to b - 1


def test_packing_keeps_examples_whole_and_apart():
    plain = _algorithmic(num_examples=30, batch_size=1, drop_remainder=False)
    packed = _algorithmic(num_examples=30, batch_size=1, drop_remainder=False, packing=True)
    pairs = [(_tokens(b["src_ids"].numpy()[0]), _tokens(b["tgt_labels"].numpy()[0])) for b in plain.dataset()]
    rows = list(packed.dataset())
    assert len(rows) < len(pairs)
    unpacked = []
    for row in rows:
        r = {k: v.numpy()[0] for k, v in row.items()}
        for seg in range(1, r["src_segment_ids"].max() + 1):
            src = r["src_ids"][r["src_segment_ids"] == seg]
            tgt_ids = r["tgt_ids"][r["tgt_segment_ids"] == seg]
            labels = r["tgt_labels"][r["tgt_segment_ids"] == seg]
            np.testing.assert_array_equal(
                r["src_segment_pos"][r["src_segment_ids"] == seg], np.arange(len(src))
            )
            np.testing.assert_array_equal(tgt_ids[1:], labels[:-1])
            assert src[-1] == EOS_ID and labels[-1] == EOS_ID and tgt_ids[0] == BOS_ID
            unpacked.append((list(src[:-1]), list(labels[:-1])))
        np.testing.assert_array_equal(r["src_paddings"], r["src_segment_ids"] == 0)
    assert sorted(unpacked) == sorted(pairs)  # each pair once (rows hold them longest first)


def test_text_pairs_from_tab_separated_or_parallel_files(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("a b c\tc b a\nb b\tb b\n")
    vocab = vocab_params(size=8, file=str(tsv))
    p = TextMtInput.Params().set(file=str(tsv), vocab=vocab, max_length=4, batch_size=2)
    batch = next(iter(p.instantiate().dataset()))
    b_id, a_id, c_id = 4, 5, 6  # b is the most frequent, then a and c alphabetically
    np.testing.assert_array_equal(batch["src_ids"].numpy()[0], [a_id, b_id, c_id, EOS_ID, PAD_ID])
    np.testing.assert_array_equal(batch["tgt_labels"].numpy()[0], [c_id, b_id, a_id, EOS_ID, PAD_ID])

    src, tgt = tmp_path / "dev.src", tmp_path / "dev.tgt"
    src.write_text("a z\n\nc\n")
    tgt.write_text("z a\nb\nc\n")
    q = TextMtInput.Params().set(source_file=str(src), target_file=str(tgt), vocab=vocab, batch_size=2)
    batch = next(iter(q.instantiate().dataset()))
    np.testing.assert_array_equal(_tokens(batch["src_ids"].numpy()[0]), [a_id, UNK_ID])
    np.testing.assert_array_equal(
        _tokens(batch["tgt_labels"].numpy()[1]), [c_id]
    )  # the empty pair is skipped


def test_sentencepiece_pairs_and_what_inspect_shows(tmp_path):
    """The bundled model's pieces, packed first fit decreasing: inspect_datasets' decoded pairs, packing
    efficiency and length histograms match the input's own rows."""
    tsv = tmp_path / "train.tsv"
    lines = ["The old miller slept.\tPosal fetal sone.", "A fox watched the river at dawn.\tX y."] * 3
    tsv.write_text("".join(line + "\n" for line in lines))
    vocab = vocab_params(size=500, file=str(Path(corpus.DATA, corpus.MODEL)), type="sentencepiece")
    p = TextMtInput.Params().set(file=str(tsv), vocab=vocab, max_length=20, batch_size=8, packing=True)
    p.drop_remainder = False
    inp = p.instantiate()
    sp = inp.vocabulary()
    assert inp.pairs()[0] == (sp.encode("The old miller slept."), sp.encode("Posal fetal sone."))
    rows = next(iter(inp.dataset()))
    real = sum(len(s) + len(t) + 2 for s, t in inp.pairs())
    slots = rows["src_ids"].shape[0] * 2 * 21
    assert rows["src_ids"].shape[0] < 6  # several pairs a row, every token of them in one
    assert sum(int((rows[f"{side}_segment_ids"].numpy() > 0).sum()) for side in ("src", "tgt")) == real
    shown = inp.inspect(num_examples=2)
    assert "'The old miller slept.' -> 'Posal fetal sone.'" in shown
    assert f"packing efficiency (real tokens / slots): {real / slots:.3f} packed" in shown
    assert f"{real / (6 * 42):.3f} one per row" in shown
    assert "source token lengths of 6 pairs (EOS included, cut at 21):" in shown
    assert "target token lengths of 6 pairs" in shown and "#" in shown


def test_text_input_errors_name_the_file(tmp_path):
    tsv = tmp_path / "train.tsv"
    tsv.write_text("a\tb\nno tab here\n")
    vocab = vocab_params(size=8, file=str(tsv))
    with pytest.raises(UserError, match=r"train.tsv:2: expected 'source<TAB>target'"):
        next(iter(TextMtInput.Params().set(file=str(tsv), vocab=vocab).instantiate().dataset()))
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a\nb\n")
    tgt.write_text("a\n")
    with pytest.raises(UserError, match="has 2 lines but .*t.txt has 1"):
        TextMtInput.Params().set(
            source_file=str(src), target_file=str(tgt), vocab=vocab
        ).instantiate().pairs()
    with pytest.raises(UserError, match="missing.tsv' does not exist"):
        TextMtInput.Params().set(file=str(tmp_path / "missing.tsv"), vocab=vocab).instantiate().pairs()
    with pytest.raises(ConfigError, match="either file or both"):
        TextMtInput.Params().set(file=str(tsv), source_file=str(src), vocab=vocab).instantiate()


def test_bad_algorithmic_settings_are_config_errors():
    with pytest.raises(ConfigError, match="algorithm must be one of"):
        _algorithmic(algorithm="shuffle")
    with pytest.raises(ConfigError, match="min_length <= max_length"):
        _algorithmic(min_length=7)
    with pytest.raises(ConfigError, match="bucket_boundaries or packing"):
        _algorithmic(bucket_boundaries=[4], packing=True)
