"""Resolution of an experiment into one frozen Params, and every override path with its precedence."""

import gin
import pytest

from params import experiment, registry
from params.errors import ConfigError
from params.hyperparams import MAX_KEY_CHARS, InstantiableParams, Params
from params.overrides import split_statements
from tests.params.fake_experiments import CANARY, TinyExp

MODEL = "tests.params.fake_experiments.TinyExp"


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_datasets_are_public_zero_argument_methods():
    assert TinyExp.dataset_names() == ["dev", "train"]
    with pytest.raises(ConfigError, match="has no data set 'test'; it has dev, train"):
        TinyExp().dataset("test")


def test_resolve_gives_frozen_params_with_every_part():
    root = experiment.resolve(MODEL)
    assert root.is_frozen
    assert root.model == MODEL
    assert root.task.train.learning_rate == 0.1
    assert root.input.dev.batch_size == 16 and root.input.train.split == "train"
    assert root.input.dev.task_overrides == {"width": 2}
    assert root.cluster.num_logical_cpu_devices == 0


def test_task_params_for_applies_dataset_overrides():
    root = experiment.resolve(MODEL)
    assert experiment.task_params_for(root, "dev").width == 2
    assert experiment.task_params_for(root, "train").width == 4


def test_params_override_text_with_semicolons_and_newlines():
    root = experiment.resolve(
        MODEL, params_override="task.width : 9; task.train.max_steps : 5\ninput.dev.split : 'a;b'"
    )
    assert (root.task.width, root.task.train.max_steps, root.input.dev.split) == (9, 5, "a;b")


def test_split_statements_respects_quotes():
    assert split_statements('a : \'x;y\'; b : "p\\"q;"\n c : 1') == ["a : 'x;y'", 'b : "p\\"q;"', "c : 1"]


def test_precedence_gin_then_file_then_text(tmp_path):
    override_file = tmp_path / "override.txt"
    override_file.write_text("task.width : 7\ntask.train.max_steps : 70\n")
    root = experiment.resolve(
        MODEL,
        gin_bindings=["TinyExp.width = 5", "TinyExp.learning_rate = 0.3"],
        params_file_override=str(override_file),
        params_override="task.train.max_steps : 80",
    )
    assert root.task.train.learning_rate == 0.3  # gin knob, nothing later touched it
    assert root.task.width == 7  # the file beats gin
    assert root.task.train.max_steps == 80  # the text beats the file


def test_gin_file_binds_knobs(tmp_path):
    gin_file = tmp_path / "exp.gin"
    gin_file.write_text("TinyExp.width = 11\n")
    assert experiment.resolve(MODEL, gin_files=[str(gin_file)]).task.width == 11


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"params_override": "task.widht : 3"}, "did you mean 'task.width'"),
        ({"params_override": "task.width : 'wide'"}, "expected an int"),
        ({"params_override": "task.width"}, "expected 'key : value'"),
        ({"params_file_override": "/no/such/file.txt"}, "no such file"),
        ({"gin_bindings": ["TinyExp.depth = 3"]}, "gin:"),
        ({"gin_bindings": ["NoSuchExp.width = 3"]}, "gin:"),
        ({"gin_files": ["/no/such.gin"]}, "gin:"),
    ],
)
def test_bad_overrides_are_one_line_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as e:
        experiment.resolve(MODEL, **kwargs)
    assert "\n" not in str(e.value)


def test_an_error_the_experiment_raises_for_a_knob_is_one_line(tmp_path):
    """Raised inside gin's configurable (the experiment's constructor), an error came out with gin's
    "In call to configurable" line appended: two lines from the binary."""
    from params.errors import UserError

    missing = tmp_path / "no_such.model"
    with pytest.raises(UserError, match="does not exist") as e:
        experiment.resolve(
            "lm.text.TextTransformerLM", gin_bindings=[f"TextTransformerLM.vocab_file = '{missing}'"]
        )
    assert "\n" not in str(e.value) and type(e.value) is UserError


# Hostile and careless input to every parser: one ConfigError line, nothing imported or run.


def _one_line_error(match: str, **kwargs) -> str:
    with pytest.raises(ConfigError, match=match) as e:
        experiment.resolve(MODEL, **kwargs)
    message = str(e.value)
    assert "\n" not in message and len(message) < 600
    return message


@pytest.mark.parametrize(
    "override, match",
    [
        ("task.train.max_steps : " + "[" * 600, "deeper than 50 levels"),
        ("task.name : '\\N{foo}'", "bad string"),
        ("task.name : '\\x'", "bad string"),
        ("task.name : '\\u12'", "bad string"),
        ("task.name : 'adam", "cannot parse"),
        ("task.train.max_steps : " + "9" * 5000, "too many digits"),
        ("task.width[" + "9" * 5000 + "] : 1", f"longer than {MAX_KEY_CHARS}"),
        ("task.train[" + "9" * 20 + "].x : 1", "more than 9 digits"),
        ("x" * 100_000 + " : 1", "the limit"),
        ("task.name : '" + "a" * 200_000 + "'", "the limit is 100000"),
        ("input.dev.task_overrides : {1: 2}", "is a int, not a 'dotted.key'"),
        ("input.dev.task_overrides : {'train': 5}", "is a group of params"),
        ("input.dev.task_overrides : {'train.max_steps': 'x'}", "expected an int"),
        ("input.dev.task_overrides : {'nope': 1}", "unknown param 'nope'"),
        ("task.cls : 'os.getcwd'", "not part of this project"),
        ("task.cls : type/os/system", "not part of this project"),
        ("task.cls : type/layers.core/SoftmaxLayer.__init__", "not a public name"),
        ("task.train.learning_rate : [type/subprocess/getoutput]", "not part of this project"),
    ],
)
def test_params_override_failures_are_one_line(override, match):
    message = _one_line_error(match, params_override=override)
    assert message.startswith("--params_override:") or message.startswith("input.")
    assert len(message) < 600  # a 100 KB key is not echoed whole


