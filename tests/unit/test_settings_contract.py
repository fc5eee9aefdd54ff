"""Settings are built at the entry points and handed down, never looked up from below.

No module under queue_db/, processing/ or resources/ reads the process environment (`os.environ`, `os.getenv`),
calls the `settings(Group)` look-up or builds `Settings.from_env()`; in orchestration/ only the entry points do: the
CLI (with `docqueue worker`, the Celery worker's entry), the Dagster code location (definitions.py), the storages
Dagster itself builds from dagster.yaml in its own processes (webserver, daemon, run workers) and the settings
module itself. Found with `ast`, so a mention in a comment or docstring is not a
read, and a read inside a function is one.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("queue_db", "processing", "resources", "orchestration")
ENTRY_POINTS = (
    "orchestration/definitions.py",
    "orchestration/cli/",
    "orchestration/settings.py",
    "orchestration/dagster_pooled_storage.py",
)

# Modules that still read the environment or look settings up, each with the reason. A module leaves this list when
# it is fixed (the test fails while a listed module no longer reads, so the list never goes stale), and nothing
# new may join it.
KNOWN_OFFENDERS: dict[str, set[str]] = {
    # the settings themselves: Settings.from_env() reads the environment for the entry points
    "queue_db/config.py": {"os.environ", "settings()"},
    # the conversion subprocess sets its own OCR threads in its own environment, from values its parent passes
    "resources/_pdf_worker.py": {"os.environ"},
    # a document's password reference `env:NAME` names a variable by design: the secret stays out of the queue
    "orchestration/page_reading.py": {"os.environ"},
    # writes (never reads) the variables the Dagster processes it starts inherit: DAGSTER_HOME, the storage URL
    "orchestration/environment.py": {"os.environ"},
}


def environment_reads(tree: ast.AST) -> set[str]:
    """What a module's code does of the forbidden: "os.environ" (os.environ, os.getenv, getenv, environ imported
    from os), "settings()" (a call of a name or attribute `settings`) and "Settings.from_env()"."""
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "getenv", "environb", "putenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.add("os.environ")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and any(alias.name in ("environ", "getenv", "environb") for alias in node.names)
        ):
            found.add("os.environ")
        elif isinstance(node, ast.Call):
            function = node.func
            name = (
                function.id
                if isinstance(function, ast.Name)
                else function.attr
                if isinstance(function, ast.Attribute)
                else None
            )
            if name == "settings":
                found.add("settings()")
            elif (
                name == "from_env"
                and isinstance(function, ast.Attribute)
                and isinstance(function.value, ast.Name)
                and function.value.id == "Settings"
            ):
                found.add("Settings.from_env()")
    return found


def offenders() -> dict[str, set[str]]:
    result = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in ENTRY_POINTS):
                continue
            reads = environment_reads(ast.parse(path.read_text(encoding="utf-8"), relative))
            if reads:
                result[relative] = reads
    return result


def test_below_the_entry_points_nothing_reads_the_environment():
    new = {path: sorted(reads - KNOWN_OFFENDERS.get(path, set())) for path, reads in offenders().items()}
    new = {path: reads for path, reads in new.items() if reads}
    assert not new, (
        "read the environment below the entry points (take the value as a parameter, built by the "
        f"entry point from Settings): {new}"
    )


def test_known_offenders_still_offend():
    """A fixed module leaves KNOWN_OFFENDERS, so the list only shrinks and ends empty."""
    found = offenders()
    stale = {path: sorted(reads - found.get(path, set())) for path, reads in KNOWN_OFFENDERS.items()}
    stale = {path: reads for path, reads in stale.items() if reads}
    assert not stale, f"no longer read the environment this way, remove them from KNOWN_OFFENDERS: {stale}"


def test_the_scan_finds_each_kind_of_read():
    source = (
        "import os\nfrom os import getenv\ndef f():\n    a = os.environ.get('X')\n"
        "    return settings(G), Settings.from_env()\n'''os.environ in a docstring is no read'''\n"
    )
    assert environment_reads(ast.parse(source)) == {"os.environ", "settings()", "Settings.from_env()"}
    assert environment_reads(ast.parse("'''settings(G) and os.environ, only mentioned'''\n")) == set()
