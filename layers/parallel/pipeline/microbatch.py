"""Micro-batches: a batch split into M parts and joined back, with and without a stage mesh's data axis.

``micro_batches`` / ``joined_micro_batches`` are the plain split and join; ``split_with_grad_on`` /
``concat_with_grad_on`` are the same with their gradients placed on a given device (the first
stage's, the last's), not wherever the tape happens to be. ``MicroBatcher`` is the GPipe layer's
use of them: how many micro-batches a batch makes, its inputs split for training (equal parts of a
static batch) or inference (near-equal parts of any batch), and the outputs joined.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from layers.parallel.device_choice import on
from params.errors import ConfigError


def split_with_grad_on(
    device: str | None, x: tf.Tensor, num: int, axis: int, replicas: int = 1
) -> list[tf.Tensor]:
    """``num`` micro-batches of ``x`` along ``axis`` whose gradient (the parts' gradients joined)
    runs on ``device``: the first stage's, not wherever the tape happens to be. With ``replicas``
    (a stage mesh's data axis splits the batch), see ``micro_batches``."""

    @tf.custom_gradient
    def split(x: tf.Tensor) -> Any:
        def grad(*dys: Any) -> tf.Tensor:
            with on(device), tf.name_scope("split_micro_batches_grad"):
                parts = (
                    micro_batches(tf.zeros_like(x), num, axis, replicas)
                    if any(d is None for d in dys)
                    else []
                )
                dense = [tf.convert_to_tensor(d) if d is not None else parts[i] for i, d in enumerate(dys)]
                return joined_micro_batches(dense, axis, replicas)

        return micro_batches(x, num, axis, replicas), grad

    if not x.dtype.is_floating:
        return micro_batches(x, num, axis, replicas)
    return list(split(x))


def concat_with_grad_on(
    device: str | None, parts: list[tf.Tensor], axis: int, replicas: int = 1
) -> tf.Tensor:
    """The micro-batches ``parts`` joined along ``axis`` (``tf.concat``; with ``replicas``, the
    inverse of ``micro_batches``), whose gradient (the output gradient split back into
    micro-batches) runs on ``device``: the last stage's. The split sizes are static where the shapes
    are, so a part's gradient does not wait for the other parts' forwards (1F1B relies on it)."""
    if not parts[0].dtype.is_floating:
        return joined_micro_batches(parts, axis, replicas)

    @tf.custom_gradient
    def concat(*parts: tf.Tensor) -> Any:
        def grad(dy: Any) -> list[tf.Tensor]:
            with on(device), tf.name_scope("join_micro_batches_grad"):
                dy = tf.convert_to_tensor(dy)
                if replicas > 1:
                    return micro_batches(dy, len(parts), axis, replicas)
                static = [p.shape[axis] if p.shape.rank is not None else None for p in parts]
                if all(s is not None for s in static):
                    sizes = [int(s) for s in static]
                else:
                    sizes = tf.stack([tf.shape(p)[axis] for p in parts])
                return tf.split(dy, sizes, axis=axis, num=len(parts))

        return joined_micro_batches(parts, axis, replicas), grad

    return concat(*parts)


def micro_batches(x: tf.Tensor, num: int, axis: int, replicas: int = 1) -> list[tf.Tensor]:
    """``x`` split into ``num`` equal micro-batches along ``axis``. One replica: consecutive rows
    (``tf.split``). ``replicas`` R > 1 (a data axis of a stage mesh splits the batch into R
    consecutive blocks, one per replica; DTensor cannot split along a split dimension): micro-batch
    m takes the m-th of ``num`` consecutive slices of every replica's block, so each replica splits
    only the rows it holds and a micro-batch is split over the replicas as the batch was. Every
    row is in exactly one micro-batch, so sums over the batch are unchanged."""
    if replicas == 1:
        return tf.split(x, num, axis=axis)
    shape = x.shape.as_list()
    rows, rest = shape[axis], shape[axis + 1 :]
    if rows is None or rows % (replicas * num) or any(d is None for d in shape):
        raise ValueError(
            f"a batch of {rows} rows does not split into {replicas} replicas x {num} micro-batches"
        )
    blocks = tf.reshape(x, shape[:axis] + [replicas, num, rows // (replicas * num)] + rest)
    perm = list(range(len(shape) + 2))
    perm[axis], perm[axis + 1] = axis + 1, axis
    parts = tf.unstack(tf.transpose(blocks, perm), axis=axis)
    return [tf.reshape(p, shape[:axis] + [rows // num] + rest) for p in parts]


def joined_micro_batches(parts: list[tf.Tensor], axis: int, replicas: int = 1) -> tf.Tensor:
    """The batch that ``micro_batches(..., replicas)`` split into ``parts``, rows in their order."""
    if replicas == 1:
        return tf.concat(parts, axis=axis)
    shape = parts[0].shape.as_list()
    num, rows, rest = len(parts), shape[axis], shape[axis + 1 :]
    stacked = tf.reshape(tf.stack(parts, axis=axis), shape[:axis] + [num, replicas, rows // replicas] + rest)
    perm = list(range(len(shape) + 2))
    perm[axis], perm[axis + 1] = axis + 1, axis
    return tf.reshape(tf.transpose(stacked, perm), shape[:axis] + [rows * num] + rest)


def static_bytes(tensors: list[tf.Tensor]) -> int:
    """The bytes of ``tensors`` whose shapes are fully known (e.g. what one micro-batch feeds a stage)."""
    return sum(t.shape.num_elements() * t.dtype.size for t in tensors if t.shape.is_fully_defined())


@dataclasses.dataclass(frozen=True)
class MicroBatcher:
    """How a GPipe layer (named ``path`` in its errors) splits its inputs into micro-batches along
    ``batch_dim`` and joins its outputs: ``num_micro_batches`` M, or ``micro_batch_size`` examples
    each (0: unused); ``replicas``, the data-axis replicas of a stage mesh each micro-batch is split
    over (1: none)."""

    path: str
    batch_dim: int
    num_micro_batches: int
    micro_batch_size: int = 0
    replicas: int = 1

    def check_inputs(
        self, flat: list[tf.Tensor], head_flat: list[tf.Tensor], has_head: bool, training: bool
    ) -> None:
        """ConfigError unless every input and head input has the batch dimension, head inputs come
        with a head, and (training) they have the inputs' batch size."""
        for i, t in enumerate(flat + head_flat):
            if t.shape.rank is not None and t.shape.rank <= self.batch_dim:
                what = f"input {i}" if i < len(flat) else f"head input {i - len(flat)}"
                raise ConfigError(
                    f"{self.path}: {what} has shape {t.shape}, which has no batch_dim={self.batch_dim}"
                )
        if not has_head and head_flat:
            raise ConfigError(f"{self.path}: head_inputs given without a head to use them")
        if head_flat and training and self.static_batch(head_flat) != self.static_batch(flat):
            raise ConfigError(
                f"{self.path}: the head inputs' batch size {self.static_batch(head_flat)} differs from "
                f"the inputs' {self.static_batch(flat)}"
            )

    def count_for(self, batch_size: int) -> int:
        """M for a training batch of ``batch_size`` examples (ConfigError unless M divides it)."""
        if self.micro_batch_size:
            m, rest = divmod(batch_size, self.micro_batch_size)
            if rest or m == 0:
                raise ConfigError(
                    f"{self.path}: micro_batch_size={self.micro_batch_size} does not divide the batch "
                    f"size {batch_size}; use a batch size that is a multiple of it"
                )
            return m
        m = self.num_micro_batches
        if batch_size % m:
            raise ConfigError(
                f"{self.path}: num_micro_batches={m} does not divide the batch size {batch_size}; use a "
                f"batch size that is a multiple of {m} or another num_micro_batches"
            )
        return m

    def rows_of(self, batch: Any) -> Any:
        """The rows of one micro-batch of a batch of ``batch`` rows (as an input_shape gives it):
        micro_batch_size, or the batch over M; None where the batch is unknown; anything else as
        given (the spec's own check names it)."""
        if self.micro_batch_size:
            return self.micro_batch_size
        if batch is None:
            return None
        if isinstance(batch, int) and not isinstance(batch, bool) and batch > 0:
            return batch // self.count_for(batch)
        return batch

    def split(
        self, flat: list[tf.Tensor], training: bool, m_count: int | None = None, device: str | None = None
    ) -> list[list[tf.Tensor]]:
        """Micro-batch inputs ``[m][leaf]``. Training: M equal parts of a static batch (their gradient,
        a concat, runs on ``device``). Inference: M near-equal parts of any batch, even one of unknown
        size. ``m_count`` forces M (the head inputs are split like the inputs)."""
        bd, replicas = self.batch_dim, self.replicas
        if training:
            batch = self.static_batch(flat)
            m_count = m_count or self.count_for(batch)
            if m_count == 1:
                return [list(flat)]
            self._check_replicas(batch, m_count)
            parts = [split_with_grad_on(device, t, m_count, bd, replicas) for t in flat]
            return [[p[m] for p in parts] for m in range(m_count)]
        size = flat[0].shape[bd]
        if m_count is None and not self.micro_batch_size:
            m_count = self.num_micro_batches
        elif m_count is None:
            m_count = 1 if size is None else max(1, -(-int(size) // self.micro_batch_size))
        if m_count == 1:
            return [list(flat)]
        if replicas > 1:  # the rows each replica holds, split in place
            self._check_replicas(None if size is None else int(size), m_count)
            return [list(p) for p in zip(*(micro_batches(t, m_count, bd, replicas) for t in flat))]
        total = tf.shape(flat[0])[bd] if size is None else int(size)
        sizes = [(total + m_count - 1 - m) // m_count for m in range(m_count)]
        sizes = tf.stack(sizes) if size is None else sizes
        parts = [tf.split(t, sizes, axis=bd, num=m_count) for t in flat]
        return [[p[m] for p in parts] for m in range(m_count)]

    def join(self, outputs: list[list[tf.Tensor]], device: str | None) -> list[tf.Tensor]:
        """Each output leaf's micro-batches joined along batch_dim (their gradient runs on ``device``)."""
        if len(outputs) == 1:
            return outputs[0]
        joined = []
        for i, leaf in enumerate(outputs[0]):
            if leaf.shape.rank is not None and leaf.shape.rank <= self.batch_dim:
                raise ConfigError(
                    f"{self.path}: output {i} has shape {leaf.shape}, which has no batch_dim="
                    f"{self.batch_dim} to concatenate micro-batches along"
                )
            parts = [out[i] for out in outputs]
            joined.append(concat_with_grad_on(device, parts, self.batch_dim, self.replicas))
        return joined

    def static_batch(self, flat: list[tf.Tensor]) -> int:
        """The one static batch size of ``flat`` (ConfigError if unknown or not one)."""
        sizes = set()
        for i, t in enumerate(flat):
            size = t.shape[self.batch_dim] if t.shape.rank is not None else None
            if size is None:
                raise ConfigError(
                    f"{self.path}: the batch dimension (batch_dim={self.batch_dim}) of input {i} is unknown "
                    f"when the step is traced (shape {t.shape}); GPipe needs a static batch size: batch the "
                    "input with drop_remainder=True or trace with a fully defined input_signature"
                )
            sizes.add(int(size))
        if len(sizes) > 1:
            raise ConfigError(f"{self.path}: inputs have different batch sizes {sorted(sizes)}")
        return sizes.pop()

    def _check_replicas(self, batch: int | None, m_count: int) -> None:
        """A stage mesh's data axis splits each micro-batch over its replicas: the batch must be a
        known multiple of replicas x micro-batches."""
        if self.replicas > 1 and (batch is None or batch % (self.replicas * m_count)):
            raise ConfigError(
                f"{self.path}: a batch of {batch} rows does not split into {m_count} micro-batches "
                f"(num_micro_batches) x {self.replicas} replicas (the data axis of stage_mesh_shape); "
                f"make the batch size a multiple of {self.replicas * m_count}"
            )
