"""TensorFlow's strategies over a cluster: TF_CONFIG for its resolver, MultiWorkerMirroredStrategy for
``--mode=sync`` (RING all-reduce on CPU), and the collectives the sync loop uses (a barrier, packed
all-reduces, agreeing on a SIGTERM). ``--mode=async``'s ParameterServerStrategy is built in
parameter_servers.py."""

from __future__ import annotations

import json
import os

from layers import tf_compat
from params.errors import ConfigError
from trainer.distributed.roles import Role


def activate(role: Role) -> None:
    """Exports TF_CONFIG for TensorFlow's cluster resolver (before a strategy or server is built)."""
    os.environ["TF_CONFIG"] = json.dumps(role.tf_config())


def sync_strategy(role: Role):
    """MultiWorkerMirroredStrategy over the cluster, with RING all-reduce.

    A peer that dies is noticed by the collectives (its sockets close) or by TensorFlow's coordination
    service (its heartbeats stop); no per-collective timeout is set: in TF 2.21 each collective run
    with ``timeout_seconds`` leaks two threads, thousands per minute of training."""
    import tensorflow as tf

    activate(role)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if tf_compat.num_devices_per_worker(strategy) != 1:
        raise ConfigError("--mode=sync: each worker must hold one replica (one CPU or one GPU per process)")
    # Replica-context all-reduces without merge_call: with one replica per worker, the collective
    # ops the replica launches itself are those merge_call would launch, and they may then sit
    # inside the loop of steps (a tf.while_loop) and a pipeline's recomputed backward pass, where
    # merge_call cannot run. TensorFlow takes this same path itself under XLA on GPUs.
    tf_compat.disable_merge_call(strategy)
    return strategy


def barrier(strategy) -> None:
    """Returns once every replica of ``strategy`` got here (one tiny all-reduce)."""
    import tensorflow as tf

    def one() -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]))

    strategy.experimental_local_results(tf.function(lambda: strategy.run(one))())


def all_reduce_packed(replica, op, tensors: list) -> list:
    """``replica.all_reduce(op, tensors)`` as one collective per dtype rather than one per tensor.

    Between processes each collective costs a round trip or two (about a millisecond on loopback
    gRPC, more on a busy core), so a step that all-reduced each gradient and metric on its own spent
    more time waiting than computing. The sums are elementwise, so packing changes no value."""
    import tensorflow as tf

    out = list(tensors)
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for indices in by_dtype.values():
        parts = [tensors[i] for i in indices]
        sizes = [tf.size(t) for t in parts]
        packed = replica.all_reduce(op, tf.concat([tf.reshape(t, [-1]) for t in parts], 0))
        for i, t, piece in zip(indices, parts, tf.split(packed, tf.stack(sizes), num=len(parts))):
            out[i] = tf.reshape(piece, tf.shape(t))
    return out


def terminated_workers(strategy, num_workers: int):
    """A function ``(this worker's index, got SIGTERM) -> indices of the workers that got SIGTERM``.

    Every worker calls it at the same points of the loop (one tiny all-reduce), so all of them learn
    of a SIGTERM to any one at the same step and stop there together: the chief saves that step.
    TensorFlow's ``PreemptionCheckpointHandler`` agrees on a step the same way (through the
    coordination service) but wants to call each step itself and to save with its own
    ``CheckpointManager`` and exit; here the steps run in loops of many inside one compiled call and
    the chief saves through the project's Checkpointer (the logdir's ``ckpt-<step>`` layout)."""
    import tensorflow as tf

    def one(flags: tf.Tensor) -> tf.Tensor:
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, flags)

    reduce = tf.function(lambda flags: strategy.run(one, args=(flags,)))

    def call(index: int, terminated: bool) -> list[int]:
        flags = tf.one_hot(index, num_workers) * (1.0 if terminated else 0.0)
        total = strategy.experimental_local_results(reduce(flags))[0].numpy()
        return [i for i in range(num_workers) if total[i] > 0]

    return call
