"""A run that changes its placement between restarts trains on like one run: lm.synthetic.
StageMeshTransformerLM trained plain (``num_stages = 0``) for N steps with Adam, then resumed on 2
stages x a 2-way mesh each, then pipelined (2 GPipe stages on plain devices), then plain again, each
hop a new trainer (``TrainLoop``, its logdir guard included) on the same logdir, ends within 1e-5 of
the plain model trained 4N steps in one go, optimizer slots included. The checkpoints it resumes
name each variable one GPipe level apart; trainer/checkpoint_names.py maps the variables and, by
their variables' names, Adam's m and v.

Adam's epsilon is 1e-4 here (the experiment's 1e-7): with a tiny epsilon, Adam divides the float
noise of a near-zero gradient (sums in another order across stages) by its own root mean square, and
a hop's placement alone moved a weight by 1.7e-5 in 3 steps; at 1e-4 the hops agree within 1e-7
(measured), while a resume without the slots ends 5e-3 away, and one without the step does not
resume at all (it trains from step 0)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from params import experiment
from params.errors import UserError
from tasks.learner import Learner
from tests.trainer.distributed.stage_mesh_training import resolved
from trainer import checkpoint_names
from trainer.checkpointer import Checkpointer
from trainer.train_job import TrainLoop

pytestmark = pytest.mark.slow  # long: run first (tests/conftest.py)

N, TOL = 2, 1e-5
KNOBS = [
    "model_dim = 8", "hidden_dim = 16", "num_heads = 2", "batch_size = 4", "seq_length = 4",
    "num_layers = 2", "max_steps = 8", "warmup_steps = 2", "num_train_sequences = 32",
]  # fmt: skip
OVERRIDE = f"task.train.optimizer : 'adam'; task.train.epsilon : 1e-4; task.train.save_interval_steps : {N}"
PLAIN, PIPELINED, STAGE_MESHES = ("num_stages = 0",), ("stage_mesh_size = 1",), ()
HOPS = (PLAIN, STAGE_MESHES, PIPELINED, PLAIN)


def _root(*knobs: str):
    return resolved(KNOBS + list(knobs), OVERRIDE)


def _train(logdir, knobs: tuple[str, ...], until: int) -> tuple[list[str], bool]:
    """The trainer's lines, and whether its restore positioned the input iterator."""
    lines: list[str] = []
    with TrainLoop(_root(*knobs), str(logdir), log=lines.append) as loop:
        assert loop.run(until) == until
        return lines, loop.checkpointer.restored_input_position


