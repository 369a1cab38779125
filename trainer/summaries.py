"""TensorBoard event files under ``logdir/{train,eval_<ds>,decoder_<ds>}``.

Scalars are written eagerly, at summary intervals only, from values the job already fetched; so a
summary costs nothing on steps that write none. TF2 stores scalars as tensors; TensorBoard's reader
(``EventAccumulator(..., size_guidance={'tensors': 0})``) reads them back with ``Tensors(tag)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import tensorflow as tf

from params.errors import UserError
from trainer import files


class SummaryWriter:
    """One event-file directory (created on first use)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        try:
            tf.io.gfile.makedirs(directory)
            self._writer = tf.summary.create_file_writer(directory)
        except (tf.errors.OpError, OSError) as e:
            raise UserError(f"cannot write summaries to {directory}: {files.reason(e)}") from None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A failed write (a full disk) is one UserError line, not a traceback."""
        try:
            yield
        except (tf.errors.OpError, OSError) as e:
            raise UserError(f"cannot write summaries to {self.directory}: {files.reason(e)}") from None

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        with self._writing(), self._writer.as_default(step=int(step)):
            for name, value in sorted(values.items()):
                tf.summary.scalar(name, float(value))

    def text(self, step: int, name: str, text: str) -> None:
        """A text summary, shown as preformatted text (each line indented: markdown code)."""
        body = "".join(f"    {line}\n" for line in text.splitlines())
        with self._writing(), self._writer.as_default(step=int(step)):
            tf.summary.text(name, body)

    def flush(self) -> None:
        with self._writing():
            self._writer.flush()

    def close(self) -> None:
        with self._writing():
            self._writer.close()