def test_unknown_long_key_is_not_echoed_whole():
    message = _one_line_error("unknown param", params_override="task." + "y" * 400 + " : 1")
    assert "y" * 100 not in message


def test_class_values_stay_in_their_family():
    root = experiment.resolve(MODEL, params_override="task.cls : type/builtins/dict")
    assert root.task.cls is dict
    p = InstantiableParams(Params)
    with pytest.raises(ConfigError, match="builtins.object is not a Params"):
        p.from_text("cls : type/builtins/object")
    with pytest.raises(ConfigError, match="not a builtin class"):
        p.from_text("cls : type/builtins/eval")
    assert registry.is_known_module("layers.core") and not registry.is_known_module("trainer.__main__")


@pytest.mark.parametrize("name", ["dir", "bin_ls"])
def test_unreadable_params_files_are_one_line(tmp_path, name):
    path = tmp_path if name == "dir" else tmp_path / "binary"
    if name == "bin_ls":
        path.write_bytes(b"task.width : 1\n\xff\xfe\x00garbage")
    message = _one_line_error("cannot read it|not UTF-8", params_file_override=str(path))
    assert message.startswith(f"--params_file_override={path}:")


def test_dtype_fields_and_class_fields_are_validated_before_jobs():
    root = Params()
    root.define("model", MODEL, "")
    task = InstantiableParams(dict)
    task.define("dtype", None, "")
    root.define("task", task, "")
    inputs = Params()
    root.define("input", inputs, "")
    task.dtype = "e"
    with pytest.raises(ConfigError, match="'task.dtype': expected a dtype"):
        experiment.validate(root)
    task.dtype = "float32"
    task.cls = "os.system"
    with pytest.raises(ConfigError, match="'task.cls': expected a class"):
        experiment.validate(root)


@pytest.mark.parametrize(
    "binding, match",
    [
        ("import os", "imports code"),
        ("from __gin__ import dynamic_registration", "imports code"),
        ("import this", "imports code"),
        (f"import {CANARY}", "imports code"),
        ("include '/etc/passwd'", "is not allowed"),
        ("TinyExp.width = @subprocess.getoutput()", "references run code"),
        ("TinyExp.width = [1, {'a': @os.system}]", "references run code"),
        ("TinyExp.width = %X", "references run code"),
        ("X = 3", "defines a macro"),
        ("scope/TinyExp.width = 3", "scopes are not used"),
        ("TinyExp.width = 'x'", "expected an int"),
        ("TinyExp.learning_rate = 'x'", "expected a float"),
        ("TinyExp.depth = 3", "has no knob 'depth'"),
        ("NoSuchExp.width = 3", "not a registered experiment"),
        ("TinyExp.width = " + "[" * 600, "gin:"),
        ("TinyExp.width = '\\N{foo}'", "gin:"),
        ("TinyExp.width = (", "gin:"),
        ("\x00", "gin:"),
    ],
)
def test_gin_binds_only_literal_experiment_knobs(canary, binding, match):
    message = _one_line_error(match, gin_bindings=[binding])
    assert message.startswith("--gin_param=")


def test_gin_file_is_checked_the_same_way(tmp_path, canary):
    gin_file = tmp_path / "exp.gin"
    gin_file.write_text("TinyExp.width = 3\nimport subprocess\nTinyExp.learning_rate = 0.5\n")
    _one_line_error("'import subprocess' imports code", gin_files=[str(gin_file)])
    gin_file.write_text("tests.params.fake_experiments.TinyExp.width = 3\nTinyExp.learning_rate = 1\n")
    root = experiment.resolve(MODEL, gin_files=[str(gin_file)])
    assert root.task.width == 3 and root.task.train.learning_rate == 1.0
    _one_line_error("not UTF-8", gin_files=["/bin/ls"])
    _one_line_error("a directory", gin_files=[str(tmp_path)])


def test_gin_allow_code_is_the_explicit_opt_in(tmp_path):
    marker = tmp_path / "ran"
    binding = f"TinyExp.width = @os.system()"  # noqa: F541 (as a user would write it)
    _one_line_error("references run code", gin_bindings=[binding])
    gin_text = f"import os\nos.system.command = 'touch {marker}'\n"
    _one_line_error("imports code", gin_bindings=[gin_text])
    assert not marker.exists()
    # With the opt-in, gin is the code it always was: its own parser and registry apply.
    root = experiment.resolve(MODEL, gin_bindings=["TinyExp.width = 6"], gin_allow_code=True)
    assert root.task.width == 6


def test_gin_knobs_follow_kwargs_into_the_base_experiment():
    bindings = ["GPipeTransformerLM.num_stages = 2", "GPipeTransformerLM.num_train_sequences = 64"]
    root = experiment.resolve("lm.synthetic.GPipeTransformerLM", gin_bindings=bindings)
    assert root.input.train.num_sequences == 64
    with pytest.raises(ConfigError, match="expected an int"):
        experiment.resolve(
            "lm.synthetic.GPipeTransformerLM", gin_bindings=["TransformerLM.model_dim = 'wide'"]
        )
