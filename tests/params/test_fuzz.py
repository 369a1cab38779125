"""Property-based fuzzing of every configuration parser through its real entry point, in-process.

Each parser gets ``TENSORPIPE_FUZZ_EXAMPLES`` generated inputs (2,000 by default, to keep the suite
fast; ``TENSORPIPE_FUZZ_EXAMPLES=10000`` is the full run): override strings
(``--params_override``), params files (raw bytes, so also non-UTF-8), gin bindings (``--gin_param``)
and Params text (``Params.from_text``). Every input either resolves or raises the project's
ConfigError with one line; nothing else escapes, and a canary module that a payload names is never
imported. Inputs mix random text with fragments of each grammar (brackets, quotes, escapes, keys,
``type/`` values, gin's ``import``, ``@`` and ``%``), so they reach deep into the parsers.
"""

import os
import sys

import gin
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from params import experiment
from params.errors import ConfigError
from params.hyperparams import InstantiableParams, Params

MODEL = "tests.params.fake_experiments.TinyExp"
CANARY = "tp_fuzz_canary"
EXAMPLES = int(os.environ.get("TENSORPIPE_FUZZ_EXAMPLES", "2000"))  # the full run: 10000

settings.register_profile(
    "tensorpipe_fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FUZZ = settings.get_profile("tensorpipe_fuzz")

_KEYS = [
    "task.width", "task.name", "task.train.learning_rate", "task.train.max_steps", "task.cls",
    "input.dev.task_overrides", "input.train.split", "input.dev.batch_size", "cluster.intra_op_threads",
    "model", "task", "task.train", "task.width[0]", "task.train[3].x", "nope",
]  # fmt: skip
_FRAGMENTS = [
    " : ", ":", ";", "\n", " ", "=", ",", "[", "]", "(", ")", "{", "}", "'", '"', "\\", "\\x", "\\u12",
    "\\N{foo}", "\\n", "1", "-", "0.5", "1e999", "9" * 50, "inf", "nan", "True", "None", "float32",
    "type/", "/", ".", "type/os/system", f"type/{CANARY}/Thing", f"'{CANARY}.Thing'", "type/builtins/dict",
    "type/layers.core/SoftmaxLayer", "import ", f"import {CANARY}", "from __gin__ import x",
    "include ", "@", "%", "()", "TinyExp.", "TinyExp.width = ", "TinyExp.learning_rate = ", "scope/",
    "#", "__import__('os')", "\x00", "\udcff", "é", "\u2028",
    *_KEYS,
]  # fmt: skip
_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=16).map("".join),
    st.builds(
        lambda k, v: f"{k} : {v}", st.sampled_from(_KEYS), st.lists(st.sampled_from(_FRAGMENTS)).map("".join)
    ),
)
_gin_text = st.one_of(
    _text,
    st.builds(
        lambda k, v: f"TinyExp.{k} = {v}",
        st.sampled_from(["width", "learning_rate", "depth", "name"]),
        st.lists(st.sampled_from(_FRAGMENTS), max_size=8).map("".join),
    ),
)


@pytest.fixture(scope="module", autouse=True)
def canary(tmp_path_factory):
    directory = tmp_path_factory.mktemp("canary")
    marker = directory / "imported"
    (directory / f"{CANARY}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Thing: pass\n")
    sys.path.insert(0, str(directory))
    yield marker
    sys.path.remove(str(directory))
    assert not marker.exists() and CANARY not in sys.modules, "a payload imported the canary module"


def _check(call) -> None:
    try:
        call()
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000, str(e)[:2000]
    finally:
        gin.clear_config()


def _counted(counts: dict, name: str):
    counts[name] = counts.get(name, 0) + 1


_COUNTS: dict[str, int] = {}


@FUZZ
@given(_text)
def test_fuzz_params_override(text):
    _counted(_COUNTS, "params_override")
    _check(lambda: experiment.resolve(MODEL, params_override=text))


@FUZZ
@given(st.one_of(st.binary(max_size=60), _text.map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_fuzz_params_file(tmp_path_factory, data):
    _counted(_COUNTS, "params_file")
    path = tmp_path_factory.getbasetemp() / "fuzz_params.txt"
    path.write_bytes(data)
    _check(lambda: experiment.resolve(MODEL, params_file_override=str(path)))


@FUZZ
@given(_gin_text)
def test_fuzz_gin_param(text):
    _counted(_COUNTS, "gin_param")
    _check(lambda: experiment.resolve(MODEL, gin_bindings=[text]))


def _tree() -> Params:
    p = InstantiableParams(Params)
    p.define("name", "x", "")
    p.define("count", 1, "")
    p.define("rate", 0.5, "")
    p.define("flag", True, "")
    p.define("shape", [1, 2], "")
    p.define("table", {"a": 1}, "")
    p.define("anything", None, "")
    child = Params()
    child.define("dim", 3, "")
    p.define("child", child, "")
    p.define("layers", [child.copy(), child.copy()], "")
    return p


@FUZZ
@given(_text)
def test_fuzz_params_text(text):
    _counted(_COUNTS, "params_text")
    _check(lambda: _tree().from_text(text))


def test_fuzz_counts():
    """Runs last in this file: every parser saw at least EXAMPLES inputs."""
    print(f"fuzz inputs per parser: {_COUNTS}")
    for name in ("params_override", "params_file", "gin_param", "params_text"):
        assert _COUNTS.get(name, 0) >= EXAMPLES, _COUNTS
