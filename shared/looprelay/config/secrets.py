"""Secrets named in the config (webhook secrets, the operator token), read from the
environment."""

from __future__ import annotations

from collections.abc import Mapping

from looprelay.config.model import GitHubConfig, ServerConfig
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


MIN_OPERATOR_TOKEN_CHARS = 16


def operator_token_from_env(server: ServerConfig, environ: Mapping[str, str]) -> bytes | None:
    """Return the operator token ``server.operatorTokenEnv`` names, or None when none is named.

    Raises ``ConfigError`` naming the variable when it is unset, empty or shorter than
    ``MIN_OPERATOR_TOKEN_CHARS``: a token that was meant to be there must not silently leave
    the page closed, nor open it to a guess.
    """
    name = server.operator_token_env
    if name is None:
        return None
    value = environ.get(name, "")
    if len(value) < MIN_OPERATOR_TOKEN_CHARS:
        state = "unset or empty" if not value else f"shorter than {MIN_OPERATOR_TOKEN_CHARS}"
        raise ConfigError(
            f"server.operatorTokenEnv names {name}, but that environment variable is {state}; "
            "put a long random token there (for example `openssl rand -hex 32`)"
        )
    return value.encode()
