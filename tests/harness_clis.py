"""The pinned Codex, Gemini and Copilot CLIs (``tests/harness-clis.versions``), as ``./dev``
installs them into the user's cache and exports ``LOOPRELAY_HARNESS_BIN_DIR``; without the
variable the cache is looked in directly. A missing binary skips the test, unless
``LOOPRELAY_REQUIRE_HARNESS_CLIS=1`` (CI), where it fails.

:func:`offline_setup` makes a fresh HOME where one CLI talks only to a stand-in for its model
API (``tests.model_apis``): the environment and the operator flags a runner would have;
:func:`pointed_at_stand_in` sets that up for any harness, Claude included, in this process's
environment (which a harness the agent starts inherits).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tests import claude_cli
from tests.model_apis import ModelApi, gemini_api, messages_api, responses_api

VERSIONS_FILE = Path(__file__).with_name("harness-clis.versions")
BIN_ENV = "LOOPRELAY_HARNESS_BIN_DIR"
REQUIRE_ENV = "LOOPRELAY_REQUIRE_HARNESS_CLIS"
STANDIN_KEY = "sk-looprelay-standin-0000"
"""The API key every CLI is given: the stand-ins take any; Copilot masks it in what it prints."""
DIALECTS = {"claude": messages_api, "codex": responses_api, "gemini": gemini_api}
DIALECTS["copilot"] = messages_api  # its own-provider mode, set to Anthropic's API
"""The model API each harness's CLI is pointed at."""
MODELS = {"codex": "gpt-5", "gemini": "gemini-2.5-pro", "copilot": "claude-sonnet-4.5"}
"""The model each CLI is told to use: one it knows, so it asks no router first."""


def pins() -> list[str]:
    """``package@version`` for each pinned CLI, in file order."""
    lines = VERSIONS_FILE.read_text(encoding="utf-8").splitlines()
    pairs = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    return [f"{name}@{version}" for name, version in pairs]


def bin_dir() -> Path:
    """The directory holding the pinned CLIs' binaries (``./dev``'s cache, by the pins' hash)."""
    named = os.environ.get(BIN_ENV)
    if named:
        return Path(named)
    digest = hashlib.sha256(" ".join(pins()).encode()).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "looprelay" / f"harness-clis-{digest}" / "node_modules" / ".bin"


def binary(name: str) -> Path:
    """The pinned ``name`` binary; skips (or, in CI, fails) the test when it is not installed."""
    found = bin_dir() / name
    if not os.access(found, os.X_OK):
        _unavailable(f"{found} is not installed (./dev test installs it)")
    return found


def _unavailable(what: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {what}", pytrace=False)
    pytest.skip(f"real harness CLI tests skipped: {what} (set {REQUIRE_ENV}=1 to fail)")


@dataclass(frozen=True)
class OfflineSetup:
    """What a runner machine would have for one CLI: ``env`` to set, ``args`` its
    ``--harness-arg`` flags."""

    env: dict[str, str]
    args: tuple[str, ...] = ()


def offline_setup(name: str, *, home: Path, api_url: str) -> OfflineSetup:
    """A fresh ``home`` where ``name`` (codex, gemini or copilot) uses only ``api_url``."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home), "NO_BROWSER": "1"}
    if name == "codex":
        codex = home / ".codex"
        codex.mkdir()
        (codex / "config.toml").write_text(
            f'model = "{MODELS[name]}"\nmodel_provider = "standin"\n\n'
            "[model_providers.standin]\n"
            f'name = "standin"\nbase_url = "{api_url}/v1"\nwire_api = "responses"\n'
            'env_key = "STANDIN_API_KEY"\nrequest_max_retries = 0\nstream_max_retries = 0\n',
            encoding="utf-8",
        )
        return OfflineSetup({**env, "CODEX_HOME": str(codex), "STANDIN_API_KEY": STANDIN_KEY})
    if name == "gemini":
        gemini = home / ".gemini"
        gemini.mkdir()
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        (gemini / "settings.json").write_text(json.dumps(settings), encoding="utf-8")
        env |= {"GEMINI_API_KEY": STANDIN_KEY, "GOOGLE_GEMINI_BASE_URL": api_url}
        return OfflineSetup(env, (f"--model={MODELS[name]}",))
    if name == "copilot":
        env |= {
            "COPILOT_OFFLINE": "true",
            "COPILOT_PROVIDER_TYPE": "anthropic",
            "COPILOT_PROVIDER_BASE_URL": api_url,
            "COPILOT_PROVIDER_API_KEY": STANDIN_KEY,
            "COPILOT_MODEL": MODELS[name],
            "COPILOT_AUTO_UPDATE": "false",
        }
        return OfflineSetup(env)
    raise ValueError(f"no offline setup for {name!r}")


@contextmanager
def pointed_at_stand_in(
    name: str, directory: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModelApi, tuple[str, ...]]]:
    """A stand-in for ``name``'s model API, and this process's environment set (through
    ``monkeypatch``) as a runner machine with only that CLI, pointed at it, would have it;
    yields the stand-in and the harness's ``--harness-arg`` flags. Skips (fails in CI) when the
    pinned CLI is not installed."""
    api = ModelApi(DIALECTS[name])
    try:
        if name == "claude":
            with _claude_home(directory, api.url, monkeypatch):
                yield api, ()
            return
        found = binary(name)
        setup = offline_setup(name, home=directory / "home", api_url=api.url)
        for key, value in setup.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("PATH", f"{found.parent}:/usr/bin:/bin")
        yield api, setup.args
    finally:
        api.close()


@contextmanager
def _claude_home(directory: Path, api_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    found = claude_cli.cached_binary()
    if found is None:
        _unavailable("the pinned claude is not installed (./dev test installs it)")
    with claude_cli.fresh_claude_home(found, directory) as claude:
        # Claude asks once whether to use a key found in its environment; say yes, as an
        # operator who exported it would have.
        config = json.loads(claude.config_path.read_text(encoding="utf-8"))
        config["customApiKeyResponses"] = {"approved": [STANDIN_KEY[-20:]], "rejected": []}
        claude.config_path.write_text(json.dumps(config), encoding="utf-8")
        for unset in claude.unset:
            monkeypatch.delenv(unset, raising=False)
        for key, value in claude.env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", STANDIN_KEY)
        yield
