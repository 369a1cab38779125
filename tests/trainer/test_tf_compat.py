"""The private TensorFlow names of trainer/tf_compat.py still exist and mean what they meant."""

from __future__ import annotations

import subprocess
from pathlib import Path

from trainer import tf_compat

REPO = Path(__file__).resolve().parents[2]


def test_every_private_name_is_as_tried():
    problems = tf_compat.problems()
    assert problems == [], "\n".join(problems)


def test_a_changed_name_is_one_clear_line(monkeypatch):
    from tensorflow.python.distribute import collective_all_reduce_strategy as car

    monkeypatch.setattr(tf_compat, "_has_attribute", lambda cls, name: name != "_use_merge_call")
    problems = tf_compat.problems()
    assert len(problems) == 1 and "MultiWorkerMirroredStrategy.extended._use_merge_call" in problems[0]
    assert "tried with 2.21" in problems[0] and "update trainer/tf_compat.py" in problems[0]
    assert car.CollectiveAllReduceExtended  # the module the check reads


def test_the_state_file_and_trace_protos_parse():
    state = tf_compat.checkpoint_state_class()(model_checkpoint_path="ckpt-3")
    assert state.model_checkpoint_path == "ckpt-3"
    assert list(tf_compat.xspace_from_bytes(b"").planes) == []


def test_no_private_name_outside_the_compat_module():
    found = subprocess.run(
        ["grep", "-rn", "noqa: SLF001", "trainer", "tools", "tasks", "params"],
        cwd=REPO, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    assert found and all(line.startswith("trainer/tf_compat.py:") for line in found), found


def test_memory_heuristics_off_changes_only_the_memory_optimizer_inside_the_block():
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    before = ctx.function_call_options.config_proto_serialized
    with tf_compat.memory_heuristics_off():
        inside = config_pb2.ConfigProto.FromString(ctx.function_call_options.config_proto_serialized)
    assert ctx.function_call_options.config_proto_serialized == before
    want = config_pb2.ConfigProto.FromString(before)
    assert want.graph_options.rewrite_options.memory_optimization != rewriter_config_pb2.RewriterConfig.MANUAL
    want.graph_options.rewrite_options.memory_optimization = rewriter_config_pb2.RewriterConfig.MANUAL
    assert inside == want
