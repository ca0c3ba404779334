"""What `./dev up` installs (``pip install -e .``): looprelay and what running it needs, built
without a screen of setuptools warnings; the test tools only come with the ``test`` extra."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_TOOLS = ("pytest", "mypy", "ruff", "selenium", "hypothesis")


def test_the_package_builds_quietly_and_running_needs_no_test_tool(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert "Warning" not in built.stderr and "deprecated" not in built.stderr, built.stderr
    [wheel] = tmp_path.glob("looprelay-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    requires = metadata.get_all("Requires-Dist") or []
    for tool in TEST_TOOLS:
        needed = [r for r in requires if r.lower().startswith(tool)]
        assert needed, f"{tool} is not in the test extra"
        assert all('extra == "test"' in r for r in needed), needed
    assert metadata["License-Expression"] == "MIT"
