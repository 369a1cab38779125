"""A DTensor mesh spread over 2 processes x 2 logical CPUs (``--mode=mesh``, real processes on free
loopback ports): MeshTransformerLM trains to the weights of the unsharded model; each process writes
its own slices; and the checkpoint goes round placements: 2 processes ([1, 4]: the model axis across
processes) -> one process unsharded -> one process on a [2, 2] mesh -> 2 processes on [2, 2]; and the
trainer in one process (its own checkpointer, which keeps the input iterator) resumes it, with a mesh
of 4 logical devices or none, skipping its input to the step."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor

from layers.parallel import mesh as mesh_lib
from params import experiment
from tests.trainer import cluster_runner
from tests.trainer.cluster_runner import Procs
from tools import local_cluster
from trainer.checkpointer import Checkpointer
from trainer.distributed.mesh_placement import MeshPlacement
from trainer.train_job import TrainLoop
from trainer.train_step import TrainStep

MODEL = "lm.synthetic.MeshTransformerLM"
KNOBS = {
    "model_dim": 8,
    "num_heads": 4,
    "hidden_dim": 16,
    "num_layers": 1,
    "batch_size": 4,
    "seq_length": 8,
    "num_train_sequences": 64,
    "warmup_steps": 1,
}
FIRST, SECOND = 4, 6  # steps of the first run, and of the run resumed on the other mesh
TIMEOUT = 400  # seconds for one run of two processes on a loaded 2-core machine


def _bindings(data: int, model: int, max_steps: int) -> list[str]:
    knobs = dict(KNOBS, data_parallel=data, model_parallel=model, max_steps=max_steps)
    return [f"MeshTransformerLM.{k} = {v}" for k, v in knobs.items()]


# SGD at a constant rate: the key bias's exact gradient is 0 (softmax ignores it), so its computed
# one is rounding noise, which Adam would scale up to steps of size lr that differ with the mesh.
OVERRIDE = (
    "task.train.optimizer : 'sgd'; task.train.lr_schedule : 'constant'; task.train.learning_rate : 0.03; "
    "cluster.intra_op_threads : 1; cluster.inter_op_threads : 2; task.train.log_interval_steps : 2"
)


def _root(data: int, model: int, max_steps: int, extra: str = ""):
    text = OVERRIDE + (f"; {extra}" if extra else "")
    return experiment.resolve(MODEL, gin_bindings=_bindings(data, model, max_steps), params_override=text)


def _run_two_processes(tmp_path, logdir, data: int, model: int, max_steps: int) -> str:
    """Both processes of the mesh through the binary; returns task 0's output."""
    spec = local_cluster.cluster_spec(2, 0, local_cluster.free_ports(2))
    flags = [
        f"--model={MODEL}",
        f"--logdir={logdir}",
        f"--params_override={OVERRIDE}",
        "--cluster_wait_secs=120",
    ]
    flags += [f"--gin_param={b}" for b in _bindings(data, model, max_steps)]
    with Procs(tmp_path) as procs:
        started = [
            procs.trainer(f"mesh{i}", "--mode=mesh", f"--cluster_spec={spec}", f"--task_index={i}", *flags)
            for i in range(2)
        ]
        results = [procs.wait(p, TIMEOUT) for p in started]
    for code, out in results:
        assert code == 0, out[-3000:]
    return results[0][1]


def _plain_step(root) -> TrainStep:
    return TrainStep(experiment.task_params_for(root, "train"), root.input.train)


def _value(var: tf.Variable) -> np.ndarray:
    if not isinstance(var, dtensor.DVariable):
        return var.numpy()
    value = var.read_value()
    full = dtensor.relayout(
        value, dtensor.Layout.replicated(dtensor.fetch_layout(value).mesh, value.shape.rank)
    )
    return dtensor.unpack(full)[0].numpy()


def _state(step: TrainStep) -> dict[str, np.ndarray]:
    state = {f"task/{v.name}": _value(v) for v in step.task.variables}
    state.update({f"slot/{i}": _value(v) for i, v in enumerate(step.learner.slot_variables())})
    state["global_step"] = _value(step.global_step)
    return state


