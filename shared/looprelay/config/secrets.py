"""Webhook secrets named in the config, read from the environment."""

from __future__ import annotations

from collections.abc import Mapping

from looprelay.config.model import GitHubConfig
from looprelay.datadir import warn_if_weak
from looprelay.errors import ConfigError


def webhook_secrets_from_env(github: GitHubConfig, environ: Mapping[str, str]) -> list[bytes]:
    """Return the configured webhook secrets, primary first.

    Called once as a deployment starts; a secret under 128 bits is used, with a warning naming
    its variable. Raises ``ConfigError`` naming the variable when one is unset or empty: a
    half-configured rotation must not silently drop a secret.
    """
    values = []
    for name in github.webhook_secrets:
        value = environ.get(name, "")
        if not value:
            raise ConfigError(
                f"github.webhookSecrets names {name}, but that environment variable is "
                "unset or empty"
            )
        warn_if_weak(value.encode(), name=f"environment variable {name}")
        values.append(value.encode())
    return values
