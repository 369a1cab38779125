"""TFRecordInput and TextLineInput on real files written to a temporary directory."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from params.errors import ConfigError, UserError
from tasks.readers import TextLineInput, TFRecordInput


def _example(i: int) -> bytes:
    feature = {
        "image": tf.train.Feature(float_list=tf.train.FloatList(value=[i * 0.5, i * 0.25, 1.0, 0.0])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 3])),
        "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"ex{i}".encode()])),
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 4)))),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _write_records(path, ids, compression: str | None = None) -> None:
    options = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for i in ids:
            writer.write(_example(i))


FEATURES = {"image": "float32[2,2]", "label": "int64[] -> int32", "name": "string[]", "ids": "int64[None]"}


@pytest.fixture
def record_dir(tmp_path):
    # Written in an order different from the sorted one: reading must follow the sorted file names.
    _write_records(tmp_path / "part-00001.tfrecord", [3, 4, 5])
    _write_records(tmp_path / "part-00000.tfrecord", [0, 1, 2])
    _write_records(tmp_path / "part-00002.tfrecord", [6])
    return tmp_path


def _tfrecord_params(pattern: str, **kwargs):
    return TFRecordInput.Params().set(name="train", file_pattern=pattern, features=FEATURES, **kwargs)


def test_tfrecord_examples_are_parsed_in_sorted_file_order(record_dir) -> None:
    inp = _tfrecord_params(str(record_dir / "part-*.tfrecord")).instantiate()
    examples = list(inp.examples().as_numpy_iterator())
    assert [e["name"].decode() for e in examples] == [f"ex{i}" for i in range(7)]
    np.testing.assert_allclose(examples[3]["image"], [[1.5, 0.75], [1.0, 0.0]])
    assert examples[5]["label"] == 2 and examples[5]["label"].dtype == np.int32
    assert examples[3]["ids"].tolist() == [0, 1, 2]


def test_tfrecord_batches_pad_variable_length_features(record_dir) -> None:
    inp = _tfrecord_params(
        str(record_dir / "part-*.tfrecord"), batch_size=4, drop_remainder=False
    ).instantiate()
    batches = list(inp.dataset().as_numpy_iterator())
    assert [len(b["label"]) for b in batches] == [4, 3]
    assert batches[0]["image"].shape == (4, 2, 2)
    assert batches[0]["ids"].tolist() == [[0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 2]]


def test_comma_separated_patterns_and_gzip(tmp_path) -> None:
    _write_records(tmp_path / "b.tfrecord.gz", [10, 11], compression="GZIP")
    _write_records(tmp_path / "a.tfrecord.gz", [20], compression="GZIP")
    pattern = f"{tmp_path}/b.tfrecord.gz, {tmp_path}/a.*.gz"
    inp = _tfrecord_params(pattern, compression_type="GZIP").instantiate()
    assert [e["name"] for e in inp.examples().as_numpy_iterator()] == [b"ex20", b"ex10", b"ex11"]


def test_missing_files_are_a_user_error_naming_the_pattern(tmp_path) -> None:
    pattern = str(tmp_path / "nothing-*.tfrecord")
    inp = _tfrecord_params(pattern).instantiate()
    with pytest.raises(UserError, match=r"file_pattern '.*nothing-\*\.tfrecord' matches no file"):
        inp.dataset()


@pytest.mark.parametrize("spec", ["float64[2]", "int64[x]", "int64", "float32[0]", "int64[] -> nosuchtype"])
def test_bad_feature_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"features\['f'\]"):
        TFRecordInput.Params().set(file_pattern="x", features={"f": spec}).instantiate()


def test_tfrecord_input_needs_features_or_a_parse_override(record_dir) -> None:
    with pytest.raises(ConfigError, match="needs features"):
        TFRecordInput.Params().set(file_pattern="x").instantiate()

    class RawRecords(TFRecordInput):
        def parse(self, serialized):
            return {"length": tf.strings.length(serialized)}

    p = RawRecords.Params().set(file_pattern=str(record_dir / "part-00000.tfrecord"))
    lengths = [e["length"] for e in p.instantiate().examples().as_numpy_iterator()]
    assert lengths == [len(_example(i)) for i in range(3)]


def test_text_lines_in_sorted_file_order(tmp_path) -> None:
    (tmp_path / "b.txt").write_text("third line\n\nfourth\n")
    (tmp_path / "a.txt").write_text("first\nsecond one\n")
    p = TextLineInput.Params().set(file_pattern=str(tmp_path / "*.txt"), batch_size=2, drop_remainder=False)
    lines = [e["text"].decode() for e in p.instantiate().examples().as_numpy_iterator()]
    assert lines == ["first", "second one", "third line", "", "fourth"]

    p.skip_empty_lines = True
    batches = [b["text"].tolist() for b in p.instantiate().dataset().as_numpy_iterator()]
    assert batches == [[b"first", b"second one"], [b"third line", b"fourth"]]


def test_text_lines_missing_file_is_a_user_error(tmp_path) -> None:
    p = TextLineInput.Params().set(name="dev", file_pattern=str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match=r"input 'dev': file_pattern '.*missing\.txt' matches no file"):
        p.instantiate().examples()
