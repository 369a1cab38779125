"""File readers: ``TFRecordInput`` (serialized ``tf.train.Example``s) and ``TextLineInput``.

Both take ``file_pattern``: one glob or several separated by commas, any ``tf.io.gfile`` file system.
Files are read one after another in sorted order, so the example order (and with it every shuffled
order and a resumed iterator) is the same on every run. A pattern that matches nothing is a UserError
naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import tensorflow as tf

from params.errors import ConfigError, UserError
from params.hyperparams import InstantiableParams
from tasks.base_input import BaseInput

_SPEC_RE = re.compile(r"^\s*(\w+)\s*\[([^\]]*)\]\s*(?:->\s*(\w+)\s*)?$")
_STORED_DTYPES = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}


def list_files(file_pattern: str, what: str = "file_pattern") -> list[str]:
    """The sorted, de-duplicated files matching ``file_pattern`` (comma-separated globs)."""
    patterns = [p.strip() for p in file_pattern.split(",") if p.strip()]
    if not patterns:
        raise ConfigError(f"{what} is empty: expected a glob such as /data/train-*.tfrecord")
    files: list[str] = []
    for pattern in patterns:
        try:
            matched = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as e:
            raise UserError(f"{what} {pattern!r}: cannot list it ({e.message})") from None
        if not matched:
            raise UserError(f"{what} {pattern!r} matches no file")
        files.extend(matched)
    return sorted(set(files))


def file_lines(files: list[str]) -> Iterator[str]:
    """Each line of ``files`` (any tf.io.gfile path), in order, without its newline."""
    for path in files:
        with tf.io.gfile.GFile(path, "r") as f:
            for line in f:
                yield line.rstrip("\r\n")


def parse_feature_spec(name: str, spec: str) -> tuple[tf.io.FixedLenFeature | tf.io.VarLenFeature, tf.DType]:
    """``'float32[8,8,1]'`` -> (FixedLenFeature([8, 8, 1], float32), float32).

    Grammar: ``<stored dtype>[<dims>]`` with an optional ``-> <output dtype>`` cast. The stored dtype is
    one of float32, int64, string (what tf.train.Example holds); ``[]`` is a scalar and ``[None]`` a
    variable-length vector (dense; ``BaseInput.dataset`` pads it with zeros to the longest in a batch).
    """
    match = _SPEC_RE.match(spec) if isinstance(spec, str) else None
    if not match or match.group(1) not in _STORED_DTYPES:
        raise ConfigError(
            f"features[{name!r}]: expected '<float32|int64|string>[dims]' (optionally '-> dtype'), "
            f"got {spec!r}"
        )
    stored = _STORED_DTYPES[match.group(1)]
    try:
        output = tf.as_dtype(match.group(3)) if match.group(3) else stored
    except TypeError:
        raise ConfigError(
            f"features[{name!r}]: unknown output dtype {match.group(3)!r} in {spec!r}"
        ) from None
    dims_text = match.group(2).strip()
    if dims_text in ("None", "?"):
        return tf.io.VarLenFeature(stored), output
    try:
        dims = [int(d) for d in dims_text.split(",")] if dims_text else []
    except ValueError:
        raise ConfigError(f"features[{name!r}]: dims must be ints, [] or [None], got {spec!r}") from None
    if any(d <= 0 for d in dims):
        raise ConfigError(f"features[{name!r}]: dims must be > 0, got {spec!r}")
    return tf.io.FixedLenFeature(dims, stored), output


class TFRecordInput(BaseInput):
    """Examples from TFRecord files of serialized ``tf.train.Example``s.

    ``features`` maps each feature name to a spec (see ``parse_feature_spec``), e.g.
    ``{'image': 'float32[8,8,1]', 'label': 'int64[] -> int32'}``. A subclass may instead override
    ``parse(serialized)`` to decode records of any other format.
    """

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file_pattern", "", "Glob of the TFRecord files; several globs separated by commas.")
        p.define("features", {}, "{name: 'dtype[dims]' or 'dtype[dims] -> out_dtype'} of tf.train.Example.")
        p.define("compression_type", "", "'' (none), 'GZIP' or 'ZLIB'.")
        return p

    def __init__(self, params: InstantiableParams) -> None:
        super().__init__(params)
        p = self.params
        if p.compression_type not in ("", "GZIP", "ZLIB"):
            raise ConfigError(
                f"input {p.name!r}: compression_type must be '', 'GZIP' or 'ZLIB', got {p.compression_type!r}"
            )
        self._specs = {name: parse_feature_spec(name, spec) for name, spec in dict(p.features).items()}
        if not self._specs and type(self).parse is TFRecordInput.parse:
            raise ConfigError(
                f"input {p.name!r}: TFRecordInput needs features (or a subclass overriding parse)"
            )

    def parse(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        """One serialized record -> one example dict (default: ``tf.train.Example`` by ``features``)."""
        parsed = tf.io.parse_single_example(
            serialized, {name: spec for name, (spec, _) in self._specs.items()}
        )
        example = {}
        for name, (spec, output) in self._specs.items():
            value = parsed[name]
            if isinstance(spec, tf.io.VarLenFeature):
                value = tf.sparse.to_dense(value)
            example[name] = tf.cast(value, output) if output != value.dtype else value
        return example

    def examples(self) -> tf.data.Dataset:
        p = self.params
        files = list_files(p.file_pattern, f"input {p.name!r}: file_pattern")
        records = tf.data.TFRecordDataset(files, compression_type=p.compression_type or None)
        return records.map(self.parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class TextLineInput(BaseInput):
    """One example ``{'text': <the line, without its newline>}`` per line of text files."""

    @classmethod
    def Params(cls) -> InstantiableParams:
        p = super().Params()
        p.define("file_pattern", "", "Glob of the text files; several globs separated by commas.")
        p.define("skip_empty_lines", False, "Drop lines that are empty or only whitespace.")
        return p

    def examples(self) -> tf.data.Dataset:
        p = self.params
        files = list_files(p.file_pattern, f"input {p.name!r}: file_pattern")
        lines = tf.data.TextLineDataset(files)
        if p.skip_empty_lines:
            lines = lines.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
        return lines.map(lambda line: {"text": line})
