"""The App `looprelay app create` saved in the data directory, as configuration loading reads
it: beneath the config file, its key file found wherever the directory now is."""

from __future__ import annotations

from pathlib import Path

import pytest

from looprelay.adapters.github.auth import AppAuth, auth_from_config
from looprelay.config.model import APP_FRAGMENT_FILE, load_config
from looprelay.errors import ConfigError
from tests.fake_github import AppKey


def _saved_app(data: Path, key: AppKey) -> None:
    data.mkdir(mode=0o700)
    (data / APP_FRAGMENT_FILE).write_text(
        "github:\n  appId: 99\n  apiUrl: https://ghe.example/api/v3\n"
        "  privateKeyFile: github-app.pem\n"
    )
    pem = data / "github-app.pem"
    pem.write_text(key.private_pem)
    pem.chmod(0o600)


def test_the_saved_app_is_used_with_no_environment_variable(
    tmp_path: Path, github_app_key: AppKey
) -> None:
    moved = tmp_path / "moved"  # a data directory moved after `app create`
    _saved_app(moved, github_app_key)
    config = load_config(None, environ={}, data_dir=moved)
    assert (config.github.app_id, config.github.api_url) == (99, "https://ghe.example/api/v3")
    assert config.github.private_key_file == str(moved / "github-app.pem")
    assert isinstance(auth_from_config(config.github, {}), AppAuth)


def test_the_config_file_wins_over_the_saved_app(tmp_path: Path, github_app_key: AppKey) -> None:
    _saved_app(tmp_path / "data", github_app_key)
    file = tmp_path / "looprelay.yaml"
    file.write_text("github:\n  apiUrl: https://api.github.com\n  tokenEnv: GH_TOKEN\n")
    config = load_config(file, environ={}, data_dir=tmp_path / "data")
    assert config.github.api_url == "https://api.github.com"
    assert (config.github.app_id, config.github.token_env) == (99, "GH_TOKEN")


def test_a_key_file_others_can_read_is_refused(tmp_path: Path, github_app_key: AppKey) -> None:
    _saved_app(tmp_path / "data", github_app_key)
    (tmp_path / "data" / "github-app.pem").chmod(0o644)
    config = load_config(None, environ={}, data_dir=tmp_path / "data")
    with pytest.raises(ConfigError, match="readable by other users"):
        auth_from_config(config.github, {})
