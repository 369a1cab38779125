"""Every private TensorFlow name the project uses, in one place, each with why it is needed.

Tried with TensorFlow 2.21 (``TRIED``). ``problems()`` checks that each name still exists and means
what it meant; tests/layers/test_tf_compat.py fails with its message when a TensorFlow upgrade
changes one, so the fix is made here, not found as a traceback in a training run. That test also
parses every module of the packages: an import of a private TensorFlow module (``tensorflow.python``,
``tensorflow.core``, ...) or a ``_name`` read on a TensorFlow object anywhere else fails it.

It lives in ``layers``, the lowest package that needs a private name (the pipeline executor): imports
flow one way (params <- layers <- tasks <- trainer <- tools), so from here every package that uses
TensorFlow can reach it. Importing it imports no TensorFlow; each name is imported where it is used.

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
- ``tensorflow.core.protobuf.trackable_object_graph_pb2.TrackableObjectGraph``: a checkpoint's object
  graph (its ``_CHECKPOINTABLE_OBJECT_GRAPH`` entry), read for each variable's name beside its key, so
  that a checkpoint restores by name into a task placed otherwise (trainer/checkpoint_names.py: a
  GPipe level more or less); ``tf.train`` reads the entry's bytes but has no parser for them.
- ``tensorflow.tsl.profiler.protobuf.xplane_pb2.XSpace``: the profiler's trace files (``*.xplane.pb``),
  read for measured per-device timelines and memory; ``tf.profiler`` writes them but has no reader.
- ``tensorflow.python.eager.context``'s ``context().function_call_options`` and ``FunctionCallOptions``:
  the Grappler config of the functions called on this thread, so that a mesh step can be compiled
  without Grappler's memory heuristics (``memory_heuristics_off``); ``tf.config.optimizer`` has no
  switch for the memory optimizer.
- ``tensorflow.python.eager.record.record_operation`` and ``VariableWatcher`` (``record`` below, used
  by layers/parallel/pipeline/executor.py): a GPipe pipeline whose
  stages sit on different DTensor meshes records its gradient function on the tape itself, since
  ``tf.custom_gradient`` joins inputs, outputs and variables in one ``IdentityN``, which DTensor
  refuses across meshes.
- ``tensorflow.python.framework.ops._gradient_registry._registry``: the registry where a
  ``tf.custom_gradient`` traced in graph mode (inside a ``tf.function``) registers its gradient
  function under a fresh name (``CustomGradient-<uid>``), never removed; that function holds the
  traced graph's tensors, so every trace of a step with a custom gradient (a GPipe pipeline, its
  splits and concats) stays in memory for the life of the process (TF 2.21).
  ``custom_gradients_released`` removes the entries of traces whose gradients are all taken inside.
- ``ConcreteFunction._inference_function`` and ``AtomicFunction(name, context, function_type,
  children, call_options)`` (``tensorflow.python.eager.polymorphic_function.atomic_function``): a
  traced function called by its name in the runtime, without the Python graph it was traced from
  (``without_graph``). ``tf.function`` keeps that graph (about 11 KiB a node) as long as the function
  lives, though a call only needs the runtime's copy; for a GPipe step in the trainer of stages on
  other processes it was a third of the trainer's peak.
- The environment variable ``DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION`` (set by
  layers/parallel/mesh.py, ``keep_all_reduces_apart``): DTensor's all-reduce combiner merges
  all-reduces that are independent inside one mesh's function though they depend on each other
  through another mesh, so a GPipe step over stage meshes hung. The variable (read by TensorFlow's C++,
  not documented) is the only switch, read once when DTensor's device is made; the check below fails
  when TensorFlow's library no longer holds its name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

TRIED = ("2.21",)  # TensorFlow versions these names were tried with


def __getattr__(name: str) -> Any:
    """``record``: TensorFlow's ``tensorflow.python.eager.record`` module (``from layers.tf_compat
    import record``), imported on first use."""
    if name == "record":
        from tensorflow.python.eager import record

        return record
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


def checkpoint_object_graph(data: bytes) -> Any:
    """A checkpoint's ``_CHECKPOINTABLE_OBJECT_GRAPH`` entry as its ``TrackableObjectGraph`` proto."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    return trackable_object_graph_pb2.TrackableObjectGraph.FromString(data)


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


CUSTOM_GRADIENT_PREFIX = "CustomGradient-"  # tf.custom_gradient's names in graph mode


def _gradient_registry() -> dict:
    from tensorflow.python.framework import ops

    return ops._gradient_registry._registry  # noqa: SLF001


