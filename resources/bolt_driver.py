"""The Bolt driver (`neo4j`), loaded without the data-frame libraries it would load with it.

When pandas or pyarrow is installed, `import neo4j` imports them too, for its data-frame and Arrow conversions
(`Result.to_df()` and the like), which docqueue never asks for. pandas is installed (the read models' DataFrame forms,
for notebooks), and loading it is a noticeable part of the start-up of every process that talks to the graph: `docqueue
run` before it forks its workers, a search that shows entities, the Dagster code location. Every module of the project
takes the driver from here (an import-linter contract in pyproject.toml holds the rule); only the driver's own
optional import of those libraries is refused, so pandas stays importable for everything else in the process, an
application's own code included."""

from __future__ import annotations

import importlib.abc
import sys

# the driver's module that imports the data-frame libraries when it can (and carries on without them)
_DRIVER_OPTIONAL_DEPENDENCIES = "neo4j._optional_deps"
_DATA_FRAMES = ("pandas", "pyarrow")


class _DataFramesRefusedToTheDriver(importlib.abc.MetaPathFinder):
    """Refuses pandas and pyarrow to the driver's optional import only: another importer, another thread's
    included, finds them as usual."""

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] in _DATA_FRAMES and _asked_by_the_driver():
            raise ModuleNotFoundError(f"No module named {fullname!r} (not loaded for the Bolt driver)", name=fullname)
        return None


def _asked_by_the_driver() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__") == _DRIVER_OPTIONAL_DEPENDENCIES:
            return True
        frame = frame.f_back
    return False


# at module level, so that `neo4j` here is the driver's module to type checkers too
_refusal = _DataFramesRefusedToTheDriver()
sys.meta_path.insert(0, _refusal)
try:
    import neo4j  # noqa: E402
    import neo4j.exceptions  # noqa: E402
finally:
    sys.meta_path.remove(_refusal)

__all__ = ["neo4j"]
