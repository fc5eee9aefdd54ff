"""The cyclic garbage collector paused while a `docqueue` process starts.

The start-up makes a few hundred thousand objects that live as long as the process: the modules, pydantic's
validators, SQLAlchemy's tables and, for `search`, the model's and the Bolt driver's. The collector would walk them
again and again while they are made (about a tenth of a light command's CPU time) and find nothing to free. So it
is paused until the command's own work begins; then what exists is frozen (gc.freeze: never walked again) and the
collector runs as before, so long commands (`run`, `worker`, `ui`) collect as they always did.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_command_line = False  # this process was started as `docqueue ...` (its entry point says so)
_paused = False  # paused here, by this process's start-up (not by anyone else)


@contextmanager
def collector_paused(command_line: bool | None = None) -> Iterator[None]:
    """Pause the collector until `started()` or the end of the block, in a process started as a command line
    only: a caller that invokes the commands in its own process (tests, an application) keeps its collector as it
    is. `command_line`: whether this process is one, from its entry point; None keeps what that said."""
    global _command_line, _paused
    if command_line is not None:
        _command_line = command_line
    paused = _command_line and not _paused and gc.isenabled()
    if paused:
        gc.disable()
        _paused = True
    try:
        yield
    finally:
        if paused:
            started()  # `--help`, `--version` and a usage error end before the command's work begins


def started() -> None:
    """The start-up is over: freeze what it made, and let the collector run again."""
    global _paused
    if not _paused:
        return
    gc.freeze()
    _paused = False
    gc.enable()
