"""No test module imports a session- or module-scoped fixture: pytest takes an imported fixture for a definition of
the importing module, so a session-scoped one (the Bolt server, the embedded PostgreSQL) would be built again for
that module and kept until the session ends. Fixtures reach tests through conftest.py and its pytest_plugins."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _imported_fixtures(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("tests"):
            continue
        module = importlib.import_module(node.module)
        for alias in node.names:
            marker = getattr(getattr(module, alias.name, None), "_fixture_function_marker", None)
            if marker is not None and marker.scope in ("session", "package", "module"):
                found.append(f"{path.name}: {alias.name} from {node.module}")
    return found


def test_no_test_module_imports_a_long_lived_fixture():
    found = [f for path in sorted(TESTS.rglob("*.py")) for f in _imported_fixtures(path)]
    assert not found, found


def test_the_check_sees_an_imported_fixture(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text("from tests.integration.bolt_fixture import bolt_server, free_port\n")
    assert _imported_fixtures(module) == ["test_example.py: bolt_server from tests.integration.bolt_fixture"]
