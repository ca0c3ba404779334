"""Logs: one JSON object per line in Cloud Logging's format, or one plain line for a person.

``severity`` and ``message`` are what Cloud Logging reads; the delivery id travels as a field
and as a label so one delivery's lines can be found together. At a terminal the same records
read as ``12:00:01 WARNING message  delivery_id=...``: the choice is the stream's, unless the
operator names one (``--log-format``).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

_CORRELATION_FIELDS = ("delivery_id", "work_item", "task", "runner_id")
_LABELS_KEY = "logging.googleapis.com/labels"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "text", "json")
LogFormat = Literal["auto", "text", "json"]


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


class TextLineFormatter(logging.Formatter):
    """Render a record as one line a person reads: local time, level, message, then the
    correlation fields and ``fields=`` as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).strftime("%H:%M:%S")
        extras = {name: getattr(record, name, None) for name in _CORRELATION_FIELDS}
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            extras.update(fields)
        tail = "  ".join(f"{key}={value}" for key, value in extras.items() if value is not None)
        line = f"{stamp} {record.levelname:<7} {record.getMessage()}"
        if tail:
            line += "  " + tail
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(
    level: str = "INFO", stream: TextIO | None = None, log_format: LogFormat = "auto"
) -> None:
    """Send every looprelay log line to ``stream`` (stdout); idempotent.

    ``auto`` writes plain lines when the stream is a terminal and JSON lines otherwise (a
    file, a pipe, a log collector). Expects a level name in any case.
    """
    target = stream or sys.stdout
    text = log_format == "text" or (log_format == "auto" and _is_terminal(target))
    root = logging.getLogger("looprelay")
    root.setLevel(level.upper())
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(target)
    handler.setFormatter(TextLineFormatter() if text else JsonLineFormatter())
    root.addHandler(handler)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object
        return False
