"""Structured logs: one JSON object per line in Cloud Logging's format.

``severity`` and ``message`` are what Cloud Logging reads; the delivery id travels as a field
and as a label so one delivery's lines can be found together.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

_CORRELATION_FIELDS = ("delivery_id", "work_item", "task", "runner_id")
_LABELS_KEY = "logging.googleapis.com/labels"


class JsonLineFormatter(logging.Formatter):
    """Render a record as one JSON line; fields passed with ``extra=`` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": record.levelname,
            "message": record.getMessage(),
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "logger": record.name,
        }
        labels = {}
        for name in _CORRELATION_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
                labels[name] = str(value)
        if labels:
            entry[_LABELS_KEY] = labels
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Send every looprelay log line to ``stream`` (stdout) as JSON; idempotent."""
    root = logging.getLogger("looprelay")
    root.setLevel(level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonLineFormatter())
    root.addHandler(handler)
