"""Firestore's errors become looprelay's once, in ``firestore_common.translated``."""

from __future__ import annotations

import logging

import pytest
from google.api_core import exceptions as gexc

from looprelay.adapters.firestore.common import translated
from looprelay.errors import Transient

# What Firestore answers a query whose composite index is missing (the link encodes the index).
MISSING_INDEX = (
    "The query requires an index. You can create it here: https://console.firebase.google.com"
    "/v1/r/project/demo/firestore/indexes?create_composite=ClNwcm9qZWN0cy9kZW1v"
)


class TestTranslated:
    def test_a_missing_index_is_retryable_and_logged_with_the_index(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        with (
            caplog.at_level(logging.ERROR, logger="looprelay.firestore"),
            pytest.raises(Transient, match="composite index") as raised,
            translated("list dispatches"),
        ):
            raise gexc.FailedPrecondition(MISSING_INDEX)

        assert "create_composite=ClNwcm9qZWN0cy9kZW1v" in str(raised.value)
        [record] = caplog.records
        assert "list dispatches" in record.getMessage()
        assert "create_composite=ClNwcm9qZWN0cy9kZW1v" in record.getMessage()

    @pytest.mark.parametrize(
        "error",
        [gexc.ServiceUnavailable("down"), gexc.Aborted("contended"), gexc.DeadlineExceeded("x")],
    )
    def test_unavailable_or_contended_is_retryable(self, error: Exception) -> None:
        with pytest.raises(Transient, match="retry later"), translated("read a delivery"):
            raise error
