"""The system clock behind the ``Clock`` port."""

from __future__ import annotations

from datetime import UTC, datetime


class SystemClock:
    """Reads the machine's clock, in UTC."""

    def now(self) -> datetime:
        """Return the current time, timezone-aware UTC."""
        return datetime.now(UTC)
