"""Experiments written with Lingvo's Task/Train/Dev/Test are ported when defined, or refused in one line."""

import re

import pytest

from params import experiment
from params import lingvo_compat as hyperparams
from params.errors import ConfigError
from params.experiment import Experiment
from tests.params.fake_experiments import TinyExp


def _input(split: str) -> hyperparams.Params:
    p = hyperparams.Params()
    p.Define("split", split, "Which split.")
    p.Define("batch_size", 8, "Batch size.")
    return p


class LingvoStyle(Experiment):
    """A Lingvo model class with only its base class changed."""

    def Task(self):
        p = hyperparams.InstantiableParams(dict)
        p.Define("name", "lingvo_task", "Name.")
        return p

    def Train(self):
        return _input("train")

    def Dev(self):
        return _input("dev")

    @classmethod
    def Test(cls):  # older Lingvo models define them as classmethods
        return _input("test")

    def Helper(self, split):  # takes an argument: not a data set, left alone
        return _input(split)


def test_capitalised_methods_become_the_task_and_lowercase_data_sets():
    assert LingvoStyle.dataset_names() == ["dev", "test", "train"]
    root = experiment.build_params(LingvoStyle(), "lingvo_style")
    assert root.task.name == "lingvo_task"
    assert root.input.names() == ["dev", "test", "train"]
    assert root.input.test.split == "test"
    assert "Train" not in root.input.names()


def test_a_subclass_overriding_a_capitalised_method_is_used():
    class Variant(LingvoStyle):
        def Dev(self):
            return _input("dev_other")

    assert experiment.build_params(Variant(), "variant").input.dev.split == "dev_other"


def test_the_lowercase_contract_is_unchanged():
    assert TinyExp.dataset_names() == ["dev", "train"]


@pytest.mark.parametrize(
    "body, message",
    [
        ("def Dev(self): return 1\n    def dev(self): return 2", "defines both Dev() and dev()"),
        ("def Task(self): return 1\n    def task(self): return 2", "defines both Task() and task()"),
        (
            "def Model(self): return 1",
            "Lingvo's Model() makes a multi-task model; derive the class from tasks.multi_task",
        ),
        ("def ProgramSchedule(self): return 1", "program schedules"),
        ("def Cluster(self): return 1", "named 'cluster', which is the Experiment method"),
    ],
)
def test_what_cannot_be_ported_is_refused_when_the_class_is_defined(body, message):
    source = f"class Bad(Experiment):\n    {body}\n"
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        exec(source, {"Experiment": Experiment, "__name__": "my_models"})  # a class statement, as in a module
    assert "\n" not in str(error.value) and "my_models.Bad" in str(error.value)


def test_an_experiment_without_a_task_is_one_config_error():
    class NoTask(Experiment):
        def train(self):
            return _input("train")

    with pytest.raises(ConfigError, match="must define task\\(\\) \\(Lingvo's Task\\(\\)\\)"):
        experiment.build_params(NoTask(), "no_task")
