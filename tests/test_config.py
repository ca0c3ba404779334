"""The config file: validation, overrides, and the generated schema and reference."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from looprelay.config.docs import config_docs, config_schema_text, documented_keys
from looprelay.config.model import Config, load_config
from looprelay.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "looprelay.yaml"
    path.write_text(text, encoding="utf-8")
    return path


class TestLoadConfig:
    def test_no_file_means_the_defaults(self) -> None:
        config = load_config(None, environ={})
        assert config == Config()
        assert config.server.host == "127.0.0.1"
        assert config.store.backend == "sqlite"

    def test_keys_are_written_in_camel_case(self, tmp_path: Path) -> None:
        path = _write(
            tmp_path,
            "github:\n  webhookSecrets: [PRIMARY, PREVIOUS]\n"
            "queue:\n  retry:\n    maxAttempts: 3\n",
        )
        config = load_config(path, environ={})
        assert config.github.webhook_secrets == ["PRIMARY", "PREVIOUS"]
        assert config.queue.retry.max_attempts == 3

    def test_an_unknown_key_is_an_error_naming_the_key_and_the_file(self, tmp_path: Path) -> None:
        path = _write(tmp_path, "store:\n  backnd: firestore\n")
        with pytest.raises(ConfigError) as caught:
            load_config(path, environ={})
        assert str(path) in str(caught.value)
        assert "store.backnd: unknown key" in str(caught.value)

    def test_a_snake_case_key_is_refused_naming_its_camel_case_spelling(
        self, tmp_path: Path
    ) -> None:
        path = _write(tmp_path, "routing:\n  authorized_users: [octocat]\n")
        with pytest.raises(ConfigError) as caught:
            load_config(path, environ={})
        assert "routing.authorized_users: unknown key (did you mean authorizedUsers?" in str(
            caught.value
        )

    def test_a_secret_pasted_where_a_variable_name_belongs_is_refused(self, tmp_path: Path) -> None:
        path = _write(tmp_path, "github:\n  webhookSecrets: ['s3cr3t-value with spaces']\n")
        with pytest.raises(ConfigError, match="environment-variable name"):
            load_config(path, environ={})

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("- a\n- b\n", "top level must be a mapping"),
            ("store: [\n", "not valid YAML"),
            ("store:\n  backend: postgres\n", "store.backend"),
            ("webhook:\n  maxBodyBytes: 99999999999\n", "webhook.maxBodyBytes"),
            ("store:\n  retentionDays: 1\n", "store.retentionDays"),
            ("routing:\n  harness: cursor-agent\n", "cursor-agent runs headless only: set"),
            ("routing:\n  harness: aider\n", "routing.harness"),
            ("routing:\n  harnessLabels: {x: aider}\n", "routing.harnessLabels.x"),
            ("routing:\n  harnessLabels: {'agent: cursor': cursor-agent}\n", "picks cursor-agent"),
            ("routing:\n  harnessLabels: {' ': codex}\n", "a label name is empty"),
        ],
    )
    def test_bad_files_get_a_clear_error(self, tmp_path: Path, text: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            load_config(_write(tmp_path, text), environ={})

    def test_a_headless_harness_is_accepted_with_the_process_runner(self, tmp_path: Path) -> None:
        path = _write(tmp_path, "routing:\n  harness: gemini\n  runnerKind: process\n")
        assert load_config(path, environ={}).routing.harness == "gemini"

    def test_a_missing_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="cannot read"):
            load_config(tmp_path / "absent.yaml", environ={})

    def test_environment_overrides_come_after_the_file(self, tmp_path: Path) -> None:
        path = _write(tmp_path, "store:\n  backend: sqlite\nserver:\n  port: 1\n")
        config = load_config(
            path,
            environ={
                "LOOPRELAY__store__backend": "firestore",
                "LOOPRELAY__github__webhookSecrets": "[A, B]",
                "UNRELATED": "x",
            },
        )
        assert config.store.backend == "firestore"
        assert config.github.webhook_secrets == ["A", "B"]
        assert config.server.port == 1

    def test_overrides_are_spelled_as_shells_spell_them(self) -> None:
        config = load_config(
            None,
            environ={
                "LOOPRELAY__RUNNERS__LOST_AFTER_SECONDS": "300",
                "LOOPRELAY__ROUTING__AUTHORIZEDUSERS": "[42]",
            },
        )
        assert config.runners.lost_after_seconds == 300
        assert config.routing.authorized_users == [42]

    def test_a_bad_override_names_its_variable(self) -> None:
        with pytest.raises(
            ConfigError, match=r"server\.port: .*\(set by LOOPRELAY__SERVER__PORT\)"
        ):
            load_config(None, environ={"LOOPRELAY__SERVER__PORT": "many"})

    def test_an_override_of_an_unknown_key_is_an_error_too(self) -> None:
        with pytest.raises(ConfigError, match=r"store\.nope: unknown key"):
            load_config(None, environ={"LOOPRELAY__store__nope": "1"})


class TestGeneratedReference:
    def test_the_checked_in_schema_equals_the_models(self) -> None:
        checked_in = (ROOT / "schema" / "config.schema.json").read_text(encoding="utf-8")
        assert checked_in == config_schema_text(), (
            "schema/config.schema.json is stale: run "
            "`looprelay config schema > schema/config.schema.json`"
        )

    def test_the_checked_in_reference_equals_the_models(self) -> None:
        checked_in = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
        assert checked_in == config_docs(), (
            "docs/config.md is stale: run `looprelay config docs > docs/config.md`"
        )

    def test_every_key_is_documented_with_a_meaning(self) -> None:
        docs = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
        for key in documented_keys():
            row = next(
                (line for line in docs.splitlines() if line.startswith(f"| `{key}` |")), None
            )
            assert row is not None, f"{key} is not documented"
            meaning = row.rstrip(" |").rsplit("|", 1)[-1].strip()
            assert meaning, f"{key} has no meaning in docs/config.md"

    def test_the_schema_rejects_unknown_keys_like_the_loader(self) -> None:
        schema = json.loads(config_schema_text())
        assert schema["additionalProperties"] is False


class TestConfigCommand:
    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "looprelay.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def test_validate_accepts_a_good_file(self, tmp_path: Path) -> None:
        result = self._run("config", "validate", str(_write(tmp_path, "server:\n  port: 9000\n")))
        assert result.returncode == 0
        assert "valid" in result.stdout

    def test_validate_names_the_bad_key_and_fails(self, tmp_path: Path) -> None:
        result = self._run("config", "validate", str(_write(tmp_path, "sever:\n  port: 1\n")))
        assert result.returncode == 1
        assert "sever: unknown key" in result.stderr

    def test_validate_warns_that_no_one_is_authorized(self, tmp_path: Path) -> None:
        result = self._run("config", "validate", str(_write(tmp_path, "server:\n  port: 9000\n")))
        assert result.returncode == 0
        assert "routing.authorizedUsers is empty: every event and command" in result.stderr

    @pytest.mark.parametrize(
        ("routing", "files", "message"),
        [
            ("authorizedUsers: ['@octocat']", {}, "entry '@octocat' is neither a GitHub login"),
            (
                "promptTemplate: {dir}/broken.j2",
                {"broken.j2": "{% if work_item %}\n"},
                "broken.j2: template syntax error on line 1",
            ),
            (
                "spawnPromptTemplate: {dir}/spawn.j2",
                {"spawn.j2": "{{ secrets }}\n"},
                "spawn.j2: template uses unknown variables ['secrets']",
            ),
            (
                "promptTemplate: {dir}/missing.j2",
                {},
                "cannot read the prompt template {dir}/missing.j2: No such file or directory",
            ),
        ],
        ids=["at-login", "does-not-compile", "unknown-variable", "missing-file"],
    )
    def test_validate_refuses_what_up_refuses(
        self, tmp_path: Path, routing: str, files: dict[str, str], message: str
    ) -> None:
        for name, text in files.items():
            (tmp_path / name).write_text(text, encoding="utf-8")
        config = _write(tmp_path, f"routing:\n  {routing.format(dir=tmp_path)}\n")
        expected = message.format(dir=tmp_path)
        checked = self._run("config", "validate", str(config))
        started = self._run(
            "up", "--config", str(config), "--data", str(tmp_path / "data"), "--port", "0"
        )
        for result in (checked, started):
            assert result.returncode == 1, result.stdout
            [last] = result.stderr.strip().splitlines()[-1:]
            assert last.startswith("error: ") and expected in last, result.stderr


class TestInteractionBlock:
    def test_the_schema_declares_the_two_modes_and_the_default(self) -> None:
        schema = json.loads(config_schema_text())
        mode = schema["$defs"]["InteractionConfig"]["properties"]["mode"]
        assert (mode["enum"], mode["default"]) == (["work-item", "cli"], "work-item")

    def test_an_undeclared_mode_still_starts_as_work_item_with_a_warning(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        from looprelay.config.routing import routing_policy

        config = load_config(_write(tmp_path, "routing:\n  interaction:\n    mode: terminal\n"))
        with caplog.at_level("WARNING", logger="looprelay.routing"):
            policy = routing_policy(config.routing)
        assert policy.interaction.mode == "work-item"
        assert any("'terminal'" in record.getMessage() for record in caplog.records)

    @pytest.mark.parametrize("block", ["null", "cli", "[cli]"], ids=["null", "string", "list"])
    def test_an_interaction_that_is_not_a_mapping_means_the_default(
        self, tmp_path: Path, block: str
    ) -> None:
        config = load_config(_write(tmp_path, f"routing:\n  interaction: {block}\n"))
        assert config.routing.interaction.mode == "work-item"

    def test_the_example_config_is_valid_and_comments_the_interaction_block(self) -> None:
        example = ROOT / "looprelay.example.yaml"
        load_config(example)
        assert "  #   interaction:\n  #     mode: work-item" in example.read_text(encoding="utf-8")
