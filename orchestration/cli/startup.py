"""The cyclic garbage collector paused while a `docqueue` process starts, and the process ended without the
interpreter's teardown.

The start-up makes a few hundred thousand objects that live as long as the process: the modules, pydantic's
validators, SQLAlchemy's tables and, for `search`, the model's and the Bolt driver's. The collector would walk them
again and again while they are made (about a tenth of a light command's CPU time) and find nothing to free. So it
is paused until the command's own work begins; then what exists is frozen (gc.freeze: never walked again) and the
collector runs as before, so long commands (`run`, `worker`, `ui`) collect as they always did.

Over the same stretch pydantic is told to look for no plugins (PYDANTIC_DISABLE_PLUGINS, unless the user set it):
docqueue uses none, and looking reads the metadata of every installed distribution (some 240 here, about 12 ms) the
first time a model class is built, which the settings' classes are. The variable is removed again when the command
begins, so the models its work builds (Dagster's), and the processes it starts, look as pydantic always does.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

_command_line = False  # this process was started as `docqueue ...` (its entry point says so)
_paused = False  # paused here, by this process's start-up (not by anyone else)
PLUGINS_VARIABLE = "PYDANTIC_DISABLE_PLUGINS"
_plugins_skipped = False  # the variable was set here (not by the user)


@contextmanager
def collector_paused(command_line: bool | None = None) -> Iterator[None]:
    """Pause the collector until `started()` or the end of the block, in a process started as a command line
    only: a caller that invokes the commands in its own process (tests, an application) keeps its collector as it
    is. `command_line`: whether this process is one, from its entry point; None keeps what that said."""
    global _command_line, _paused, _plugins_skipped
    if command_line is not None:
        _command_line = command_line
    paused = _command_line and not _paused and gc.isenabled()
    if paused:
        gc.disable()
        _paused = True
        if PLUGINS_VARIABLE not in os.environ:
            os.environ[PLUGINS_VARIABLE] = "__all__"
            _plugins_skipped = True
    try:
        yield
    finally:
        if paused:
            started()  # `--help`, `--version` and a usage error end before the command's work begins


def started() -> None:
    """The start-up is over: freeze what it made, let the collector run again and pydantic look for plugins."""
    global _paused, _plugins_skipped
    if not _paused:
        return
    if _plugins_skipped:
        os.environ.pop(PLUGINS_VARIABLE, None)
        _plugins_skipped = False
    gc.freeze()
    _paused = False
    gc.enable()


def ends_with_command() -> bool:
    """Whether this process ends when its command returns (started as `docqueue ...`, ended by exit_at_once), not
    a caller's that invokes the command and goes on (a test, an application)."""
    return _command_line


def exit_at_once(code: object) -> NoReturn:
    """End a process started as `docqueue ...` with `code` (SystemExit's: None, a number, or a message for stderr)
    as the interpreter would, less its teardown: that frees every object of every module one by one (0.45 s after
    `run`, whose parent imported Dagster and the stores' drivers), where the system frees the whole process at
    once. What the interpreter does before its teardown is done here too: the threads that are not daemons are
    waited for, the exit handlers run (weakref finalizers: PDF workers stopped; folder locks released; logging
    flushed), and the standard streams are flushed."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status & 0xFF)
