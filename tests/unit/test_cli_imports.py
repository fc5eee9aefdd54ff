"""The light commands load only what they need: `docqueue --help`, `status`, `stats`, `ingest` and `search` (on the
embedded store) never import Dagster, the graph driver, qdrant-client, pandas or pdfium, which cost start-up time,
nor SQLAlchemy (they reach the queue through queue_db.direct_engine), nor pydantic-settings (the settings are plain
pydantic models) or the preparation of Dagster's storage and home; `ingest` writes files without the stores' ports.
Checked in a fresh interpreter, on the modules each command's code loads (its module, and its help resolved through
the group, which builds the settings); tests/integration/test_direct_engine.py runs the commands themselves."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import probe as python_probe

HEAVY = ("dagster", "neo4j", "qdrant_client", "pandas", "spacy", "fitz", "pypdfium2", "pydantic_settings", "sqlalchemy")
# modules of the project a light command has no use for: Dagster's storage URL, DAGSTER_HOME and its dagster.yaml
# (the commands that run Dagster prepare them), and for `ingest` the stores' ports
NEEDLESS = {
    "": ("orchestration.environment", "orchestration.dagster_database", "yaml"),
    "ingest": ("resources.ports", "processing.entities"),
}
PROBE = """
import json, sys
from click.testing import CliRunner
from orchestration.cli import main
args = json.loads(sys.argv[1])
result = CliRunner().invoke(main, args)
assert result.exit_code == 0, result.output
if args[0] == "search":
    import resources.search_session  # noqa: F401  (what `search` opens once its arguments are checked)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["status", "--help"], ["stats", "--help"], ["search", "--help"], ["ingest", "--help"]],
    ids=lambda args: " ".join(args),
)
def test_a_light_command_imports_no_heavy_library(args, tmp_path):
    probe = python_probe(PROBE, json.dumps(args), env={"DOCQUEUE_HOME": str(tmp_path)})
    assert probe.returncode == 0, probe.stderr
    modules = set(json.loads(probe.stdout.strip().splitlines()[-1]))
    loaded = {name.split(".")[0] for name in modules}
    assert not loaded & set(HEAVY), f"docqueue {' '.join(args)} imports {sorted(loaded & set(HEAVY))}"
    needless = modules & {name for command in ("", args[0]) for name in NEEDLESS.get(command, ())}
    assert not needless, f"docqueue {' '.join(args)} imports {sorted(needless)}"
