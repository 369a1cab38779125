"""Small file helpers over ``tf.io.gfile``, so a logdir can live on any file system TensorFlow knows.

Files other jobs read (params.txt, score records, decoder output) are written whole to a temporary
name and renamed into place, so a reader never sees half a file and a killed writer leaves the old
version intact.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any

import numpy as np
import tensorflow as tf

from params.errors import UserError


def join(*parts: str) -> str:
    return os.path.join(*parts)


def write_text_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename."""
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"
    try:
        with tf.io.gfile.GFile(tmp, "w") as f:
            f.write(text)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except (tf.errors.OpError, OSError) as e:
        raise UserError(f"cannot write {path}: {reason(e)}") from None


def read_text(path: str) -> str | None:
    """The file's text, or None when it does not exist."""
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            return f.read()
    except tf.errors.NotFoundError:
        return None
    except (tf.errors.OpError, OSError) as e:
        raise UserError(f"cannot read {path}: {reason(e)}") from None


def to_json(record: Any) -> str:
    """One JSON line; NumPy scalars and arrays become numbers and lists, bytes become text."""
    return json.dumps(record, default=_json_default, sort_keys=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_jsonl(path: str) -> list[dict]:
    """The records of a JSON-lines file ([] when it does not exist)."""
    text = read_text(path)
    if text is None:
        return []
    records = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise UserError(f"{path}: line {line_no} is not JSON; fix or delete the file") from None
    return records


def write_jsonl_atomic(path: str, records: list[Any]) -> None:
    write_text_atomic(path, "".join(to_json(r) + "\n" for r in records))


def reason(error: Exception) -> str:
    """The first line of an error message, for one-line user errors."""
    message = error.message if isinstance(error, tf.errors.OpError) else str(error)
    message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", message.strip())  # TensorFlow's op prefix
    return message.splitlines()[0] if message else type(error).__name__
