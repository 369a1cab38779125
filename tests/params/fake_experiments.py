"""Experiments for the params and binary tests: small, with no model code behind them."""

from params import registry
from params.experiment import Experiment
from params.hyperparams import InstantiableParams, Params

CANARY = "tp_never_imported"  # a module that no test may import: tests/params/conftest.py's canary


def _task(width: int, learning_rate: float) -> InstantiableParams:
    p = InstantiableParams(dict)
    p.define("name", "task", "Name.")
    p.define("width", width, "Width of the model.")
    train = Params()
    train.define("learning_rate", learning_rate, "Learning rate.")
    train.define("max_steps", 100, "Steps.")
    p.define("train", train, "Training settings.")
    return p


def _input(split: str, batch_size: int) -> Params:
    p = Params()
    p.define("split", split, "Which split.")
    p.define("batch_size", batch_size, "Batch size.")
    return p


@registry.register
class TinyExp(Experiment):
    """A tiny experiment whose knobs gin can bind."""

    def __init__(self, width: int = 4, learning_rate: float = 0.1) -> None:
        self.width = width
        self.learning_rate = learning_rate

    def task(self) -> InstantiableParams:
        return _task(self.width, self.learning_rate)

    def train(self) -> Params:
        return _input("train", 8)

    def dev(self) -> Params:
        return _input("dev", 16)

    def task_overrides(self, dataset: str) -> dict:
        return {"width": 2} if dataset == "dev" else {}


class Unregistered(TinyExp):
    """Named by its import path only."""
