"""Reproducible installs: constraints.txt pins every dependency pyproject.toml names (extras included) to a version
its range admits, and the model wheels install only with their pinned hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        names += extra
    return [Requirement(r) for r in names]


def test_constraints_pin_every_dependency_within_its_range():
    pins = _pins()
    unpinned, outside = [], []
    for requirement in _requirements():
        version = pins.get(canonicalize_name(requirement.name))
        if version is None:
            unpinned.append(requirement.name)
        elif not requirement.specifier.contains(version, prereleases=True):
            outside.append(f"{requirement.name}=={version} (pyproject: {requirement.specifier})")
    assert not unpinned and not outside, (
        f"constraints.txt is stale: unpinned {unpinned}, outside their range {outside}; run scripts/lock.sh"
    )


def test_model_wheels_are_pinned_by_hash_to_the_constrained_versions():
    pins = _pins()
    lines = [
        line
        for line in (REPO / "requirements" / "models.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert len(lines) == 2
    for line in lines:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line.strip())
        assert match, line
        name, version = canonicalize_name(match[1]), match[2]
        assert pins.get(name) == version, f"{name}: models.txt {version}, constraints.txt {pins.get(name)}"
        assert any(canonicalize_name(r.name) == name and r.specifier.contains(version) for r in _requirements())
