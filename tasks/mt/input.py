"""Sequence-to-sequence inputs: algorithmic tasks generated in-process (reverse, sort, copy, noisy
copy) and source/target pairs from a user's files.

Batches hold, for ``B`` examples padded to ``S`` source and ``T`` target positions:
``src_ids [B, S]`` (tokens then EOS), ``src_paddings [B, S]`` (1.0 = padding), ``tgt_ids [B, T]``
(BOS then tokens), ``tgt_labels [B, T]`` (tokens then EOS) and ``tgt_paddings [B, T]``.

Batches are padded to the longest allowed example (one static shape), or, with
``bucket_boundaries``, grouped by length and padded to their bucket's boundary (one shape per
bucket). With ``packing``, several examples share a row: ``{src,tgt}_segment_ids`` (1, 2, ... per
example, 0 for padding) keep attention within each example and ``{src,tgt}_segment_pos`` restart
positions at 0 for each one. Packing is for training and evaluation; decoding needs unpacked rows.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from params.errors import ConfigError, UserError
from params.hyperparams import InstantiableParams, Params
from tasks import packing
from tasks.base_input import BaseInput
from tasks.lm import vocabulary
from tasks.lm.vocabulary import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, Vocabulary

ALGORITHMS = ("reverse", "sort", "copy", "noisy_copy")
Pairs = list[tuple[list[int], list[int]]]


def _positive(p: Params, name: str) -> int:
    value = p.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"input {p.name!r}: {name} must be a positive int, got {value!r}")
    return value


def pack_pairs(
    pairs: Pairs, src_length: int, tgt_length: int, open_rows: int = packing.WINDOW
) -> dict[str, np.ndarray]:
    """First fit decreasing: pairs, longest (source + target) first, each go into the first row where
    both its source (+EOS) and its target (+BOS/EOS) still fit, else start a new row. Every pair is
    in exactly one row; a longer one than a row holds is cut to the row. Only the ``open_rows`` newest
    rows are tried (as ``tasks.packing`` does), so a large corpus packs in linear time."""
    pairs = [(src[: src_length - 1], tgt[: tgt_length - 1]) for src, tgt in pairs]
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    rows: list[list[tuple[list[int], list[int]]]] = []
    used: list[tuple[int, int]] = []
    for i in order:
        src, tgt = pairs[i]
        need = (len(src) + 1, len(tgt) + 1)
        for r in range(max(0, len(used) - open_rows), len(used)):
            if used[r][0] + need[0] <= src_length and used[r][1] + need[1] <= tgt_length:
                break
        else:
            r = len(rows)
            rows.append([])
            used.append((0, 0))
        rows[r].append((src, tgt))
        used[r] = (used[r][0] + need[0], used[r][1] + need[1])
    n = len(rows)
    out = {
        name: np.zeros((n, length), np.int32)
        for name, length in (
            ("src_ids", src_length),
            ("src_segment_ids", src_length),
            ("src_segment_pos", src_length),
            ("tgt_ids", tgt_length),
            ("tgt_labels", tgt_length),
            ("tgt_segment_ids", tgt_length),
            ("tgt_segment_pos", tgt_length),
        )
    }
    for r, row in enumerate(rows):
        s = t = 0
        for segment, (src, tgt) in enumerate(row, start=1):
            src_row = src + [EOS_ID]
            out["src_ids"][r, s : s + len(src_row)] = src_row
            out["src_segment_ids"][r, s : s + len(src_row)] = segment
            out["src_segment_pos"][r, s : s + len(src_row)] = np.arange(len(src_row))
            s += len(src_row)
            tgt_len = len(tgt) + 1
            out["tgt_ids"][r, t : t + tgt_len] = [BOS_ID] + tgt
            out["tgt_labels"][r, t : t + tgt_len] = tgt + [EOS_ID]
            out["tgt_segment_ids"][r, t : t + tgt_len] = segment
            out["tgt_segment_pos"][r, t : t + tgt_len] = np.arange(tgt_len)
            t += tgt_len
    return out


def _add_paddings(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    batch = dict(batch)
    batch["src_paddings"] = tf.cast(tf.equal(batch["src_ids"], PAD_ID), tf.float32)
    batch["tgt_paddings"] = tf.cast(tf.equal(batch["tgt_labels"], PAD_ID), tf.float32)
    return batch


class MtInput(BaseInput):
    """Base of seq2seq inputs: subclasses give ``pairs()`` (source ids, target ids) and the longest
    source and target they may produce (``max_source_length`` / ``max_target_length``)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define(
            "bucket_boundaries",
            [],
            "Group examples by length into buckets [.., b_i) and pad each batch to its bucket's "
            "boundary (empty: pad every batch to the longest allowed example).",
        )
        p.define(
            "packing",
            False,
            "Pack several examples per row (segment ids keep them apart); rows hold "
            "max_source_length + 1 source and max_target_length + 1 target positions.",
        )
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        bounds = list(p.bucket_boundaries)
        if bounds and (sorted(set(bounds)) != bounds or bounds[0] < 2):
            raise ConfigError(
                f"input {p.name!r}: bucket_boundaries must be increasing ints >= 2, "
                f"got {p.bucket_boundaries!r}"
            )
        if bounds and p.packing:
            raise ConfigError(f"input {p.name!r}: use bucket_boundaries or packing, not both")

    def pairs(self) -> Pairs:
        raise NotImplementedError(f"{type(self).__name__}.pairs")

    @property
    def max_source_length(self) -> int:
        raise NotImplementedError

    @property
    def max_target_length(self) -> int:
        raise NotImplementedError

    @property
    def source_positions(self) -> int:
        """Source positions of an unbucketed batch (tokens + EOS)."""
        return self.max_source_length + 1

    @property
    def target_positions(self) -> int:
        """Target positions of an unbucketed batch (tokens + EOS)."""
        return self.max_target_length + 1

    def inspect(self, num_examples: int = 3) -> str:
        """A few decoded pairs, the packing efficiency (real tokens / slots, both sides together) of
        ``pack_pairs`` beside one pair a row, and the source and target length histograms, in file
        (or generation) order."""
        pairs = self.pairs()
        vocab = Vocabulary.from_params(self.params.vocab)
        lines = [f"examples (first {num_examples}, decoded):"]
        for src, tgt in pairs[:num_examples]:
            lines.append(f"  {vocab.decode(src)!r} -> {vocab.decode(tgt)!r} ({len(src)} + {len(tgt)} tokens)")
        widths = (self.source_positions, self.target_positions)
        packed = pack_pairs(pairs, *widths)
        rows = len(packed["src_ids"])
        real = sum(len(s) + len(t) + 2 for s, t in pairs)  # EOS on the source, BOS or EOS on the target
        lines.append(
            f"packing efficiency (real tokens / slots): {real / (rows * sum(widths)):.3f} packed "
            f"({rows} rows of {widths[0]} + {widths[1]}); {real / (len(pairs) * sum(widths)):.3f} one per row"
            + ("" if self.params.packing else " (this input does not pack)")
        )
        for side, index in (("source", 0), ("target", 1)):
            lengths = [len(pair[index]) + 1 for pair in pairs]
            lines.append(
                f"{side} token lengths of {len(pairs)} pairs (EOS included, cut at {widths[index]}):"
            )
            lines += ["  " + line for line in packing.histogram(lengths)]
        return "\n".join(lines) + "\n"

    def examples(self) -> tf.data.Dataset:
        """Unpacked: one variable-length example per element. Packed: one fixed-length row each."""
        pairs = self.pairs()
        if self.params.packing:
            packed = pack_pairs(pairs, self.source_positions, self.target_positions)
            return tf.data.Dataset.from_tensor_slices(packed)

        # Padded arrays sliced back to each example's length: native tf.data ops only, so the
        # iterator can be checkpointed (from_generator's cannot).
        width = {"src": max(len(s) for s, _ in pairs) + 1, "tgt": max(len(t) for _, t in pairs) + 1}
        arrays = {
            "src_ids": np.zeros((len(pairs), width["src"]), np.int32),
            "tgt_ids": np.zeros((len(pairs), width["tgt"]), np.int32),
            "tgt_labels": np.zeros((len(pairs), width["tgt"]), np.int32),
            "src_length": np.array([len(s) + 1 for s, _ in pairs], np.int32),
            "tgt_length": np.array([len(t) + 1 for _, t in pairs], np.int32),
        }
        for i, (src, tgt) in enumerate(pairs):
            arrays["src_ids"][i, : len(src) + 1] = src + [EOS_ID]
            arrays["tgt_ids"][i, : len(tgt) + 1] = [BOS_ID] + tgt
            arrays["tgt_labels"][i, : len(tgt) + 1] = tgt + [EOS_ID]

        def trim(e: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            return {
                "src_ids": e["src_ids"][: e["src_length"]],
                "tgt_ids": e["tgt_ids"][: e["tgt_length"]],
                "tgt_labels": e["tgt_labels"][: e["tgt_length"]],
            }

        return tf.data.Dataset.from_tensor_slices(arrays).map(trim)

    def dataset(self) -> tf.data.Dataset:
        p = self.params
        ds = self.examples()
        if p.num_samples:
            ds = ds.take(p.num_samples)
        if p.shuffle_seed is not None:
            ds = ds.shuffle(p.shuffle_buffer_size, seed=p.shuffle_seed, reshuffle_each_iteration=True)
        if p.repeat:
            ds = ds.repeat()
        if p.packing:
            ds = ds.batch(p.batch_size, drop_remainder=p.drop_remainder)
        elif p.bucket_boundaries:
            bounds = list(p.bucket_boundaries)
            longest = max(self.source_positions, self.target_positions)
            if bounds[-1] <= longest:
                bounds.append(longest + 1)
            ds = ds.bucket_by_sequence_length(
                lambda e: tf.maximum(tf.shape(e["src_ids"])[0], tf.shape(e["tgt_ids"])[0]),
                bucket_boundaries=bounds,
                bucket_batch_sizes=[p.batch_size] * (len(bounds) + 1),
                pad_to_bucket_boundary=True,
                drop_remainder=p.drop_remainder,
            )
        else:
            shapes = {
                "src_ids": [self.source_positions],
                "tgt_ids": [self.target_positions],
                "tgt_labels": [self.target_positions],
            }
            ds = ds.padded_batch(p.batch_size, padded_shapes=shapes, drop_remainder=p.drop_remainder)
        return ds.map(_add_paddings).prefetch(2)


class AlgorithmicMtInput(MtInput):
    """Random symbol strings and a function of them: reverse, sort, copy, or noisy_copy (the source is
    the target with a noise symbol inserted at random; the model must drop it).

    Symbols are token ids 4.. vocab.size-1 (noisy_copy reserves the last one as the noise symbol).
    Lengths are uniform in [min_length, max_length].
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("algorithm", "reverse", f"One of {', '.join(ALGORITHMS)}.")
        p.define(
            "vocab", vocabulary.vocab_params(size=20), "Vocabulary: size - 4 symbols (vocab.file unused)."
        )
        p.define("min_length", 4, "Shortest target, in symbols.")
        p.define("max_length", 12, "Longest target, in symbols.")
        p.define("noise_prob", 0.2, "noisy_copy: probability of a noise symbol before each source symbol.")
        p.define("num_examples", 10000, "Examples in this split.")
        p.define("data_seed", 1, "Seed of the examples (use a different one for each split).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        if p.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"input {p.name!r}: algorithm must be one of {', '.join(ALGORITHMS)}, got {p.algorithm!r}"
            )
        _positive(p, "num_examples")
        if not 1 <= p.min_length <= p.max_length:
            raise ConfigError(
                f"input {p.name!r}: need 1 <= min_length <= max_length, got {p.min_length} and {p.max_length}"
            )
        if self.num_symbols < 2:
            raise ConfigError(f"input {p.name!r}: vocab.size must leave >= 2 symbols after the 4 specials")
        if not 0.0 <= p.noise_prob < 1.0:
            raise ConfigError(f"input {p.name!r}: noise_prob must be in [0, 1), got {p.noise_prob!r}")

    @property
    def num_symbols(self) -> int:
        """Symbols targets are drawn from (noisy_copy keeps one back as noise)."""
        n = self.params.vocab.size - NUM_SPECIAL
        return n - 1 if self.params.algorithm == "noisy_copy" else n

    @property
    def max_source_length(self) -> int:
        p = self.params
        return 2 * p.max_length if p.algorithm == "noisy_copy" else p.max_length

    @property
    def max_target_length(self) -> int:
        return self.params.max_length

    def pairs(self) -> Pairs:
        p = self.params
        rng = np.random.RandomState(p.data_seed)
        noise = NUM_SPECIAL + self.num_symbols
        out = []
        for _ in range(p.num_examples):
            length = rng.randint(p.min_length, p.max_length + 1)
            symbols = (rng.randint(0, self.num_symbols, size=length) + NUM_SPECIAL).tolist()
            if p.algorithm == "reverse":
                out.append((symbols, symbols[::-1]))
            elif p.algorithm == "sort":
                out.append((symbols, sorted(symbols)))
            elif p.algorithm == "copy":
                out.append((symbols, list(symbols)))
            else:
                noisy = []
                for s in symbols:
                    if rng.random_sample() < p.noise_prob:
                        noisy.append(noise)
                    noisy.append(s)
                out.append((noisy, list(symbols)))
        return out


class TextMtInput(MtInput):
    """Source/target pairs from a tab-separated file (``file``: ``source<TAB>target`` per line) or two
    parallel files (``source_file`` and ``target_file``, line by line). One shared vocabulary, built
    from ``vocab.file`` (the training pairs, both sides); longer sequences are cut to max_length."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file", "", "Tab-separated 'source<TAB>target' lines (or use source_file/target_file).")
        p.define("source_file", "", "Source sentences, one per line (with target_file).")
        p.define("target_file", "", "Target sentences, line i translating source line i.")
        p.define(
            "vocab",
            vocabulary.vocab_params(size=1000),
            "Vocabulary shared by both sides, built from vocab.file: the training file, or the "
            "training source and target files separated by a comma.",
        )
        p.define("max_length", 64, "Longest source or target, in tokens (longer ones are cut).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        _positive(p, "max_length")
        if bool(p.file) == bool(p.source_file or p.target_file):
            raise ConfigError(f"input {p.name!r}: set either file or both source_file and target_file")
        if not p.file and not (p.source_file and p.target_file):
            raise ConfigError(f"input {p.name!r}: source_file and target_file must both be set")
        if not p.vocab.file:
            raise ConfigError(f"input {p.name!r}: vocab.file (the training text) must be set")

    @property
    def max_source_length(self) -> int:
        return self.params.max_length

    @property
    def max_target_length(self) -> int:
        return self.params.max_length

    def text_pairs(self) -> list[tuple[str, str]]:
        p = self.params
        return read_pairs(p.file, p.source_file, p.target_file, f"input {p.name!r}")

    def vocabulary(self) -> Vocabulary:
        return Vocabulary.from_params(self.params.vocab)

    def pairs(self) -> Pairs:
        vocab = self.vocabulary()
        n = self.params.max_length
        return [(vocab.encode(s)[:n], vocab.encode(t)[:n]) for s, t in self.text_pairs()]


def read_pairs(file: str, source_file: str, target_file: str, what: str) -> list[tuple[str, str]]:
    """(source, target) text pairs from a tab-separated file or two parallel files."""
    if file:
        pairs = []
        for i, line in enumerate(vocabulary.read_lines(file, what), start=1):
            parts = line.split("\t")
            if len(parts) != 2:
                raise UserError(f"{what}: {file}:{i}: expected 'source<TAB>target', got {len(parts)} fields")
            pairs.append((parts[0], parts[1]))
        return pairs
    sources = vocabulary.read_lines(source_file, what, skip_empty=False)
    targets = vocabulary.read_lines(target_file, what, skip_empty=False)
    if len(sources) != len(targets):
        raise UserError(
            f"{what}: {source_file} has {len(sources)} lines but {target_file} has {len(targets)}"
        )
    return [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()]
