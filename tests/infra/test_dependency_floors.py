"""Security floors of the runtime dependencies (issue 13): releases with known holes can never
be resolved, in the package or in the Cloud Functions' requirements."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
FLOORS = [
    # Sandbox escape through the |attr filter (CVE-2025-27516, GHSA-cpwx-vrp4-4pq7).
    ("jinja2", "3.1.5", "3.1.6"),
    # .netrc credentials leaked to third parties on crafted URLs (CVE-2024-47081).
    ("requests", "2.32.3", "2.32.4"),
]


def _requirements(lines: list[str]) -> dict[str, Requirement]:
    parsed = (Requirement(line) for line in lines if line.strip() and not line.startswith("#"))
    return {requirement.name.lower(): requirement for requirement in parsed}


def _sources() -> dict[str, dict[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    functions = (ROOT / "functions/requirements.txt").read_text().splitlines()
    return {
        "pyproject.toml": _requirements(project["dependencies"]),
        "functions/requirements.txt": _requirements(functions),
    }


@pytest.mark.parametrize(("name", "vulnerable", "fixed"), FLOORS)
@pytest.mark.parametrize("source", ["pyproject.toml", "functions/requirements.txt"])
def test_no_vulnerable_release_is_allowed(
    source: str, name: str, vulnerable: str, fixed: str
) -> None:
    specifier = _sources()[source][name].specifier
    assert not specifier.contains(vulnerable), f"{source} still allows {name} {vulnerable}"
    assert specifier.contains(fixed)


@pytest.mark.parametrize(("name", "vulnerable", "fixed"), FLOORS)
def test_the_installed_release_is_at_or_above_the_floor(
    name: str, vulnerable: str, fixed: str
) -> None:
    assert Version(version(name)) >= Version(fixed)
