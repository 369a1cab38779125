"""Every private TensorFlow name the project uses, in one place, each with why it is needed.

Tried with TensorFlow 2.21 (``TRIED``). ``problems()`` checks that each name still exists and means
what it meant; tests/trainer/test_tf_compat.py fails with its message when a TensorFlow upgrade
changes one, so the fix is made here, not found as a traceback in a training run.

- ``MultiWorkerMirroredStrategy.extended._num_devices_per_worker``: a sync worker must hold exactly one
  replica (the step's all-reduces are launched by the replica itself, see ``disable_merge_call``);
  TensorFlow has no public count of the local replicas of a multi-worker strategy.
- ``MultiWorkerMirroredStrategy.extended._use_merge_call``: replica-context all-reduces without
  ``merge_call``, so the collectives can sit inside the loop of steps (a ``tf.while_loop``) and a
  pipeline's recomputed backward pass, where ``merge_call`` cannot run. TensorFlow takes this same
  path itself under XLA on GPUs; there is no public switch.
- ``tensorflow.python.training.checkpoint_state_pb2.CheckpointState``: the ``checkpoint`` state file's
  proto, parsed strictly so that a damaged file is reported instead of read as "nothing saved"
  (``tf.train.get_checkpoint_state`` swallows the parse error).
- ``tensorflow.tsl.profiler.protobuf.xplane_pb2.XSpace``: the profiler's trace files (``*.xplane.pb``),
  read for measured per-device timelines and memory; ``tf.profiler`` writes them but has no reader.
- ``tensorflow.python.eager.context``'s ``context().function_call_options`` and ``FunctionCallOptions``:
  the Grappler config of the functions called on this thread, so that a mesh step can be compiled
  without Grappler's memory heuristics (``memory_heuristics_off``); ``tf.config.optimizer`` has no
  switch for the memory optimizer.
- ``tensorflow.python.eager.record.record_operation`` and ``VariableWatcher`` (used by
  layers/parallel/pipeline/executor.py, the one private name under layers/): a GPipe pipeline whose
  stages sit on different DTensor meshes records its gradient function on the tape itself, since
  ``tf.custom_gradient`` joins inputs, outputs and variables in one ``IdentityN``, which DTensor
  refuses across meshes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

TRIED = ("2.21",)  # TensorFlow versions these names were tried with


def num_devices_per_worker(strategy: Any) -> int:
    """Local replicas of a ``MultiWorkerMirroredStrategy`` (one per CPU or GPU of this worker)."""
    return int(strategy.extended._num_devices_per_worker)  # noqa: SLF001


def disable_merge_call(strategy: Any) -> None:
    """Makes a multi-worker strategy's replicas all-reduce themselves instead of through merge_call."""
    strategy.extended._use_merge_call = lambda: False  # noqa: SLF001


def checkpoint_state_class() -> type:
    """The proto class of a checkpoint directory's ``checkpoint`` file."""
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState

    return CheckpointState


def xspace_from_bytes(data: bytes) -> Any:
    """A profiler trace file (``*.xplane.pb``) as its ``XSpace`` proto."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    return xplane_pb2.XSpace.FromString(data)


@contextlib.contextmanager
def memory_heuristics_off() -> Iterator[None]:
    """Functions first called on this thread inside the block are optimized without Grappler's
    memory heuristics (``RewriterConfig.memory_optimization: MANUAL``); every other setting of the
    current config is kept.

    Why (TF 2.21, DTensor): in the per-device function of a DTensor step, each DVariable argument
    carries the variable's global shape (``_handle_shapes``, as its per-device handle was created)
    while DTensor's SPMD expansion gave it the local slice's (``_assigned_resource_local_shape``).
    Grappler's static shapes then have a sharded weight at its global shape next to local
    activations, and the memory optimizer's swapping and scheduling heuristics, which estimate
    memory with the op-level cost model, print ``op_level_cost_estimator ... Incompatible Matrix
    dimensions`` (ERROR level) once per device for every matmul whose contracted dimension is split.
    Our code cannot give the handles their local shapes. MANUAL keeps the rest of the memory
    optimizer (measured: the 2 x 2 MeshTransformerLM step it rewrites is byte-identical to the
    default's); the heuristics act only when a device's estimated peak memory nears its capacity
    (swapping only on GPUs), and on a mesh that estimate uses the wrong, global weight shapes anyway.
    """
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    saved = ctx.function_call_options
    config = config_pb2.ConfigProto.FromString(saved.config_proto_serialized)
    config.graph_options.rewrite_options.memory_optimization = rewriter_config_pb2.RewriterConfig.MANUAL
    ctx.function_call_options = context.FunctionCallOptions(
        executor_type=saved.executor_type, config_proto=config
    )
    try:
        yield
    finally:
        ctx.function_call_options = saved


def problems() -> list[str]:
    """One line per private name that this TensorFlow no longer has as expected ([]: all fine)."""
    import tensorflow as tf

    out = []

    def fail(name: str, error: object) -> None:
        out.append(
            f"TensorFlow {tf.__version__} changed {name} (tried with {', '.join(TRIED)}): {error}; "
            "update trainer/tf_compat.py"
        )

    try:
        from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceExtended

        for name in ("_num_devices_per_worker", "_use_merge_call"):
            if not _has_attribute(CollectiveAllReduceExtended, name):
                fail(f"MultiWorkerMirroredStrategy.extended.{name}", "no such attribute")
    except ImportError as e:
        fail("CollectiveAllReduceExtended (MultiWorkerMirroredStrategy.extended)", e)
    try:
        state = checkpoint_state_class()(model_checkpoint_path="ckpt-1")
        if state.model_checkpoint_path != "ckpt-1" or not hasattr(state, "all_model_checkpoint_paths"):
            fail("CheckpointState", "other fields")
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        fail("checkpoint_state_pb2.CheckpointState", e)
    try:
        if list(xspace_from_bytes(b"").planes) != []:
            fail("xplane_pb2.XSpace", "an empty file has planes")
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        fail("xplane_pb2.XSpace", e)
    try:
        from tensorflow.python.eager import context

        before = context.context().function_call_options
        with memory_heuristics_off():
            inside = context.context().function_call_options.config_proto_serialized
        if context.context().function_call_options is not before or inside == before.config_proto_serialized:
            fail("context().function_call_options", "setting it did not take effect")
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        fail("eager context.function_call_options / FunctionCallOptions", e)
    try:
        from tensorflow.python.eager import record

        for name in ("record_operation", "VariableWatcher"):
            if not hasattr(record, name):
                fail(f"tensorflow.python.eager.record.{name}", "no such name")
    except ImportError as e:
        fail("tensorflow.python.eager.record", e)
    return out


def _has_attribute(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute, or one its __init__ sets."""
    import inspect

    if any(name in vars(base) for base in cls.__mro__):
        return True
    try:
        return f"self.{name} =" in inspect.getsource(cls)
    except (OSError, TypeError):
        return False