def _state(logdir, step: int) -> dict[str, np.ndarray]:
    """{name without the pipeline's level: value} of the task's variables and the optimizer's slots
    (``<variable>/<slot>``) in the checkpoint of ``step``, and the global step."""
    reader = tf.train.load_checkpoint(str(logdir / "train" / f"ckpt-{step}"))
    out = {name: reader.get_tensor(key) for name, key in checkpoint_names.saved_variables(reader).items()}
    for owner, slots in checkpoint_names.saved_slots(reader).items():
        out.update({f"{owner}/{slot}": reader.get_tensor(key) for slot, key in slots.items()})
    out["global_step"] = reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")
    return {name.replace(".pipeline.", "."): value for name, value in out.items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The plain model trained as many steps as the hops in one go (its state then)."""
    logdir = tmp_path_factory.mktemp("straight")
    _train(logdir, PLAIN, len(HOPS) * N)
    return _state(logdir, len(HOPS) * N)


def _check_hops(logdir, hops: list[tuple[str, ...]], straight: dict[str, np.ndarray]) -> None:
    for i, knobs in enumerate(hops):
        lines, positioned = _train(logdir, knobs, (i + 1) * N)
        if i:
            assert positioned  # the iterator itself, not a skip to the step's batch
            assert f"trainer: resumed from {logdir / 'train' / f'ckpt-{i * N}'} at step {i * N}" in lines
            assert "trainer: the Params differ from" in "\n".join(lines)  # a Params change, no flag
    got = _state(logdir, len(hops) * N)
    assert sorted(got) == sorted(straight)
    assert sum(name.endswith(("/m", "/v")) for name in got) == 2 * sum(
        "/" not in n for n in got if n != "global_step"
    )
    assert int(got["global_step"]) == len(hops) * N
    diff = {name: float(np.max(np.abs(got[name] - want))) for name, want in straight.items()}
    weights = [name for name in straight if "/" not in name and name != "global_step"]
    worst = max(weights, key=diff.get)
    start = _state(logdir, N)
    moved = max(float(np.max(np.abs(straight[k] - start[k]))) for k in weights)
    assert diff[worst] <= TOL < moved, (worst, diff[worst], moved)
    worst = max(diff, key=diff.get)  # the slots too
    assert diff[worst] <= TOL, (worst, diff[worst])


def test_plain_then_pipeline_x_mesh_then_pipelined_then_plain_trains_like_one_plain_run(straight, tmp_path):
    """Each restart another placement: the stage-mesh trainer restores the plain checkpoint by name
    into its plain-device mirror (what its checkpoints hold: the pipelined paths), the pipelined
    trainer resumes that, and the plain one the pipelined's."""
    _check_hops(tmp_path, list(HOPS), straight)


def _saver(directory, *knobs: str, optimizer: str = "adam", reverse: bool = False):
    """(task, learner, checkpointer) of the experiment's train task, no step built; ``reverse``: the
    learner built for the variables in the reverse order."""
    task = experiment.task_params_for(_root(*knobs), "train").instantiate()
    variables = list(task.trainable_variables)[:: -1 if reverse else 1]
    learner = Learner(task.params.train.copy().set(optimizer=optimizer), variables)
    step = tf.Variable(0, dtype=tf.int64)
    return task, learner, Checkpointer(str(directory), 1, task=task, learner=learner, global_step=step)


def test_slots_follow_their_variables_not_their_order(tmp_path):
    """The slots of a checkpoint are keyed by position (the i-th variable its learner was built
    for), an order each placement makes (TrainStep: the task's ``trainable_variables``, an order of
    attribute names). Here the pipelined trainer's learner lists them in the reverse order, so slots by
    position would land on other variables; by name each lands on its own. A checkpoint without the
    slots this optimizer needs is one line, and nothing is assigned. No step is run."""
    task, learner, saver = _saver(tmp_path / "plain", *PLAIN)
    for i, v in enumerate(task.trainable_variables):  # each slot a value of its own
        for j, slot in enumerate(learner.optimizer.slots_of(v).values()):
            slot.assign(tf.fill(slot.shape, float(10 * i + j)))
    saved = {
        f"{checkpoint_names.name_of(v)}/{name}": slot.numpy()
        for v in task.trainable_variables
        for name, slot in learner.optimizer.slots_of(v).items()
    }
    path = saver.save(3)
    other, other_learner, resumed = _saver(tmp_path / "plain", *PIPELINED, reverse=True)
    assert resumed.restore_latest() == path
    for v in other.trainable_variables:
        name = checkpoint_names.name_of(v).replace(".pipeline.", ".")
        for slot, value in other_learner.optimizer.slots_of(v).items():
            np.testing.assert_array_equal(value.numpy(), saved[f"{name}/{slot}"], err_msg=f"{name}/{slot}")

    # Saved by SGD (no slots), resumed with Adam: the first missing slot, one line; nothing assigned.
    _, _, sgd = _saver(tmp_path / "sgd", *PLAIN, optimizer="sgd")
    sgd.save(3)
    fresh, _, adam = _saver(tmp_path / "sgd", *PIPELINED)
    before = [v.numpy() for v in fresh.variables]
    with pytest.raises(UserError, match="^[^\n]*holds no optimizer slot m of task\\.") as e:
        adam.restore_latest()
    assert "nothing was restored, no checkpoint touched" in str(e.value)
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(fresh.variables, before))
