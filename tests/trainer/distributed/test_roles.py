"""The cluster from flags or TF_CONFIG, the worker's input shard, local_cluster's commands (no processes)."""

import json

import numpy as np
import pytest
import tensorflow as tf

from params.errors import ConfigError
from tasks.base_input import BaseInput
from tools import local_cluster
from trainer.distributed import jobs, roles


def test_cluster_spec_in_lingvo_syntax_maps_jobs_to_tensorflow_task_types():
    spec = "controller=h0:1@trainer=h1:2,h2:3@ps=h3:4"
    assert roles.parse_cluster_spec(spec) == {
        "chief": ["h0:1"],
        "worker": ["h1:2", "h2:3"],
        "ps": ["h3:4"],
    }
    role = roles.resolve_role("async", spec, "trainer", 1)
    assert (role.task_type, role.task_index, role.num_workers, role.is_chief) == ("worker", 1, 2, False)
    assert roles.resolve_role("async", spec, "controller", 0).is_chief
    assert json.loads(json.dumps(role.tf_config()))["task"] == {"type": "worker", "index": 1}


def test_sync_worker_zero_is_the_chief_and_shards_follow_the_index():
    spec = "worker=127.0.0.1:1,127.0.0.1:2"
    chief, other = (roles.resolve_role("sync", spec, None, i) for i in (0, 1))
    assert chief.is_chief and not other.is_chief
    assert (chief.worker_index, other.worker_index, other.num_workers) == (0, 1, 2)


@pytest.mark.parametrize(
    "mode, spec, job, index, message",
    [
        ("sync", "worker=h:1@ps=h:2", None, 0, "parameter servers need --mode=async"),
        ("sync", "worker=h:1", None, 1, "--task_index=1: the worker job has 1 task"),
        ("sync", "worker=h", None, 0, "expected host:port, got 'h'"),
        ("sync", "evaler=h:1", None, 0, "unknown job 'evaler'"),
        ("sync", "worker=h:1@trainer=h:2", None, 0, "given twice"),
        ("async", "trainer=h:1@ps=h:2", "trainer", 0, "needs one controller"),
        ("async", "controller=h:1@trainer=h:2@ps=h:3", "evaler_dev", 0, "one of controller, trainer, ps"),
    ],
)
def test_bad_clusters_are_one_config_error(mode, spec, job, index, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        roles.resolve_role(mode, spec, job, index)


def test_lingvo_sync_layout_the_controller_is_the_chief_replica():
    """Lingvo's sync cluster names a controller and its workers: --job=controller is the chief (a
    replica that writes the logdir), each worker another replica. With no controller in the spec,
    --job=controller is trainer --task_index (0 writes the logdir)."""
    spec = "controller=h:1@worker=h:2"
    controller = roles.resolve_role("sync", spec, jobs.lingvo_job("sync", ["controller"]), 0)
    worker = roles.resolve_role("sync", spec, jobs.lingvo_job("sync", ["trainer"]), 0)
    assert (controller.name, controller.is_chief, controller.worker_index, controller.num_workers) == (
        "chief:0", True, 0, 2,
    )  # fmt: skip
    assert (worker.name, worker.is_chief, worker.worker_index) == ("worker:0", False, 1)
    trainers = "trainer=h:1,h:2"
    assert roles.resolve_role("sync", trainers, "controller", 0).name == "worker:0"
    assert roles.resolve_role("sync", trainers, "controller", 0).is_chief


def test_tf_config_from_the_environment(monkeypatch):
    config = {"cluster": {"chief": ["h:0"], "worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    role = roles.resolve_role("sync", None, None, 0)
    assert (role.num_workers, role.worker_index, role.is_chief) == (2, 1, False)  # the chief is replica 0
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG is not a cluster spec"):
        roles.resolve_role("sync", None, None, 0)
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ConfigError, match="needs --cluster_spec"):
        roles.resolve_role("sync", None, None, 0)


def test_jobs_of_a_cluster_process():
    assert jobs.lingvo_job("sync", []) is None
    assert jobs.lingvo_job("sync", ["controller", "trainer"]) == "controller"
    assert jobs.lingvo_job("sync", ["trainer"]) == "trainer"
    assert jobs.lingvo_job("async", ["ps"]) == "ps"
    with pytest.raises(ConfigError, match="evalers and decoders run outside the cluster"):
        jobs.lingvo_job("async", ["controller", "trainer"])


class _Numbers(BaseInput):
    def examples(self) -> tf.data.Dataset:
        return tf.data.Dataset.range(40).map(lambda i: {"x": i})


def _batches(index: int, count: int, n: int, skip: int = 0) -> list[np.ndarray]:
    p = _Numbers.Params().set(batch_size=8, shuffle_seed=3, repeat=True)
    inp = p.instantiate()
    inp.shard(index, count)
    return [b["x"] for b in inp.dataset().skip(skip).take(n).as_numpy_iterator()]


def test_worker_shards_together_hold_each_global_batch_deterministically():
    whole = _batches(0, 1, 6)
    shards = [_batches(i, 2, 6) for i in range(2)]
    for step in range(6):
        assert all(len(s[step]) == 4 for s in shards)
        assert sorted(np.concatenate([s[step] for s in shards])) == sorted(whole[step])
    assert all(np.array_equal(a, b) for a, b in zip(_batches(1, 2, 6), shards[1]))  # the same every time
    resumed = _batches(1, 2, 2, skip=4)  # a restarted worker skips to its step
    assert all(np.array_equal(a, b) for a, b in zip(resumed, shards[1][4:]))


def test_a_shard_needs_a_batch_divisible_by_the_workers():
    inp = _Numbers.Params().set(batch_size=6).instantiate()
    with pytest.raises(ConfigError, match="multiple of the 4 workers"):
        inp.shard(0, 4)


def test_local_cluster_commands():
    ports = local_cluster.free_ports(4)
    assert len(set(ports)) == 4
    spec = local_cluster.cluster_spec(2, 1, [1, 2, 3, 4])
    assert spec == "controller=127.0.0.1:1@trainer=127.0.0.1:2,127.0.0.1:3@ps=127.0.0.1:4"
    tasks = local_cluster.tasks(2, 0, ["--model=m", "--logdir=d"], python="py")
    assert [t.name for t in tasks] == ["trainer:0", "trainer:1"]
    assert tasks[1].command[:4] == ["py", "-m", "trainer", "--mode=sync"]
    assert "--task_index=1" in tasks[1].command and not tasks[1].server
    async_tasks = local_cluster.tasks(2, 1, [], python="py")
    assert [(t.name, t.server) for t in async_tasks] == [
        ("controller:0", False), ("trainer:0", True), ("trainer:1", True), ("ps:0", True),
    ]  # fmt: skip
    assert roles.parse_cluster_spec(async_tasks[0].command[4].split("=", 1)[1])["ps"]
