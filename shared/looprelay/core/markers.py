"""The loop-prevention marker: the hidden line ending every comment looprelay writes.

It means "written by looprelay" for loop prevention only. Anyone can paste it, and such a
comment is dropped too: dropping is the safe side. It is never evidence of authorship; trust in
a comment looprelay wrote comes from the comment id it recorded (fixes discrepancy 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKER_TAG = "looprelay:v1"
LEGACY_MARKER = "<!-- the-loop:agent-comment -->"
"""the-loop's marker; sessions it set up may still write it, so it is dropped too."""
_FIELD = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
_FIELD_RE = re.compile(_FIELD, re.ASCII)
_MARKER = re.compile(rf"<!-- {MARKER_TAG} kind=(?P<kind>{_FIELD}) id=(?P<id>{_FIELD}) -->", re.A)
# Detection is wider than what we write: any version, spacing or case still counts as ours.
_ANY_MARKER = re.compile(r"<!--\s*(?:looprelay:|the-loop:agent-comment)", re.IGNORECASE)


@dataclass(frozen=True)
class Marker:
    """The hidden line ending every comment looprelay writes: what wrote it, for which id."""

    kind: str
    id: str

    def __post_init__(self) -> None:
        for name, value in (("kind", self.kind), ("id", self.id)):
            if not _FIELD_RE.fullmatch(value):
                raise ValueError(
                    f"marker {name} {value[:80]!r} must be 1-128 letters, digits, '.', '_', ':' "
                    "or '-', starting with a letter or digit"
                )

    def render(self) -> str:
        """Return the marker as an HTML comment (invisible in rendered Markdown)."""
        return f"<!-- {MARKER_TAG} kind={self.kind} id={self.id} -->"


def mark(body: str, *, kind: str, id: str) -> str:
    """Append the loop-prevention marker for ``kind`` and ``id`` to a comment body.

    Expects the comment text and, as ``id``, a delivery or dispatch id. Idempotent: a body
    already ending with the same marker comes back unchanged. Raises ``ValueError`` when
    ``kind`` or ``id`` could not sit inside an HTML comment (see :class:`Marker`).
    """
    marker = Marker(kind=kind, id=id).render()
    text = body.rstrip()
    if text.endswith(marker):
        return text
    return f"{text}\n\n{marker}" if text else marker


def is_marked(body: str) -> bool:
    """Tell whether a body carries looprelay's marker (any version) or the-loop's.

    Expects any text, of any length. Never raises.
    """
    return _ANY_MARKER.search(body) is not None


def read_marker(body: str) -> Marker | None:
    """Return the last well-formed looprelay marker in a body, or None.

    Expects a comment body. What it returns says what the marker claims, not who wrote it.
    Never raises.
    """
    last = None
    for match in _MARKER.finditer(body):
        last = match
    return Marker(kind=last["kind"], id=last["id"]) if last else None
