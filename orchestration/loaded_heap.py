"""What a long-lived docqueue process does once its code is loaded and before its work begins.

Importing Dagster, building the definitions and the repository make some hundreds of thousands of objects that
live as long as the process. Python's collector walks every one of them at each full collection, again and again,
and finds nothing to free. Frozen (gc.freeze), they sit in a permanent generation the collector leaves alone: the
collections a process's runs trigger walk only what the runs make, and a template process that forks runs never
has its collector write to the pages its children share with it."""

from __future__ import annotations

import gc


def freeze_loaded() -> None:
    """Freeze everything this process has made so far; what it makes afterwards is collected as usual."""
    gc.freeze()
