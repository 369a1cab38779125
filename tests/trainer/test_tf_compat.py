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
        ["grep", "-rn", "noqa: SLF001", "trainer", "tools", "tasks", "params", "layers"],
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


def _traced_with_custom_gradient():
    """A tf.function whose step takes its own gradient through a custom gradient (as a pipeline's)."""
    import tensorflow as tf

    v = tf.Variable([1.0, 2.0])

    def doubled(x):
        return x * 2.0, lambda dy: dy * 2.0

    @tf.function
    def step(scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.custom_gradient(doubled)(v * scale))
        return {"loss": loss, "grad": tape.gradient(loss, v)}

    return step, v


def test_custom_gradients_released_frees_the_trace_that_tensorflow_keeps():
    import gc
    import weakref

    import tensorflow as tf

    def trace_and_drop():
        step, _ = _traced_with_custom_gradient()
        graph = step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph
        return weakref.ref(graph)

    kept = trace_and_drop()
    gc.collect()
    assert kept() is not None  # TensorFlow's registry of custom gradients holds the trace
    with tf_compat.custom_gradients_released():
        freed = trace_and_drop()
    assert freed() is None


def test_without_graph_runs_the_trace_and_frees_its_graph():
    import gc
    import weakref

    import tensorflow as tf

    reference, _ = _traced_with_custom_gradient()
    want = reference(tf.constant(3.0))
    step, v = _traced_with_custom_gradient()
    spec = tf.TensorSpec([], tf.float32)
    with tf_compat.custom_gradients_released():
        graph = weakref.ref(step.get_concrete_function(spec).graph)
        run = tf_compat.without_graph(step, spec)
    del step
    gc.collect()
    assert graph() is None
    got = run(tf.constant(3.0))
    assert sorted(got) == ["grad", "loss"]
    assert float(got["loss"]) == float(want["loss"]) == 18.0
    assert got["grad"].numpy().tolist() == want["grad"].numpy().tolist() == [6.0, 6.0]
    v.assign([2.0, 2.0])  # the runtime's function reads the variable's current value
    assert float(run(tf.constant(1.0))["loss"]) == 8.0
