"""Property-based fuzzing of every configuration parser through its real entry point, in-process.

Each parser gets ``TENSORPIPE_FUZZ_EXAMPLES`` generated inputs (1,000 by default, to keep the suite
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

EXAMPLES = int(os.environ.get("TENSORPIPE_FUZZ_EXAMPLES", "1000"))  # the full run: 10000

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


def _fuzz(strategy, body) -> None:
    """Runs ``body`` on EXAMPLES inputs drawn from ``strategy`` and checks that it saw them all (so a
    filter or a health check cannot quietly shrink the run). Each test counts its own inputs, so the
    tests stay independent (any order, any xdist worker)."""
    seen = []

    @FUZZ
    @given(strategy)
    def run(value):
        seen.append(1)
        body(value)

    run()
    assert len(seen) >= EXAMPLES, f"{len(seen)} fuzz inputs, expected {EXAMPLES}"


def test_fuzz_params_override():
    _fuzz(fuzz_inputs.text, lambda text: _check(lambda: experiment.resolve(MODEL, params_override=text)))


def test_fuzz_params_file(tmp_path_factory):
    path = tmp_path_factory.getbasetemp() / "fuzz_params.txt"

    def one(data: bytes) -> None:
        path.write_bytes(data)
        _check(lambda: experiment.resolve(MODEL, params_file_override=str(path)))

    _fuzz(
        st.one_of(st.binary(max_size=60), fuzz_inputs.text.map(lambda t: t.encode("utf-8", "surrogatepass"))),
        one,
    )


def test_fuzz_gin_param():
    _fuzz(fuzz_inputs.gin_text, lambda text: _check(lambda: experiment.resolve(MODEL, gin_bindings=[text])))


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


def test_fuzz_params_text():
    _fuzz(fuzz_inputs.text, lambda text: _check(lambda: _tree().from_text(text)))


# ---------------------------------------------------------------- params whose default is None
_WRONG_TYPE_VALUES = {
    "int": "7", "float": "1.5", "str": "'os.system'", "bool": "True", "list": "[1, 2]", "tuple": "(1,)",
    "dict": "{'a': 1}", "dtype": "float32", "class": "type/layers.core/ProjectionLayer",
}  # fmt: skip


def _kind(value) -> str:
    from params import text_format

    if text_format.is_dtype(value):
        return "dtype"
    if isinstance(value, type):
        return "class"
    return type(value).__name__


def _none_params(root: Params) -> list[str]:
    """Every key whose value is None now (a default of None, or set so by the experiment)."""
    return [key for key, value in root if value is None]


def _experiment_roots() -> dict[str, Params]:
    from params import registry

    return {
        key: experiment.build_params(registry.get(key)(), key)
        for key in registry.all_keys()
        if key.split(".")[0] in ("image", "lm", "mt")
    }


def test_every_none_param_of_every_experiment_declares_its_type():
    """Without a declared type a None param would take any value (issue: 'os.system' as a seed)."""
    missing = [
        f"{name}: {key}"
        for name, root in _experiment_roots().items()
        for key in _none_params(root)
        if not root.declared_kinds(key)
    ]
    assert not missing, missing


def test_none_params_refuse_values_of_every_wrong_type():
    """Each None param of each experiment, set from text to a value of each type: refused with one
    line naming the key, unless the value is of a kind the param declares."""
    accepted = 0
    for name, root in _experiment_roots().items():
        for key in _none_params(root):
            kinds = root.declared_kinds(key)
            for text in _WRONG_TYPE_VALUES.values():
                tree = root.copy()
                try:
                    tree.from_text(f"{key} : {text}")
                except ConfigError as e:
                    assert "\n" not in str(e) and key in str(e), (name, key, text, str(e))
                    continue
                assert _kind(tree.get(key)) in kinds or (kinds == ("float",) and text == "7"), (
                    name,
                    key,
                    text,
                )
                accepted += 1
    assert accepted > 0  # the right kinds do pass


@pytest.mark.parametrize("value", ["'os.system'", "1.5", "'abc'", "[301]", "True", "{'a': 1}", "float32"])
def test_every_input_refuses_a_shuffle_seed_that_is_not_an_int(value):
    for root in _experiment_roots().values():
        for dataset in root.input.names():
            with pytest.raises(ConfigError, match=f"input.{dataset}.shuffle_seed"):
                root.copy().from_text(f"input.{dataset}.shuffle_seed : {value}")
        gin.clear_config()
