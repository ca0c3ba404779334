"""Load prompt and comment templates: the bundled ones, or an operator's file."""

from __future__ import annotations

import importlib.resources
from functools import cache
from pathlib import Path

from looprelay.errors import ConfigError

EVENT_PROMPT = "event_prompt.md.j2"
SPAWN_PROMPT = "spawn_prompt.md.j2"
CHECKLIST_COMMENT = "checklist_comment.md.j2"
CONFIRMATION_COMMENT = "confirmation_comment.md.j2"
ATTACH_COMMENT = "attach_comment.md.j2"


@cache
def bundled_template(name: str) -> str:
    """Return the text of the bundled template ``name`` (read once)."""
    return importlib.resources.files("looprelay.templates").joinpath(name).read_text("utf-8")


def operator_template(path: str) -> str:
    """Return the operator's template at ``path``; ``ConfigError`` when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the prompt template {path}: {exc.strerror}") from exc
