"""Peak bytes held by live tensors during one step, read from the profiler's allocator events.

``tf.config.experimental.get_memory_info('CPU:0')['peak']`` (with ``TF_CPU_ALLOCATOR_USE_BFC=true``)
counts the BFC allocator's chunks, and a chunk may be up to twice the tensor it holds (the allocator
splits a free chunk only when it is at least twice the request). Replaying the allocation and
deallocation events of a traced step with their requested sizes gives the tensors' own peak, so a
benchmark can tell a layer's memory from the allocator's rounding and fragmentation.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path

from trainer import tf_startup

# Run as a module (python -m), TensorFlow's start-up lines stay off stderr.
tf = tf_startup.import_tensorflow()


class AllocatorTrace:
    """The allocator's events from ``start`` to ``stop``, under the profiler: for a step that another
    process runs here (a stage process of a cluster), or one ``live_tensor_peak`` runs itself."""

    def __init__(self) -> None:
        self.resting = 0
        self.logdir: tempfile.TemporaryDirectory | None = None

    def start(self) -> None:
        """Notes what is in use now and starts the profiler."""
        self.resting = int(tf.config.experimental.get_memory_info("CPU:0")["current"])
        self.logdir = tempfile.TemporaryDirectory()
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
        tf.profiler.experimental.start(self.logdir.name, options=options)

    def stop(self) -> dict[str, int]:
        """Stops the profiler; returns ``{'live_peak_bytes', 'chunk_peak_bytes', 'resting_bytes'}``:
        the peak of requested bytes in use since ``start`` (resting tensors included), the
        allocator's own peak over the same time, and what was in use at ``start``."""
        if self.logdir is None:
            raise RuntimeError("AllocatorTrace.stop() without start()")
        try:
            tf.profiler.experimental.stop()
            events = _allocator_events(Path(self.logdir.name))
        finally:
            self.logdir.cleanup()
            self.logdir = None
        live: dict[int, int] = {}
        current = peak = chunk_peak = 0
        for _, kind, stats in events:
            chunk_peak = max(chunk_peak, stats.get("bytes_allocated", 0))
            address = stats.get("addr")
            if kind == "MemoryAllocation":
                live[address] = stats.get("requested_bytes", 0)
                current += live[address]
                peak = max(peak, current)
            elif address in live:
                current -= live.pop(address)
        return {
            "live_peak_bytes": self.resting + peak,
            "chunk_peak_bytes": chunk_peak,
            "resting_bytes": self.resting,
        }


def live_tensor_peak(run_step: Callable[[], object]) -> dict[str, int]:
    """Runs ``run_step`` once under the profiler; returns ``AllocatorTrace.stop``'s figures. Meant for
    a CPU-only process, whose one allocator (the logical CPU devices share it) all the events come
    from."""
    trace = AllocatorTrace()
    trace.start()
    try:
        run_step()
    except BaseException:
        with contextlib.suppress(Exception):  # the step's own error is the one to see
            trace.stop()
        raise
    return trace.stop()


def _allocator_events(logdir: Path) -> list[tuple[int, str, dict]]:
    """The allocation and deallocation events of the profiles under ``logdir``, in time order."""
    from layers import tf_compat

    planes = [
        plane
        for path in logdir.rglob("*.xplane.pb")
        for plane in tf_compat.xspace_from_bytes(path.read_bytes()).planes
    ]
    events = []
    for plane in planes:
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        stat_names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                kind = names.get(event.metadata_id)
                if kind not in ("MemoryAllocation", "MemoryDeallocation"):
                    continue
                stats = {stat_names.get(s.metadata_id): s.int64_value or s.uint64_value for s in event.stats}
                events.append((line.timestamp_ns * 1000 + event.offset_ps, kind, stats))
    if not events:
        raise RuntimeError(
            "the profiler recorded no allocator events (is TF_CPU_ALLOCATOR_USE_BFC=true set?)"
        )
    events.sort(key=lambda e: e[0])
    return events