@contextlib.contextmanager
def custom_gradients_released() -> Iterator[None]:
    """The gradient functions that ``tf.custom_gradient`` registers inside the block are unregistered
    when it ends, so a graph traced in it can be freed once nothing else holds it.

    Why: TensorFlow registers each graph-mode custom gradient globally and never removes it, and the
    registered function holds the traced graph (its Python ops and the C++ graph with its shapes). A
    GPipe step's trace is large (8 layers x 4 micro-batches, fill-drain with remat: ~27k nodes, ~0.4
    GiB resident in the trainer), and the trainer traces the step more than once (the outputs' probe,
    the bytes report, the step that runs): kept, those traces were most of the trainer's memory. Only
    for traces whose gradients are all taken inside the block (a step's tape is inside the step);
    differentiating such a graph from outside after the block fails with ``LookupError``.
    """
    import gc

    registry = _gradient_registry()
    before = set(registry)
    try:
        yield
    finally:
        for name in set(registry) - before:
            if name.startswith(CUSTOM_GRADIENT_PREFIX):
                del registry[name]
        gc.collect()  # the traced graph is a cycle of Python objects (graph <-> ops)


def without_graph(function: Any, *signature: Any) -> Callable[..., Any]:
    """``function`` (a ``tf.function``) traced for ``signature``, as a callable that keeps only the
    runtime's copy of the trace: the Python graph is freed once nothing else holds it (its custom
    gradients too: trace it inside ``custom_gradients_released``). The callable takes the
    signature's tensors and returns the function's structured outputs; it cannot be differentiated
    or traced again."""
    from tensorflow.python.eager.polymorphic_function import atomic_function

    concrete = function.get_concrete_function(*signature)
    inference = concrete._inference_function  # noqa: SLF001

    def detached(atomic: Any) -> Any:  # a second reference to the runtime function, no graph
        options = atomic.call_options
        if options.control_captures:
            raise ValueError(f"{atomic.name!r} has control captures: it needs its graph")
        return atomic_function.AtomicFunction(
            atomic.name,
            context_of(atomic),
            atomic.function_type,
            [detached(child) for child in atomic.children],
            atomic_function.CallOptions(
                collective_manager_ids_used=options.collective_manager_ids_used,
                is_stateful=options.is_stateful,
            ),
        )

    def context_of(atomic: Any) -> Any:
        return atomic._bound_context  # noqa: SLF001

    runtime = detached(inference)
    captures = list(concrete.captured_inputs)
    del concrete, inference

    def call(*args: Any) -> Any:
        return runtime.call_preflattened(list(args) + captures)

    return call


def problems() -> list[str]:
    """One line per private name that this TensorFlow no longer has as expected ([]: all fine)."""
    import tensorflow as tf

    out = []

    def fail(name: str, error: object) -> None:
        out.append(
            f"TensorFlow {tf.__version__} changed {name} (tried with {', '.join(TRIED)}): {error}; "
            "update layers/tf_compat.py"
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
        if list(checkpoint_object_graph(b"").nodes) != []:
            fail("trackable_object_graph_pb2.TrackableObjectGraph", "an empty graph has nodes")
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        fail("trackable_object_graph_pb2.TrackableObjectGraph", e)
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
    try:
        registry = _gradient_registry()
        before = set(registry)
        import tensorflow as tf

        @tf.function
        def probe(x: Any) -> Any:
            return tf.custom_gradient(lambda x: (tf.identity(x), lambda dy: dy))(x)

        probe.get_concrete_function(tf.TensorSpec([], tf.float32))
        added = set(registry) - before
        if not isinstance(registry, dict) or not any(n.startswith(CUSTOM_GRADIENT_PREFIX) for n in added):
            fail("ops._gradient_registry._registry", f"a traced custom gradient registered {sorted(added)}")
    except (ImportError, AttributeError, TypeError, ValueError) as e:
        fail("tensorflow.python.framework.ops._gradient_registry._registry", e)
    if not _library_mentions(b"DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION\0"):
        fail("the environment variable DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION", "not read")
    return out


def _library_mentions(text: bytes) -> bool:
    """Whether TensorFlow's C++ library holds ``text`` (an environment variable's name it reads)."""
    import mmap
    import os

    import tensorflow as tf

    path = os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.so.2")
    if not os.path.exists(path):
        return True  # another build's layout: nothing to check against
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(text) >= 0


def _has_attribute(cls: type, name: str) -> bool:
    """Whether instances of ``cls`` have ``name``: a class attribute, or one its __init__ sets."""
    import inspect

    if any(name in vars(base) for base in cls.__mro__):
        return True
    try:
        return f"self.{name} =" in inspect.getsource(cls)
    except (OSError, TypeError):
        return False
