"""--mode=mesh's set-up, without starting processes: the processes from --cluster_spec, each one's
share of the mesh's devices, and tools.local_cluster's commands for a mesh across processes."""

import pytest

from params.errors import ConfigError
from params.experiment import cluster_params
from tools import local_cluster
from trainer.distributed import mesh_cluster


def test_role_from_the_cluster_spec():
    role = mesh_cluster.resolve_role("trainer=h0:1,h1:2", 1)
    assert role.cluster == {"worker": ["h0:1", "h1:2"]} and role.task_index == 1


@pytest.mark.parametrize(
    "spec, index, message",
    [
        (None, 0, "--mode=mesh needs --cluster_spec=trainer=host:port,host:port"),
        ("trainer=h0:1@ps=h1:2", 0, "a mesh's processes are one job"),
        ("trainer=h0:1,h1:2", 2, "--task_index=2: the mesh has 2 process(es) (0..1)"),
    ],
)
def test_bad_cluster_specs_are_one_line(spec, index, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        mesh_cluster.resolve_role(spec, index)


def test_each_process_gets_its_share_of_the_mesh():
    p = cluster_params().set(mesh_shape=[2, 2], mesh_axis_names=["data", "model"])
    assert mesh_cluster.devices_per_process(p, 2) == 2
    assert mesh_cluster.devices_per_process(p, 4) == 1
    with pytest.raises(ConfigError, match="4 devices, not divisible among 3 processes"):
        mesh_cluster.devices_per_process(p, 3)
    with pytest.raises(ConfigError, match="names no mesh"):
        mesh_cluster.devices_per_process(cluster_params(), 2)


def test_local_cluster_starts_every_process_of_a_mesh():
    tasks = local_cluster.tasks(3, 0, ["--model=m", "--logdir=l"], python="py", mesh=True)
    assert [t.name for t in tasks] == ["trainer:0", "trainer:1", "trainer:2"]
    specs = {next(a for a in t.command if a.startswith("--cluster_spec=")) for t in tasks}
    assert len(specs) == 1 and specs.pop().count("127.0.0.1:") == 3
    for i, t in enumerate(tasks):
        assert t.command[:4] == ["py", "-m", "trainer", "--mode=mesh"]
        assert f"--task_index={i}" in t.command and not t.server
    with pytest.raises(ValueError):
        local_cluster.tasks(2, 1, [], mesh=True)