def _assert_equal_states(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def _save_plain(step: TrainStep, directory, at: int) -> str:
    objects = dict(task=step.task, learner=step.learner, global_step=step.global_step, iterator=step.iterator)
    return Checkpointer(str(directory), 0, **objects).save(at)


@pytest.fixture(scope="module")
def across(tmp_path_factory):
    """Two processes, mesh [1, 4] (each weight split over both processes), FIRST steps."""
    tmp = tmp_path_factory.mktemp("mesh_across")
    logdir = tmp / "run"
    out = _run_two_processes(tmp, logdir, 1, 4, FIRST)
    return logdir, out


@pytest.fixture(scope="module")
def reference():
    """The unsharded model trained FIRST steps in this process, and its state."""
    step = _plain_step(_root(1, 4, FIRST))
    finite, _ = step.run(FIRST)
    assert bool(finite.numpy())
    return step, _state(step)


@pytest.mark.slow
def test_two_processes_train_to_the_unsharded_weights(across, reference, tmp_path):
    logdir, out = across
    assert "mesh [1, 4] over 2 processes x 2 devices" in out
    assert f"trainer: done at step {FIRST}" in out
    step, _ = reference
    mine = _save_plain(step, tmp_path, FIRST)
    worst, compared = cluster_runner.max_weight_diff(str(logdir / "train" / f"ckpt-{FIRST}"), mine)
    assert compared > 10
    assert worst <= 1e-5, worst
    analysis = (logdir / "model_analysis.txt").read_text()
    assert "mesh: data=1 x model=4 (4 devices)" in analysis


@pytest.mark.slow
def test_each_split_weight_is_saved_as_its_slices(across):
    """The token embedding [36, 8] is split over the 4 devices of 2 processes: the checkpoint holds
    it as 4 slices of 9 rows, each written by the device that holds it; never whole."""
    logdir, _ = across
    reader = tf.train.load_checkpoint(str(logdir / "train" / f"ckpt-{FIRST}"))
    listing = reader.debug_string()  # the bundle's index: a split tensor's slices are its entries
    name = b"task/emb/token_emb/vars/emb/.ATTRIBUTES/VARIABLE_VALUE"
    slices = [line for line in listing.split(b"\n") if line.startswith(b"\x00" + name + b"\x00")]
    assert len(slices) == 4, listing[:2000]
    assert all(line.endswith(b"[9,8]") for line in slices), slices
    assert reader.get_tensor(name.decode()).shape == (36, 8)  # read whole, assembled from the slices


@pytest.mark.slow
def test_checkpoint_round_trip_across_placements(across, reference, tmp_path):
    logdir, _ = across
    # 2 processes [1, 4] -> one process, unsharded: every value exactly what the processes saved.
    saved = str(logdir / "train" / f"ckpt-{FIRST}")
    root = _root(1, 4, SECOND)
    plain = _plain_step(root)
    assert Checkpointer(str(logdir / "train"), 0, task=plain.task, learner=plain.learner,
                        global_step=plain.global_step).restore_latest() == saved  # fmt: skip
    hop = tmp_path / "hop"
    assert cluster_runner.max_weight_diff(saved, _save_plain(plain, hop, FIRST)) == (
        0.0,
        len(_state(plain)) - 1,
    )
    # -> a mesh of another shape in one process (1 x 4 devices, [2, 2]): equal again.
    mesh_root = _root(2, 2, SECOND)
    mesh = mesh_lib.create_mesh([2, 2], ["data", "model"], mesh_root.cluster.layout_rules)
    on_mesh = TrainStep(
        experiment.task_params_for(mesh_root, "train"), mesh_root.input.train, MeshPlacement(mesh)
    )
    assert on_mesh.placement.checkpointer(str(hop), 0, on_mesh).restore_latest()
    _assert_equal_states(_state(on_mesh), _state(plain))
    # -> back to 2 processes, on [2, 2] this time (the model axis within each process): resumed
    # from that checkpoint, its next steps end where the unsharded model's do.
    back = tmp_path / "back"
    (back / "train").mkdir(parents=True)
    on_mesh.placement.checkpointer(str(back / "train"), 0, on_mesh).save(FIRST)
    _run_two_processes(tmp_path, back, 2, 2, SECOND)
    plain.skip_to(FIRST)
    finite, _ = plain.run(SECOND - FIRST)
    assert bool(finite.numpy())
    worst, compared = cluster_runner.max_weight_diff(
        str(back / "train" / f"ckpt-{SECOND}"), _save_plain(plain, tmp_path / "ref", SECOND)
    )
    assert compared > 10 and worst <= 1e-5, worst
    shutil.rmtree(back, ignore_errors=True)


NO_MESH = "cluster.mesh_shape : []; cluster.layout_rules : ''"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The unsharded model trained SECOND + 2 steps in one go: its checkpoint."""
    step = _plain_step(_root(1, 4, SECOND + 2))
    finite, _ = step.run(SECOND + 2)
    assert bool(finite.numpy())
    return _save_plain(step, tmp_path_factory.mktemp("straight"), SECOND + 2)


def _train_loop(logdir, extra: str, max_steps: int) -> tuple[list[str], bool]:
    """The trainer's own loop (its placement and checkpointer from the Params) to ``max_steps``: its
    lines, and whether its restore positioned the input iterator."""
    lines: list[str] = []
    with TrainLoop(_root(1, 4, max_steps, extra), str(logdir), log=lines.append) as loop:
        assert loop.run() == max_steps
        return lines, loop.checkpointer.restored_input_position


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["", NO_MESH], ids=["mesh_of_4_devices", "no_mesh"])
def test_the_trainer_in_one_process_resumes_the_mesh_checkpoint(across, straight, tmp_path, extra):
    """The processes' checkpoint holds no input iterator; the trainer's checkpointer keeps one: it
    restores the rest and skips its input to the step, its next save holds that iterator, and a
    resume from there ends where the unsharded model trained in one go does."""
    logdir = tmp_path / "run"
    shutil.copytree(across[0], logdir)
    lines, positioned = _train_loop(logdir, extra, SECOND)
    assert f"trainer: resumed from {logdir / 'train' / f'ckpt-{FIRST}'} at step {FIRST}" in lines, lines
    assert not positioned  # skipped to the step
    lines, positioned = _train_loop(logdir, extra, SECOND + 2)
    assert f"trainer: resumed from {logdir / 'train' / f'ckpt-{SECOND}'} at step {SECOND}" in lines, lines
    assert positioned  # the iterator the skip made, saved at SECOND
    worst, compared = cluster_runner.max_weight_diff(str(logdir / "train" / f"ckpt-{SECOND + 2}"), straight)
    assert compared > 10 and worst <= 1e-5, worst
