"""``runner run --sandbox``: its help and the README's runner section say the same."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from looprelay.agent.sandbox import SANDBOX_MODES
from looprelay.cli.root import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def test_help_and_readme_name_every_mode_and_the_default() -> None:
    shown = CliRunner().invoke(cli, ["runner", "run", "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert f"--sandbox [{'|'.join(SANDBOX_MODES)}]" in shown.output
    assert "[default: untrusted]" in " ".join(shown.output.split())
    readme = " ".join(README.read_text(encoding="utf-8").split())
    for mode in SANDBOX_MODES:
        assert f"`--sandbox {mode}`" in readme
    assert "`--sandbox untrusted` (the default)" in readme
    assert "`sandbox-unavailable`" in readme
