"""Webhook signatures, checked against GitHub's published test vector."""

from __future__ import annotations

import pytest

from looprelay.core.signature import sign_body, verify_signature

# From GitHub's "Validating webhook deliveries".
VECTOR_SECRET = b"It's a Secret to Everybody"
VECTOR_BODY = b"Hello, World!"
VECTOR_SIGNATURE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


class TestSignBody:
    def test_matches_githubs_test_vector(self) -> None:
        assert sign_body(VECTOR_BODY, VECTOR_SECRET) == VECTOR_SIGNATURE


class TestVerifySignature:
    def test_accepts_githubs_test_vector(self) -> None:
        assert verify_signature(VECTOR_BODY, VECTOR_SIGNATURE, [VECTOR_SECRET])

    def test_accepts_upper_case_hex(self) -> None:
        upper = "sha256=" + VECTOR_SIGNATURE.removeprefix("sha256=").upper()
        assert verify_signature(VECTOR_BODY, upper, [VECTOR_SECRET])

    def test_accepts_a_previous_secret_during_rotation(self) -> None:
        assert verify_signature(VECTOR_BODY, VECTOR_SIGNATURE, [b"new-secret", VECTOR_SECRET])

    def test_rejects_a_signature_for_a_different_secret(self) -> None:
        assert not verify_signature(VECTOR_BODY, VECTOR_SIGNATURE, [b"another secret"])

    def test_rejects_one_changed_byte_of_body(self) -> None:
        assert not verify_signature(b"Hello, World?", VECTOR_SIGNATURE, [VECTOR_SECRET])

    def test_rejects_when_no_secret_is_configured(self) -> None:
        assert not verify_signature(VECTOR_BODY, VECTOR_SIGNATURE, [])

    @pytest.mark.parametrize(
        "header",
        [
            None,
            "",
            "sha1=0a4d55a8d778e5022fab701977c5d840bbc486d0",  # legacy SHA-1 form
            VECTOR_SIGNATURE.removeprefix("sha256="),  # no prefix
            VECTOR_SIGNATURE[:-1],  # truncated digest
            VECTOR_SIGNATURE + "0",  # over-long digest
            "sha256=" + "zz" * 32,  # not hex
            "sha256=" + "é" * 64,  # not ASCII
        ],
    )
    def test_rejects_malformed_headers(self, header: str | None) -> None:
        assert not verify_signature(VECTOR_BODY, header, [VECTOR_SECRET])
