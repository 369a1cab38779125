"""Two tasks on the 8x8 digits sharing one conv encoder: the digit (10 classes) and its parity (2).

``DigitsMultiTask`` is written as Lingvo writes a multi-task model (``Model()`` returning a
``MultiTaskModel``'s ``task_params`` / ``task_probs``, ``Train()`` / ``Dev()`` / ``Test()`` returning one
input per task, Params code through ``params.lingvo_compat``); ``DigitsTwoHeads`` is the same model
written the TensorPipe way. Both share the conv net's ``body`` (``share_layers``) and train with a
scheduler: SimpleAdaptiveScheduler (the task further below its expected accuracy trains more often)
and ExponentialScheduler. ``DigitsParity`` is the parity task alone, the single-task baseline.

Quality against single-task runs of the same total steps (each task's dev accuracy):

    .venv/bin/python -m tools.measure --model=image.digits_multitask.DigitsMultiTask \\
        --gin_param='DigitsMultiTask.max_steps = 600'
    .venv/bin/python -m tools.measure --model=image.digits.ConvNet --gin_param='ConvNet.max_steps = 600'
    .venv/bin/python -m tools.measure --model=image.digits_multitask.DigitsParity \\
        --gin_param='DigitsParity.max_steps = 600'
"""

from __future__ import annotations

from params import lingvo_compat as hyperparams
from params import registry
from params.hyperparams import Params
from tasks.base_input import set_split_mode
from tasks.image.input import DigitsInput, DigitsParityInput
from tasks.image.params.digits import ConvNet
from tasks.multi_task import MultiTaskExperiment, MultiTaskModel, multi_task_input
from tasks.task_scheduler import ExponentialScheduler, SimpleAdaptiveScheduler

TASKS = ("digit", "parity")
SHUFFLE_SEEDS = {"digit": 301, "parity": 302}  # the digit task reads as image.digits.ConvNet does


def _task(conv_net: ConvNet, name: str) -> Params:
    """The conv net's task for ``name``: 10 digit classes, or 2 for the parity."""
    p = ConvNet.task(conv_net)  # the conv net's own task, also for a subclass (DigitsParity)
    p.name = name
    p.softmax.num_classes = DigitsParityInput.NUM_CLASSES if name == "parity" else DigitsInput.NUM_CLASSES
    return p


def _input(name: str, split: str, batch_size: int) -> Params:
    cls = DigitsParityInput if name == "parity" else DigitsInput
    p = cls.Params().set(name=split, split=split, batch_size=batch_size)
    return set_split_mode(p, split, shuffle_seed=SHUFFLE_SEEDS[name])


class _SharedEncoder(MultiTaskExperiment):
    """The knobs of image.digits.ConvNet that shape the encoder and the learner, for both tasks."""

    def __init__(
        self,
        num_layers: int = 2,
        filters: int = 32,
        hidden_dim: int = 128,
        batch_size: int = 64,
        max_steps: int = 1500,
    ) -> None:
        self.batch_size = batch_size
        self.conv_net = ConvNet(
            num_layers=num_layers,
            filters=filters,
            hidden_dim=hidden_dim,
            batch_size=batch_size,
            max_steps=max_steps,
        )


@registry.register  # Lingvo: @model_registry.RegisterMultiTaskModel
class DigitsMultiTask(_SharedEncoder):  # Lingvo: base_model_params.MultiTaskModelParams
    """Digit and parity heads over one shared conv encoder, SimpleAdaptiveScheduler; Lingvo's form.

    Knobs: those of image.digits.ConvNet that shape the encoder and the learner (``num_layers``,
    ``filters``, ``hidden_dim``, ``batch_size`` per task, ``max_steps``: steps of all tasks together)."""

    def Model(self):  # noqa: N802 (Lingvo's names, as a Lingvo user writes them)
        p = hyperparams.adopt(MultiTaskModel.Params())  # Lingvo: base_model.MultiTaskModel.Params()
        p.name = "digits_multi_task"
        p.task_params = hyperparams.Params()
        p.task_probs = hyperparams.Params()
        for name in TASKS:
            p.task_params.Define(name, _task(self.conv_net, name), f"The {name} task.")
            p.task_probs.Define(name, 0.5, f"Relative probability of training {name}.")
        p.task_schedule = hyperparams.adopt(SimpleAdaptiveScheduler.Params()).Set(
            tasks=list(TASKS), expected=[0.99, 0.99], epsilon=0.05
        )
        p.share_layers = ["body"]  # one conv encoder: each task adds its softmax
        p.train = p.task_params.digit.train.Copy()  # the learner of every step
        return p

    def _Inputs(self, split):  # noqa: N802
        p = hyperparams.Params()
        for name in TASKS:
            p.Define(name, _input(name, split, self.batch_size), f"The {name} task's {split} input.")
        return p

    def Train(self):  # noqa: N802
        return self._Inputs("train")

    def Dev(self):  # noqa: N802
        return self._Inputs("dev")

    def Test(self):  # noqa: N802
        return self._Inputs("test")


@registry.register
class DigitsTwoHeads(_SharedEncoder):
    """The two digit tasks over one shared conv encoder, written the TensorPipe way; ExponentialScheduler
    from even odds towards the digit task (3:1)."""

    def task(self) -> Params:
        p = MultiTaskModel.Params().set(name="digits_two_heads", share_layers=["body"])
        for name in TASKS:
            p.task_params.define(name, _task(self.conv_net, name), f"The {name} task.")
        p.task_schedule = ExponentialScheduler.Params().set(
            alpha=0.005, task_probs=[("digit", (0.5, 0.75)), ("parity", (0.5, 0.25))]
        )
        p.train = p.task_params.digit.train.copy()
        return p

    def _inputs(self, split: str) -> Params:
        inputs = Params()
        for name in TASKS:
            inputs.define(name, _input(name, split, self.batch_size), f"The {name} task's {split} input.")
        return multi_task_input(split, inputs)

    def train(self) -> Params:
        return self._inputs("train")

    def dev(self) -> Params:
        return self._inputs("dev")

    def test(self) -> Params:
        return self._inputs("test")


@registry.register
class DigitsParity(ConvNet):
    """The parity of 8x8 digits (even / odd) with image.digits.ConvNet's model: the single-task baseline of
    image.digits_multitask's parity task."""

    def task(self) -> Params:
        return _task(self, "parity")

    def _input(self, split: str) -> Params:
        return _input("parity", split, self.batch_size)
