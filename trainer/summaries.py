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
        self._created: tf.summary.SummaryWriter | None = None  # at the first summary: a run refused
        # before it wrote one leaves no empty event file

    def open(self) -> None:
        """Creates the directory and its event file now (the job's other files go beside them)."""
        self._writer  # noqa: B018

    @property
    def _writer(self) -> tf.summary.SummaryWriter:
        if self._created is None:
            try:
                tf.io.gfile.makedirs(self.directory)
                self._created = tf.summary.create_file_writer(self.directory)
            except (tf.errors.OpError, OSError) as e:
                raise UserError(f"cannot write summaries to {self.directory}: {files.reason(e)}") from None
        return self._created

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
        if self._created is not None:
            with self._writing():
                self._created.flush()

    def close(self) -> None:
        if self._created is not None:
            with self._writing():
                self._created.close()
