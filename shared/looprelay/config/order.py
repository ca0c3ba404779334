"""Resolve the ``routing`` section's order and turn settings into the core's ``OrderRules``.

Apart from ``config.routing``: the webhook's process builds the worker's wiring at import and
must not load the prompt templates (Jinja2) that module reads.
"""

from __future__ import annotations

from datetime import timedelta

from looprelay.config.model import RoutingConfig
from looprelay.core.control import Keywords
from looprelay.core.order import OrderRules
from looprelay.errors import ConfigError


def order_rules(config: RoutingConfig) -> OrderRules:
    """The order and turn rules of the ``routing`` section; ``ConfigError`` when two commands
    share a keyword."""
    try:
        keywords = Keywords.from_config(config.control.keywords)
    except ValueError as exc:
        raise ConfigError(f"routing: {exc}") from exc
    return OrderRules(
        comment_window=timedelta(seconds=config.comment_window_seconds),
        max_comment_run=timedelta(seconds=config.max_comment_run_seconds),
        turn_window=timedelta(seconds=config.turn_window_seconds),
        review_turns=config.review_turns,
        comment_bursts=config.comment_burst_turns,
        keywords=keywords,
    )
