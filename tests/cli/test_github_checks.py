"""The GitHub credentials are checked before anything starts: `config validate` and `up` ask
the stand-in who they are, and every bad one ends in one line that names what to fix and
never the secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_up_errors import looprelay, one_error
from tests.fake_github import AppKey, FakeGitHub, make_app_key

TOKEN = "good-token-0123456789abcdef"  # the stand-in's
WRONG = "wrong-token-0123456789abcdef"  # nobody's
PASTED_TOKEN = "ghp_" + "A1b2C3d4E5" * 3 + "f6G7h8"  # a token's shape


def _config(tmp_path: Path, github: str) -> Path:
    path = tmp_path / "looprelay.yaml"
    path.write_text(f"github:\n{github}")
    return path


def _no_secret(result_text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in result_text
    assert "PRIVATE KEY" not in result_text


@pytest.fixture
def github(fake_github: FakeGitHub, github_app_key: AppKey) -> FakeGitHub:
    fake_github.tokens[TOKEN] = "octocat"
    fake_github.app_public_key = github_app_key.public_key
    return fake_github


def test_a_good_token_is_named_by_its_login(tmp_path: Path, github: FakeGitHub) -> None:
    config = _config(tmp_path, f"  apiUrl: {github.url}\n  tokenEnv: GH_TOKEN\n")
    result = looprelay("config", "validate", str(config), env={"GH_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr
    expected = f"{config}: valid; GitHub credentials act as GitHub user octocat"
    assert result.stdout.strip() == expected
    assert [r.path for r in github.requests] == ["/user"]


def test_a_good_app_key_is_named_by_the_apps_slug(
    tmp_path: Path, github: FakeGitHub, github_app_key: AppKey
) -> None:
    github.labels["octo/widgets"] = {"the-loop: auto-execute"}
    config = _config(
        tmp_path, f"  apiUrl: {github.url}\n  appId: {github.app_id}\n  privateKeyEnv: APP_KEY\n"
    )
    result = looprelay(
        "config", "validate", str(config), env={"APP_KEY": github_app_key.private_pem}
    )
    assert result.returncode == 0, result.stderr
    assert f"GitHub App looprelay-test (id {github.app_id})" in result.stdout
    assert "has no label" not in result.stderr  # the label is there


@pytest.mark.parametrize("command", ["validate", "up"])
def test_a_token_github_refuses_is_one_line_without_it(
    tmp_path: Path, github: FakeGitHub, command: str
) -> None:
    config = _config(tmp_path, f"  apiUrl: {github.url}\n  tokenEnv: GH_TOKEN\n")
    data = tmp_path / "data"
    args = (
        ["config", "validate", str(config)]
        if command == "validate"
        else ["up", "--config", str(config), "--data", str(data), "--port", "0"]
    )
    result = looprelay(*args, env={"GH_TOKEN": WRONG})
    line = one_error(result)
    assert line == (
        "error: github.tokenEnv (GH_TOKEN): GitHub refuses this credential (HTTP 401); it is "
        "wrong, expired or revoked; make a new one (for example `gh auth token`)"
    )
    _no_secret(result.stdout + result.stderr, WRONG)
    assert not data.exists()  # up refused before it made anything


def test_a_key_that_is_not_the_apps_is_one_line_without_it(
    tmp_path: Path, github: FakeGitHub
) -> None:
    other = make_app_key()
    config = _config(
        tmp_path, f"  apiUrl: {github.url}\n  appId: {github.app_id}\n  privateKeyEnv: APP_KEY\n"
    )
    result = looprelay("config", "validate", str(config), env={"APP_KEY": other.private_pem})
    assert one_error(result).startswith(
        "error: github.appId and its private key: GitHub refuses this credential (HTTP 401)"
    )
    _no_secret(result.stdout + result.stderr)


@pytest.mark.parametrize(
    ("github_yaml", "env", "expected"),
    [
        (
            "  tokenEnv: GH_TOKEN\n",
            {},
            "error: environment variable GH_TOKEN (github config) is unset or empty",
        ),
        (
            "  appId: 1\n  privateKeyEnv: APP_KEY\n",
            {"APP_KEY": "not a key at all"},
            "error: environment variable APP_KEY: not a PEM private key without a passphrase",
        ),
        (
            "  webhookSecrets: [HOOK_SECRET]\n",
            {},
            "error: github.webhookSecrets names HOOK_SECRET, but that environment variable is "
            "unset or empty",
        ),
    ],
    ids=["token-unset", "key-not-pem", "webhook-secret-unset"],
)
def test_a_named_variable_that_is_missing_or_unusable_is_one_line(
    tmp_path: Path, github: FakeGitHub, github_yaml: str, env: dict[str, str], expected: str
) -> None:
    config = _config(tmp_path, f"  apiUrl: {github.url}\n{github_yaml}")
    result = looprelay("config", "validate", str(config), env=env)
    assert one_error(result) == expected
    _no_secret(result.stdout + result.stderr, *env.values())
    assert not github.requests  # refused before GitHub was asked


@pytest.mark.parametrize("key", ["tokenEnv", "privateKeyEnv", "webhookSecrets"])
def test_a_secret_pasted_where_its_variables_name_belongs_is_refused_unechoed(
    tmp_path: Path, github_app_key: AppKey, key: str
) -> None:
    pem = github_app_key.private_pem
    secret = pem if key == "privateKeyEnv" else PASTED_TOKEN
    quoted = '"' + secret.replace("\n", "\\n") + '"'
    value = f"[{quoted}]" if key == "webhookSecrets" else quoted
    config = _config(tmp_path, f"  appId: 1\n  {key}: {value}\n")
    result = looprelay("config", "validate", str(config))
    assert result.returncode == 1
    assert "this holds a NAME of a variable" in result.stderr
    _no_secret(result.stdout + result.stderr, PASTED_TOKEN, pem.splitlines()[1])


def test_a_polled_repository_without_the_label_is_named_once_with_the_command(
    tmp_path: Path, github: FakeGitHub
) -> None:
    github.repositories.add("octo/gadgets")
    github.labels["octo/gadgets"] = {"the-loop: auto-execute"}
    config = _config(
        tmp_path,
        f"  apiUrl: {github.url}\n  tokenEnv: GH_TOKEN\n"
        "  poll:\n    repositories: [octo/widgets, octo/gadgets]\n",
    )
    result = looprelay("config", "validate", str(config), env={"GH_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr
    missing = [line for line in result.stderr.splitlines() if "has no label" in line]
    assert missing == [
        "octo/widgets has no label 'the-loop: auto-execute'; create it: gh label create "
        "'the-loop: auto-execute' --repo octo/widgets --color 0E8A16 --description "
        "'looprelay: arms an issue or pull request'"
    ]
    _no_secret(result.stdout + result.stderr, TOKEN)
