"""infra/ checked by the terraform binary itself, where one is installed.

``terraform fmt -check`` needs nothing but the binary, so it runs wherever terraform is on
``PATH`` (the machine image has one; Debian ships no package, so ``./dev`` cannot install it)
and skips, saying so, where it is not. ``terraform validate`` also needs the google provider,
which ``terraform init`` downloads from the Terraform registry: where the registry cannot be
reached and no provider is cached (``TF_PLUGIN_CACHE_DIR`` or a CLI-config mirror), it skips,
naming the reason terraform gave. It never writes into the repository: it works on a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
# terraform's own words when it cannot fetch a provider (registry unreachable, no mirror).
_UNREACHABLE = (
    "Failed to query available provider packages",
    "could not connect to registry",
    "Failed to install provider",
)
_TIMEOUT_SECONDS = 300


def _terraform() -> str:
    found = shutil.which("terraform")
    if found is None:
        pytest.skip("terraform is not on PATH (Debian has no package for it; see docs/deploy.md)")
    return found


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # No update check and no colours: the output is read, and nothing but the registry is asked.
    env = {**os.environ, "CHECKPOINT_DISABLE": "1", "TF_IN_AUTOMATION": "1"}
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_SECONDS,
        check=False,
    )


def test_every_terraform_file_is_in_canonical_format() -> None:
    run = _run(
        _terraform(), "fmt", "-check", "-recursive", "-diff", "-no-color", str(INFRA), cwd=ROOT
    )
    assert run.returncode == 0, (
        f"terraform fmt -check failed (run `terraform fmt -recursive infra`):\n{run.stdout}"
        f"{run.stderr}"
    )


def test_the_configuration_validates(tmp_path: Path) -> None:
    terraform = _terraform()
    work = tmp_path / "infra"
    shutil.copytree(INFRA, work, ignore=shutil.ignore_patterns(".terraform", "*.tfstate*"))
    try:
        init = _run(terraform, "init", "-backend=false", "-input=false", "-no-color", cwd=work)
    except subprocess.TimeoutExpired:
        pytest.skip(f"terraform init did not finish in {_TIMEOUT_SECONDS} s (no registry here?)")
    if init.returncode != 0:
        output = init.stdout + init.stderr
        reason = next((line.strip() for line in output.splitlines() if "Error:" in line), "")
        if any(words in output for words in _UNREACHABLE):
            pytest.skip(f"the google provider cannot be installed here: {reason or output[-300:]}")
        pytest.fail(f"terraform init failed:\n{output}", pytrace=False)
    run = _run(terraform, "validate", "-json", "-no-color", cwd=work)
    report = json.loads(run.stdout)
    problems = [
        f"{d['severity']}: {d['summary']} {d.get('detail', '')} in {d.get('range', {})}"
        for d in report.get("diagnostics", [])
    ]
    assert report["valid"], "terraform validate:\n" + "\n".join(problems)
