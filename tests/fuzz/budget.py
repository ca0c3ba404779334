"""How many examples each property runs: a share of the loaded profile (tests/conftest.py).

CI loads ``ci`` (few examples, derandomized); ``pytest --fuzz`` loads ``fuzz`` (many more,
random, failures kept in ``.hypothesis/``). A property that costs a request per example asks
for a smaller share, so the whole of tests/fuzz stays within about a minute by default.
"""

from __future__ import annotations

from hypothesis import settings


def examples(share: float = 1.0) -> settings:
    """Settings running ``share`` of the profile's example count (at least 5)."""
    profile = settings.default
    assert profile is not None, "tests/conftest.py loads a hypothesis profile"
    return settings(max_examples=max(5, round(profile.max_examples * share)))
