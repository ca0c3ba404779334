"""Codex's folder trust: a table appended to its TOML config, every other byte kept, and a file
it cannot safely add to left untouched with a clear error."""

from __future__ import annotations

import stat
import tomllib
from pathlib import Path

import pytest

from looprelay.agent import harnesses
from looprelay.agent.harnesses.codex import trust_project
from looprelay.errors import RunnerError

OPERATORS = """# my provider
model = "o3"   # kept as written

[model_providers.mine]
base_url = "http://127.0.0.1:1/v1"
"""


def _trust_level(config: Path, folder: Path) -> object:
    projects = tomllib.loads(config.read_text(encoding="utf-8"))["projects"]
    return projects[str(folder)]["trust_level"]


class TestTrustProject:
    def test_the_folder_is_trusted_and_the_operators_text_is_kept(self, tmp_path: Path) -> None:
        config, tree = tmp_path / "config.toml", tmp_path / "ws" / "a.b" / 'quote"d'
        config.write_text(OPERATORS, encoding="utf-8")
        assert trust_project(config, str(tree)) == [f"projects[{tree}].trust_level"]
        text = config.read_text(encoding="utf-8")
        assert text.startswith(OPERATORS), "the operator's comments and layout stay"
        assert _trust_level(config, tree) == "trusted"
        assert tomllib.loads(text)["model_providers"]["mine"]["base_url"].endswith("/v1")

    def test_a_trusted_folder_writes_nothing(self, tmp_path: Path) -> None:
        config = tmp_path / "config.toml"
        trust_project(config, "/ws/one")
        before = config.stat().st_mtime_ns, config.read_bytes()
        assert trust_project(config, "/ws/one") == []
        assert (config.stat().st_mtime_ns, config.read_bytes()) == before

    def test_a_missing_file_is_made_private(self, tmp_path: Path) -> None:
        config = tmp_path / "codex-home" / "config.toml"
        trust_project(config, "/ws/one")
        trust_project(config, "/ws/two")
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert _trust_level(config, Path("/ws/one")) == _trust_level(config, Path("/ws/two"))

    def test_a_file_without_a_final_newline_gets_a_valid_table(self, tmp_path: Path) -> None:
        config = tmp_path / "config.toml"
        config.write_text('model = "o3"', encoding="utf-8")
        trust_project(config, "/ws/one")
        assert _trust_level(config, Path("/ws/one")) == "trusted"

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ('[projects."/ws/one"]\ntrust_level = "untrusted"\n', "is set and not trusted"),
            ('projects = { "/ws/two" = { trust_level = "trusted" } }\n', "not TOML looprelay"),
            ('projects = "all"\n', "projects are not a table"),
            ("model = \n", "not TOML looprelay"),
        ],
    )
    def test_what_it_cannot_safely_add_to_is_left_untouched(
        self, tmp_path: Path, text: str, message: str
    ) -> None:
        config = tmp_path / "config.toml"
        config.write_text(text, encoding="utf-8")
        with pytest.raises(RunnerError, match=message) as caught:
            trust_project(config, "/ws/one")
        assert caught.value.reason == "trust-failed"
        assert config.read_text(encoding="utf-8") == text
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "config.toml",
            "config.toml.looprelay-lock",
        ]


class TestPrepare:
    def test_a_hosted_session_trusts_its_tree_under_codex_home(self, tmp_path: Path) -> None:
        tree, home = tmp_path / "tree", tmp_path / "codex-home"
        tree.mkdir()
        environ = {"CODEX_HOME": str(home), "HOME": str(tmp_path / "home")}
        codex = harnesses.get("codex")
        changed = codex.prepare(tree, harness_args=(), environ=environ, trust=True, trusted=False)
        assert changed and _trust_level(home / "config.toml", tree.resolve()) == "trusted"
        assert codex.home_config(environ) == [home]
        assert not (tmp_path / "home").exists()

    def test_a_headless_turn_touches_no_config(self, tmp_path: Path) -> None:
        environ = {"HOME": str(tmp_path)}
        codex = harnesses.get("codex")
        changed = codex.prepare(
            tmp_path, harness_args=(), environ=environ, trust=False, trusted=True
        )
        assert changed == []
        assert not (tmp_path / ".codex").exists()
        assert codex.home_config(environ) == [tmp_path / ".codex"]
