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
from tests.params import fuzz_inputs
from tests.params.fuzz_inputs import CANARY, MODEL

EXAMPLES = int(os.environ.get("TENSORPIPE_FUZZ_EXAMPLES", "2000"))  # the full run: 10000

settings.register_profile(
    "tensorpipe_fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FUZZ = settings.get_profile("tensorpipe_fuzz")


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
@given(fuzz_inputs.text)
def test_fuzz_params_override(text):
    _counted(_COUNTS, "params_override")
    _check(lambda: experiment.resolve(MODEL, params_override=text))


@FUZZ
@given(st.one_of(st.binary(max_size=60), fuzz_inputs.text.map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_fuzz_params_file(tmp_path_factory, data):
    _counted(_COUNTS, "params_file")
    path = tmp_path_factory.getbasetemp() / "fuzz_params.txt"
    path.write_bytes(data)
    _check(lambda: experiment.resolve(MODEL, params_file_override=str(path)))


@FUZZ
@given(fuzz_inputs.gin_text)
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
@given(fuzz_inputs.text)
def test_fuzz_params_text(text):
    _counted(_COUNTS, "params_text")
    _check(lambda: _tree().from_text(text))


def test_fuzz_counts():
    """Runs last in this file: every parser saw at least EXAMPLES inputs."""
    print(f"fuzz inputs per parser: {_COUNTS}")
    for name in ("params_override", "params_file", "gin_param", "params_text"):
        assert _COUNTS.get(name, 0) >= EXAMPLES, _COUNTS
