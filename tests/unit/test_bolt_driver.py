"""The Bolt driver loads without pandas (resources/bolt_driver.py), and only the driver is refused it: the code a
`docqueue run` and the Dagster code location load leave pandas unloaded, and pandas still imports afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from resources import bolt_driver

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import {module}
before = {{name: name in sys.modules for name in ("neo4j", "pandas")}}
import pandas
frame = pandas.DataFrame([{{"pages": 1}}])
print(json.dumps({{"before": before, "rows": len(frame)}}))
"""


@pytest.mark.parametrize("module", ["orchestration.cli.running", "orchestration.definitions", "orchestration.repair"])
def test_the_code_that_talks_to_the_graph_loads_the_driver_without_pandas(module, tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "DOCQUEUE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        cwd=REPO_ROOT,
        timeout=180,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["before"] == {"neo4j": True, "pandas": False}
    assert found["rows"] == 1


def test_only_the_drivers_own_optional_import_is_refused():
    refusal = bolt_driver._DataFramesRefusedToTheDriver()
    asked = {}
    for asker in ("neo4j._optional_deps", "an_application"):
        scope = {"__name__": asker, "refusal": refusal, "asked": asked}
        exec(
            "try:\n"
            "    asked[__name__] = refusal.find_spec('pandas.core', None)\n"
            "except ModuleNotFoundError as refused:\n"
            "    asked[__name__] = refused.name\n",
            scope,
        )
    assert asked == {"neo4j._optional_deps": "pandas.core", "an_application": None}
    assert refusal not in sys.meta_path
    assert bolt_driver.neo4j.exceptions.DriverError.__module__ == "neo4j.exceptions"
