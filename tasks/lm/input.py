"""Language-model inputs: a synthetic Markov-chain corpus with a known entropy rate, and one
sentence per line of a user's text file.

Every example has ``seq_length`` positions: ``ids`` (BOS then the tokens), ``labels`` (the tokens,
then EOS for text), ``paddings`` (1.0 past the end). The synthetic input adds ``label_entropy``: the
entropy of the distribution each label was drawn from, so the task can report how far its
log-perplexity is from the best achievable one.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from params.errors import ConfigError
from params.hyperparams import InstantiableParams
from tasks import packing
from tasks.base_input import BaseInput
from tasks.lm import markov, vocabulary
from tasks.lm.vocabulary import BOS_ID, EOS_ID, NUM_SPECIAL, PAD_ID, Vocabulary


def _check_positive(p: InstantiableParams, name: str) -> None:
    value = p.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"input {p.name!r}: {name} must be a positive int, got {value!r}")


class SyntheticLmInput(BaseInput):
    """Sequences from a random sparse Markov chain (``tasks.lm.markov``); chain state s is token id
    s + 4 (after the special ids)."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("num_states", 32, "Symbols of the chain (vocabulary size is num_states + 4).")
        p.define("num_successors", 4, "Successors of each state (with random probabilities).")
        p.define("concentration", 1.0, "Dirichlet concentration of each state's successor probabilities.")
        p.define("chain_seed", 1234, "Seed of the chain (the same for every split).")
        p.define("seq_length", 32, "Tokens per sequence.")
        p.define("num_sequences", 10000, "Sequences in this split.")
        p.define("data_seed", 1, "Seed of the sequences (use a different one for each split).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        for name in ("num_states", "num_successors", "seq_length", "num_sequences"):
            _check_positive(self.params, name)

    @property
    def vocab_size(self) -> int:
        return self.params.num_states + NUM_SPECIAL

    def chain(self) -> markov.MarkovChain:
        p = self.params
        return markov.make_markov_chain(p.num_states, p.num_successors, p.chain_seed, p.concentration)

    def achievable_log_pplx(self) -> float:
        """The best expected per-token log-perplexity (nats) on this input's sequences."""
        return markov.achievable_log_pplx(self.chain(), self.params.seq_length)

    def arrays(self) -> dict[str, np.ndarray]:
        """The whole split as NumPy arrays ``[num_sequences, seq_length]``."""
        p = self.params
        chain = self.chain()
        states = markov.sample(chain, p.num_sequences, p.seq_length, p.data_seed)
        labels = (states + NUM_SPECIAL).astype(np.int32)
        ids = np.concatenate([np.full((p.num_sequences, 1), BOS_ID, np.int32), labels[:, :-1]], axis=1)
        return {
            "ids": ids,
            "labels": labels,
            "paddings": np.zeros(labels.shape, np.float32),
            "label_entropy": markov.token_entropies(chain, states).astype(np.float32),
        }

    def examples(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.arrays())


def encode_lm_lines(lines: list[str], vocab: Vocabulary, seq_length: int) -> dict[str, np.ndarray]:
    """One example per line: ids = BOS + tokens, labels = tokens + EOS, cut and padded to seq_length."""
    n = len(lines)
    ids = np.full((n, seq_length), PAD_ID, np.int32)
    labels = np.full((n, seq_length), PAD_ID, np.int32)
    paddings = np.ones((n, seq_length), np.float32)
    for row, line in enumerate(lines):
        tokens = vocab.encode(line)
        target = (tokens + [EOS_ID])[:seq_length]
        source = ([BOS_ID] + tokens)[: len(target)]
        ids[row, : len(source)] = source
        labels[row, : len(target)] = target
        paddings[row, : len(target)] = 0.0
    return {"ids": ids, "labels": labels, "paddings": paddings}


class TextLmInput(BaseInput):
    """One example per non-empty line of ``file``; the vocabulary is built from ``vocab.file`` (the
    training split), so dev and test use the training vocabulary."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file", "", "Text file, one sentence per line (any tf.io.gfile path).")
        p.define("vocab", vocabulary.vocab_params(size=1000), "Vocabulary (built from vocab.file).")
        p.define("seq_length", 64, "Positions per example (longer lines are cut).")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        _check_positive(self.params, "seq_length")
        if not self.params.vocab.file:
            raise ConfigError(f"input {self.params.name!r}: vocab.file (the training text) must be set")

    def arrays(self) -> dict[str, np.ndarray]:
        p = self.params
        vocab = Vocabulary.from_params(p.vocab)
        return encode_lm_lines(vocabulary.read_lines(p.file, f"input {p.name!r}"), vocab, p.seq_length)

    def examples(self) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(self.arrays())


BATCHINGS = ("pack", "bucket", "pad")
FILE_FORMATS = ("auto", "text", "tfrecord")


class CorpusLmInput(BaseInput):
    """A corpus of many files for a LM: text lines or TFRecord shards (``python -m tools.make_shards``),
    tokenized in the graph by a SentencePiece model, then packed, bucketed or padded.

    Files (``file_pattern``: globs separated by commas, any tf.io.gfile path) are read in parallel,
    ``num_parallel_reads`` at a time, interleaved in a fixed order; lines are shuffled in blocks of
    ``shuffle_buffer_size`` (with ``shuffle_seed``), tokenized, and each becomes one sequence: ids =
    BOS + pieces, labels = pieces + EOS (cut to ``seq_length``). ``batching``: ``pack`` (several
    sequences per row with ``segment_ids`` and ``segment_pos``, see ``tasks.packing``), ``bucket``
    (rows of similar length, padded to their batch's longest; one process only) or ``pad`` (one
    sequence per row of ``seq_length``). Every stage is a native tf.data op: the iterator's position is
    saved in checkpoints. Sync workers share rows by ``BaseInput.shard`` (pack and pad).

    A corpus whose files total at most ``max_cached_bytes`` is read and tokenized once, when its
    dataset is built, and its pieces held in memory: each epoch then shuffles sentence numbers (the
    same buffer and seed, so the same order as shuffling the lines) and gathers their pieces, instead
    of reading, filtering and tokenizing every line again; the checkpointed position is the sentence
    numbers' shuffle. Larger corpora stream from the files every epoch. A repeated input (training)
    is infinite: its epochs follow one another inside ``examples()``, the sentences of each permuted
    block by block (``shuffle_buffer_size`` sentences a block) by seeds made of ``shuffle_seed``, the
    epoch's number and the block's, so a restored iterator goes on with the epochs of an
    uninterrupted run.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file_pattern", "", "Text files or TFRecord shards: globs separated by commas.")
        p.define(
            "file_format",
            "auto",
            "text (one sentence per line), tfrecord (tf.train.Examples) or auto (tfrecord when every "
            "file's name has '.tfrecord' in it, else text).",
        )
        p.define("text_feature", "text", "tfrecord: the bytes feature holding the sentence.")
        p.define("num_parallel_reads", 4, "Files read at once (interleaved in a fixed order).")
        p.define("vocab", vocabulary.vocab_params(type="sentencepiece"), "A sentencepiece vocabulary.")
        p.define("seq_length", 128, "Positions per row (longer sentences are cut).")
        p.define("batching", "pack", "pack, bucket or pad (see the class doc).")
        p.define(
            "open_rows",
            packing.WINDOW,
            f"pack: rows being filled at once (first fit decreasing over windows of {packing.WINDOW} "
            "sentences; the default keeps every row of a window open; 8 packs like a streaming packer).",
        )
        p.define(
            "max_cached_bytes",
            16 << 20,
            "Files totalling at most this many bytes are tokenized once and their pieces kept in "
            "memory (see the class doc); 0: always stream and tokenize every epoch.",
        )
        p.define("bucket_boundaries", [16, 32, 64], "bucket: sequence lengths where buckets split.")
        p.define(
            "row_shuffle_buffer_size",
            64,
            "Rows (packed or not) shuffled again after the sentences' shuffle (shuffle_buffer_size "
            "sentences). Small: a buffer holding a whole epoch of rows stalls the step at each epoch.",
        )
        return p

    def shuffle_buffer(self) -> int:
        return self.params.row_shuffle_buffer_size

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        for name in ("seq_length", "num_parallel_reads", "open_rows", "row_shuffle_buffer_size"):
            _check_positive(p, name)
        cache = p.max_cached_bytes
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
            raise ConfigError(f"input {p.name!r}: max_cached_bytes must be an int >= 0, got {cache!r}")
        self._pieces: tuple[np.ndarray, np.ndarray] | None = None  # the cached corpus, once tokenized
        self._cut: tuple[int, int] = (0, 0)  # the cached corpus's (sentences cut, sentences)
        if p.batching not in BATCHINGS:
            raise ConfigError(
                f"input {p.name!r}: batching must be one of {', '.join(BATCHINGS)}, got {p.batching!r}"
            )
        if p.file_format not in FILE_FORMATS:
            raise ConfigError(
                f"input {p.name!r}: file_format must be one of {', '.join(FILE_FORMATS)}, "
                f"got {p.file_format!r}"
            )
        if p.vocab.type != "sentencepiece":
            raise ConfigError(f"input {p.name!r}: CorpusLmInput needs vocab.type = 'sentencepiece'")

    def shard(self, index: int, count: int) -> None:
        if self.params.batching == "bucket" and count > 1:
            raise ConfigError(f"input {self.params.name!r}: batching 'bucket' cannot be sharded (use pack)")
        super().shard(index, count)

    def _files(self) -> list[str]:
        from tasks.readers import list_files

        p = self.params
        return list_files(p.file_pattern, f"input {p.name!r}: file_pattern")

    def lines(self) -> tf.data.Dataset:
        """The sentences of every file, interleaved in a fixed order."""
        return self._line_batches(1024).unbatch()

    def _line_batches(self, size: int) -> tf.data.Dataset:
        """``lines()`` in batches of up to ``size`` (blank lines dropped a batch at a time: a filter
        function called per line costs ~25 us a line, more than tokenizing it)."""
        p = self.params
        files = self._files()
        fmt = p.file_format
        if fmt == "auto":
            fmt = "tfrecord" if all(".tfrecord" in os.path.basename(f) for f in files) else "text"
        if fmt == "text":
            read = tf.data.TextLineDataset
        else:
            feature = {p.text_feature: tf.io.FixedLenFeature([], tf.string)}

            def read(path):
                records = tf.data.TFRecordDataset(path)
                return records.map(lambda r: tf.io.parse_single_example(r, feature)[p.text_feature])

        names = tf.data.Dataset.from_tensor_slices(files)
        cycle = min(len(files), p.num_parallel_reads)
        lines = names.interleave(read, cycle_length=cycle, num_parallel_calls=cycle, deterministic=True)
        return lines.batch(size).map(lambda b: tf.boolean_mask(b, tf.strings.length(tf.strings.strip(b)) > 0))

    def _tokenizer(self):
        import tensorflow_text as tf_text

        from tasks.lm.sentencepiece_vocab import read_model

        p = self.params
        Vocabulary.from_params(p.vocab)  # checks the model and its size
        return tf_text.SentencepieceTokenizer(model=read_model(p.vocab.file), out_type=tf.int32)

    def cached_pieces(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Every sentence's pieces (cut to ``seq_length - 1``) in ``lines()``' order, as the flat
        pieces and the row splits of a ragged [sentences, None], when the files total at most
        ``max_cached_bytes``; else None. Tokenized on the first call."""
        p = self.params
        if self._pieces is None and p.max_cached_bytes > 0:
            if sum(tf.io.gfile.stat(f).length for f in self._files()) <= p.max_cached_bytes:
                # The sentencepiece library's own encoder (the C++ tensorflow_text's op wraps) on
                # the raw bytes: the same pieces without importing tensorflow_text, which imports
                # Keras (~1.2 s of CPU a process).
                vocab = Vocabulary.from_params(p.vocab)  # checks the model and its size
                cut = p.seq_length - 1
                lines = (list(batch.numpy()) for batch in self._line_batches(4096))
                encoded = [ids for batch in lines for ids in vocab.encode_all(batch)]
                self._cut = (sum(len(ids) > cut for ids in encoded), len(encoded))
                rows = [ids[:cut] for ids in encoded]
                lengths = np.array([len(r) for r in rows], np.int64)
                splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                values = np.fromiter((i for r in rows for i in r), np.int32, count=int(splits[-1]))
                self._pieces = (values, splits)
        return self._pieces

    def sequences(self) -> tf.data.Dataset:
        """One ``{ids, labels}`` of variable length per sentence (after the line shuffle)."""
        return self._token_batches(256).unbatch()

    def _token_batches(self, size: int) -> tf.data.Dataset:
        """Batches of ``size`` sentences (after the sentence shuffle) as ragged ``{ids, labels}``: ids
        = BOS + pieces, labels = pieces + EOS, cut to ``seq_length``; every op on a whole batch.

        Epoch by epoch (one when the input does not repeat), the last batch of each partial. The
        shuffle is stateless: each block of ``shuffle_buffer_size`` sentences is permuted by a seed
        made of ``shuffle_seed``, the epoch's number and the block's, all part of the iterator's
        saved position. (tf.data's shuffle, reshuffling each epoch, counts the epochs in its own
        iterator, which a batch that has read its input to the end leaves out of the saved position:
        during an epoch's last batch, all of a corpus smaller than one, a run restored there
        shuffled its next epochs as earlier ones.)"""
        p = self.params
        cached = self.cached_pieces()
        if cached is not None:  # sentence numbers, shuffled as the lines would be; their pieces gathered
            values, splits = (tf.constant(a) for a in cached)
            count = len(cached[1]) - 1

            def sentences() -> tf.data.Dataset:
                return tf.data.Dataset.range(count)

            def pieces(rows: tf.Tensor) -> tf.RaggedTensor:
                return tf.gather(tf.RaggedTensor.from_row_splits(values, splits, validate=False), rows)

        else:
            tokenizer, cut = self._tokenizer(), p.seq_length - 1
            sentences = self.lines

            def pieces(lines: tf.Tensor) -> tf.RaggedTensor:
                return tokenizer.tokenize(lines)[:, :cut]

        def encode(batch: tf.Tensor) -> dict[str, tf.RaggedTensor]:
            tokens = pieces(batch)
            ends = tf.ones_like(tokens[:, :1])  # one position per sentence
            return {
                "ids": tf.concat([ends * BOS_ID, tokens], axis=1),
                "labels": tf.concat([tokens, ends * EOS_ID], axis=1),
            }

        def epoch(number: tf.Tensor) -> tf.data.Dataset:
            ds = sentences()
            if p.shuffle_seed is not None:
                seed = tf.stack([tf.constant(p.shuffle_seed, tf.int64), number])

                def permuted(index: tf.Tensor, block: tf.Tensor) -> tf.Tensor:
                    block_seed = tf.random.experimental.stateless_fold_in(seed, index)
                    keys = tf.random.stateless_uniform(tf.shape(block)[:1], seed=block_seed)
                    return tf.gather(block, tf.argsort(keys))

                ds = ds.batch(p.shuffle_buffer_size).enumerate().map(permuted).unbatch()
            # Sequential: the tokenizer holds a resource, and with op determinism on
            # (tf_settings.configure) tf.data would rewrite a parallel map of it into this anyway.
            return ds.batch(size).map(encode)

        epochs = tf.data.Dataset.counter() if p.repeat else tf.data.Dataset.range(1)
        return epochs.flat_map(epoch)

    def examples(self) -> tf.data.Dataset:
        p = self.params
        if p.batching == "pack":  # whole windows of sentences: no per-sentence tf.data step after the lines
            windows = self._token_batches(packing.WINDOW).map(
                lambda ex: packing.padded_window(ex, ("ids", "labels"), p.seq_length)
            )
            ds = packing.pack_windows(windows, ("ids", "labels"), p.seq_length, p.open_rows)
        elif p.batching == "bucket":
            ds = self.sequences().map(lambda ex: {**ex, "paddings": tf.zeros_like(ex["ids"], tf.float32)})
        else:
            ds = self.sequences().map(lambda ex: _pad_to(ex, p.seq_length))
        # The same graph in every process, op determinism on (the trainer) or off (a tool reading a
        # checkpoint's iterator): tf.data would otherwise parallelize these maps only in the latter,
        # and a saved iterator restores only into the graph that saved it.
        options = tf.data.Options()
        options.experimental_optimization.map_parallelization = False
        return ds.with_options(options)

    def cut_sentences(self, max_sentences: int = 20000) -> tuple[int, int]:
        """(sentences longer than ``seq_length`` positions, which are cut; sentences counted): the
        whole cached corpus, else up to ``max_sentences`` of one pass over the files."""
        if self.cached_pieces() is not None:
            return self._cut
        vocab, cut, counted, long = (
            Vocabulary.from_params(self.params.vocab),
            self.params.seq_length - 1,
            0,
            0,
        )
        for batch in self._line_batches(4096):
            for ids in vocab.encode_all(list(batch.numpy())):
                long, counted = long + (len(ids) > cut), counted + 1
                if counted >= max_sentences:
                    return long, counted
        return long, counted

    def notes(self) -> list[str]:
        """The cut sentences of a cached corpus (counted as it is tokenized; a streamed one is not
        read ahead for this: --mode=inspect_datasets counts its first 20000)."""
        if self.cached_pieces() is None or not self._cut[0]:
            return []
        return [self._cut_line(*self._cut)]

    def _cut_line(self, long: int, counted: int) -> str:
        p = self.params
        return (
            f"input {p.name!r}: {long} of {counted} sentences are longer than seq_length {p.seq_length} "
            "(BOS or EOS included) and are cut: raise seq_length to keep them whole"
        )

    def inspect(self, num_examples: int = 3, max_sentences: int = 20000) -> str:
        """A few decoded sentences, the packing efficiency and the token-length histogram of (up to
        ``max_sentences`` of) one pass over the files, in file order."""
        p = self.params
        vocab = Vocabulary.from_params(p.vocab)
        unshuffled = CorpusLmInput(p.copy().set(shuffle_seed=None, batching="pad"))
        lengths = [
            int(n) for n in unshuffled.sequences().take(max_sentences).map(lambda ex: tf.size(ex["ids"]))
        ]
        lines = [f"examples (first {num_examples}, decoded):"]
        for ex in unshuffled.sequences().take(num_examples):
            lines.append(f"  {vocab.decode(ex['labels'].numpy())!r} ({len(ex['ids'])} tokens)")
        packed = CorpusLmInput(p.copy().set(shuffle_seed=None, batching="pack"))
        paddings = [r["paddings"].numpy() for r in packed.examples().take(max_sentences)]
        slots = sum(len(x) for x in paddings)
        real = sum(int((x == 0).sum()) for x in paddings)
        pad_slots = len(lengths) * p.seq_length
        lines.append(
            f"packing efficiency (real tokens / slots): {real / max(1, slots):.3f} packed "
            f"({len(paddings)} rows of {p.seq_length}); {sum(lengths) / max(1, pad_slots):.3f} one per row"
        )
        lines.append(
            f"token lengths of {len(lengths)} sentences (BOS or EOS included, cut at {p.seq_length}):"
        )
        lines += ["  " + line for line in packing.histogram(lengths)]
        lines.append(self._cut_line(*self.cut_sentences(max_sentences)))
        return "\n".join(lines) + "\n"

    def batch(self, ds: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
        p = self.params
        if p.batching != "bucket":
            return super().batch(ds, batch_size)
        ds = packing.bucket(ds, "ids", list(p.bucket_boundaries), batch_size, p.drop_remainder)
        # bucket_by_sequence_length pads paddings with 0.0: mark the padded positions as padding.
        return ds.map(lambda b: {**b, "paddings": tf.cast(tf.equal(b["ids"], PAD_ID), tf.float32)})


def _pad_to(example: dict[str, tf.Tensor], length: int) -> dict[str, tf.Tensor]:
    n = tf.shape(example["ids"])[0]
    out = {k: tf.ensure_shape(tf.pad(v, [[0, length - n]]), [length]) for k, v in example.items()}
    out["paddings"] = tf.cast(tf.range(length) >= n, tf.float32)
    return out
