"""Lingvo model classes carried over as a Lingvo user would: capitalised ``Task``/``Train``/``Dev``/``Test``
and Params code through ``params.lingvo_compat``; only the base class and the registration changed.
The model is the linear regression of linear_experiment.py; data files come by input.<ds>.data_file."""

from params import lingvo_compat as hyperparams
from params import registry
from params.experiment import Experiment
from tests.trainer.linear_experiment import LinearInput, LinearTask


def _task() -> hyperparams.InstantiableParams:
    p = hyperparams.adopt(LinearTask.Params())
    p.Set(name="linear")
    p.train.Set(learning_rate=0.05, max_steps=20, save_interval_steps=10, log_interval_steps=10)
    p.eval.poll_interval_seconds = 0.2
    return p


def _input(name: str, batch_size: int, train: bool) -> hyperparams.InstantiableParams:
    p = hyperparams.adopt(LinearInput.Params())
    return p.Set(name=name, batch_size=batch_size, repeat=train, shuffle_seed=7 if train else None)


@registry.register
class LingvoLinear(Experiment):
    """Linear regression written with Lingvo's method names."""

    def Task(self):
        return _task()

    def Train(self):
        return _input("train", 16, True)

    def Dev(self):
        return _input("dev", 16, False)

    def Test(self):
        return _input("test", 8, False)


@registry.register
class LingvoEvalOnly(Experiment):
    """No Train(): nothing in a run of it writes checkpoints."""

    def Task(self):
        return _task()

    def Dev(self):
        return _input("dev", 16, False)
