"""Where a step's stdout and stderr go: into the instance's compute log files, which the UI shows, and on to the
process's own streams as before.

Dagster's LocalComputeLogManager mirrors each captured stream back by starting `tail -F` on its file and a Python
process that watches for the tail being orphaned: four processes for every run (stdout and stderr), one of them a
new interpreter each, and their start and end are part of every run's cost. Here the file is redirected to exactly
as Dagster does it, and a thread of the run's own process copies what lands in it to the stream's former target,
so a run starts no process for its logs. A thread needs no orphan watch: it ends with its process.

Everything else (where the files are, how the UI reads and follows them) is LocalComputeLogManager's."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from typing import Any

from dagster import Field, Float, StringSource
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster._utils import ensure_file, touch_file

# how often the copying thread looks for new output while a step runs (`tail -F` looks once a second)
POLL_S = 0.1
READ_BYTES = 1 << 16
# how long the end of a step waits for the thread to copy what is left before going on without it
FINISH_TIMEOUT_S = 5.0


class ThreadMirroredComputeLogManager(LocalComputeLogManager):
    """LocalComputeLogManager mirroring captured output with a thread instead of tail processes. Its files are under
    `<instance folder>/storage`, where Dagster keeps compute logs by default: the folder the instance that registers
    it stores its local artifacts in (DAGSTER_HOME for `DagsterInstance.get()`), or `instance_dir` when given."""

    def __init__(
        self,
        instance_dir: str | None = None,
        polling_timeout: float | None = None,
        inst_data: ConfigurableClassData | None = None,
    ):
        super().__init__(_storage(instance_dir) if instance_dir else "", polling_timeout, inst_data)

    def register_instance(self, instance) -> None:
        super().register_instance(instance)
        if not self._base_dir:
            self._base_dir = _storage(instance.root_directory)

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            "instance_dir": Field(StringSource, is_required=False),
            "polling_timeout": Field(Float, is_required=False),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: dict[str, Any]
    ) -> ThreadMirroredComputeLogManager:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Generator[CapturedLogContext, None, None]:
        outpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        errpath = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with mirrored_to_file(sys.stdout, outpath), mirrored_to_file(sys.stderr, errpath):
            yield CapturedLogContext(log_key)
        # the artifact that tells readers the capture is complete, as LocalComputeLogManager leaves it
        touch_file(self.complete_artifact_path(log_key))


def _storage(instance_dir: str) -> str:
    return os.path.join(instance_dir, "storage")


@contextmanager
def mirrored_to_file(stream, path: str) -> Generator[None, None, None]:
    """Redirect `stream` (its file descriptor, so child processes' output too) into `path` for the block, while a
    thread copies what the file receives to where the stream pointed before. A stream without a descriptor (a test
    runner's capture) is redirected as Dagster does it, and not mirrored."""
    ensure_file(path)
    target = _duplicate(stream)
    if target is None:
        with redirect_to_file(stream, path):
            yield
        return
    tail = _FileTail(path, target)
    tail.start()
    try:
        with redirect_to_file(stream, path):
            yield
    finally:
        tail.finish()


def _duplicate(stream) -> int | None:
    try:
        stream.flush()
        return os.dup(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None


class _FileTail(threading.Thread):
    """Copies `path` from its start to the descriptor `target` (closed at the end) until finished, then what is
    left. A target that stops taking output (a closed terminal) ends the copying, never the step."""

    def __init__(self, path: str, target: int):
        super().__init__(name="docqueue-compute-log-tail", daemon=True)
        self.path, self.target = path, target
        self._finished = threading.Event()

    def run(self) -> None:
        try:
            with open(self.path, "rb") as source:
                while not self._finished.is_set():
                    if not self._copy(source):
                        self._finished.wait(POLL_S)
                while self._copy(source):
                    pass
        except OSError:
            pass  # the terminal or the file went away: the file keeps what the step wrote
        finally:
            os.close(self.target)

    def _copy(self, source) -> bool:
        chunk = source.read(READ_BYTES)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.target, view) :]
        return bool(chunk)

    def finish(self) -> None:
        self._finished.set()
        self.join(FINISH_TIMEOUT_S)
