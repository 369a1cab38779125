"""Resolution of an experiment into one frozen Params, and every override path with its precedence."""

import gin
import pytest

from params import experiment
from params.errors import ConfigError
from params.overrides import split_statements
from tests.params.fake_experiments import TinyExp

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
