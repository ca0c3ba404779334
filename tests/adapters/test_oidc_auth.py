"""OidcTaskAuthenticator against real RS256 tokens and a loopback certificate server."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

from looprelay.adapters.gcp.oidc import OidcTaskAuthenticator
from looprelay.errors import Transient, Unauthorized

AUDIENCE = "https://worker.example.test/worker"
ACCOUNT = "tasks-invoker@project.iam.gserviceaccount.com"
KID = "test-key-1"


@dataclass
class _Key:
    signer: crypt.RSASigner
    cert_pem: str


def _make_key(kid: str) -> _Key:
    """A fresh RSA key and a self-signed certificate for it, as Google's v1 certs serve."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "looprelay test signer")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return _Key(
        signer=crypt.RSASigner.from_string(key_pem, key_id=kid),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
    )


@pytest.fixture(scope="module")
def key() -> _Key:
    """The key the certificate server publishes under ``KID``."""
    return _make_key(KID)


@pytest.fixture(scope="module")
def stranger_key() -> _Key:
    """A key nobody published, claiming the same ``KID``."""
    return _make_key(KID)


@dataclass
class _CertsScript:
    """What the loopback certificate server answers; tests change it per case."""

    status: int = 200
    body: bytes = b"{}"
    cache_control: str | None = None
    hits: list[str] = field(default_factory=list)


class _CertsHandler(BaseHTTPRequestHandler):
    server: _CertsServer

    def do_GET(self) -> None:
        script = self.server.script
        script.hits.append(self.path)
        self.send_response(script.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(script.body)))
        if script.cache_control is not None:
            self.send_header("Cache-Control", script.cache_control)
        self.end_headers()
        self.wfile.write(script.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _CertsServer(ThreadingHTTPServer):
    script: _CertsScript


@pytest.fixture(scope="module")
def certs_server() -> Iterator[_CertsServer]:
    """A real HTTP server on 127.0.0.1, on a free port, in a thread; shared by the module."""
    server = _CertsServer(("127.0.0.1", 0), _CertsHandler)
    server.script = _CertsScript()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def certs(certs_server: _CertsServer, key: _Key) -> tuple[str, _CertsScript]:
    """The server's URL and a fresh script serving ``{KID: cert_pem}``."""
    certs_server.script = _CertsScript(body=json.dumps({KID: key.cert_pem}).encode())
    return f"http://127.0.0.1:{certs_server.server_address[1]}/oauth2/v1/certs", certs_server.script


@pytest.fixture
def authenticator(certs: tuple[str, _CertsScript]) -> OidcTaskAuthenticator:
    return OidcTaskAuthenticator(
        audience=AUDIENCE, service_account_email=ACCOUNT, certs_url=certs[0]
    )


def _token(signer: crypt.RSASigner, *, key_id: str | None = None, **overrides: Any) -> str:
    """An ID token shaped like the one Cloud Tasks attaches, with ``overrides`` applied.

    ``iat`` and ``exp`` overrides are seconds from now, taken when the token is made (not when
    the test is collected, which can be many seconds earlier).
    """
    now = int(time.time())
    for claim in ("iat", "exp"):
        if claim in overrides:
            overrides[claim] += now
    claims: dict[str, Any] = {
        "iss": "https://accounts.google.com",
        "aud": AUDIENCE,
        "azp": "1234567890",
        "sub": "1234567890",
        "email": ACCOUNT,
        "email_verified": True,
        "iat": now,
        "exp": now + 3600,
    }
    claims.update(overrides)
    return jwt.encode(signer, claims, key_id=key_id).decode()


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


class TestAccepted:
    def test_a_good_token_is_accepted(
        self, authenticator: OidcTaskAuthenticator, key: _Key
    ) -> None:
        authenticator.authenticate(_bearer(_token(key.signer)))

    @pytest.mark.parametrize(
        ("scheme", "overrides"),
        [
            ("bearer", {}),
            ("Bearer", {"iss": "accounts.google.com"}),
            ("Bearer", {"email": ACCOUNT.upper()}),
            ("Bearer", {"iat": 5}),
            ("Bearer", {"iat": -3600, "exp": -5}),
        ],
        ids=[
            "lower-case-scheme",
            "bare-issuer",
            "email-case",
            "early-within-skew",
            "late-within-skew",
        ],
    )
    def test_variants_google_allows_are_accepted(
        self,
        authenticator: OidcTaskAuthenticator,
        key: _Key,
        scheme: str,
        overrides: dict[str, Any],
    ) -> None:
        authenticator.authenticate({"authorization": f"{scheme} {_token(key.signer, **overrides)}"})

    def test_certificates_are_fetched_from_certs_url(
        self, authenticator: OidcTaskAuthenticator, key: _Key, certs: tuple[str, _CertsScript]
    ) -> None:
        authenticator.authenticate(_bearer(_token(key.signer)))
        assert certs[1].hits == ["/oauth2/v1/certs"]

    @pytest.mark.parametrize(
        ("cache_control", "fetches"),
        [("public, max-age=20000, must-revalidate, no-transform", 1), (None, 3), ("no-store", 3)],
        ids=["max-age-as-google-sends", "no-cache-header", "no-store"],
    )
    def test_certificates_are_fetched_again_only_when_their_max_age_says(
        self,
        authenticator: OidcTaskAuthenticator,
        key: _Key,
        certs: tuple[str, _CertsScript],
        cache_control: str | None,
        fetches: int,
    ) -> None:
        # Issue 24: every worker call fetched Google's certificates.
        certs[1].cache_control = cache_control
        for _ in range(3):
            authenticator.authenticate(_bearer(_token(key.signer)))
        assert len(certs[1].hits) == fetches


class TestRejected:
    @pytest.mark.parametrize(
        "overrides",
        [
            {"iat": -7200, "exp": -3600},
            {"iat": 600, "exp": 4200},
            {"aud": "https://elsewhere.example.test/worker"},
            {"iss": "https://evil.example.test"},
            {"iss": None},
        ],
        ids=["expired", "issued-in-the-future", "wrong-audience", "wrong-issuer", "no-issuer"],
    )
    def test_a_bad_claim_is_401(
        self, authenticator: OidcTaskAuthenticator, key: _Key, overrides: dict[str, Any]
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(_token(key.signer, **overrides)))
        assert caught.value.status == 401

    @pytest.mark.parametrize(
        "overrides",
        [
            {"email": "someone-else@project.iam.gserviceaccount.com"},
            {"email": None},
            {"email_verified": False},
            {"email_verified": "true"},
        ],
        ids=["wrong-email", "no-email", "email-unverified", "email-verified-as-text"],
    )
    def test_another_identity_is_403(
        self, authenticator: OidcTaskAuthenticator, key: _Key, overrides: dict[str, Any]
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(_token(key.signer, **overrides)))
        assert caught.value.status == 403

    def test_a_token_signed_by_another_key_is_401(
        self, authenticator: OidcTaskAuthenticator, stranger_key: _Key
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(_token(stranger_key.signer)))
        assert caught.value.status == 401

    def test_a_kid_not_in_the_certs_is_401(
        self, authenticator: OidcTaskAuthenticator, key: _Key
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(_token(key.signer, key_id="unknown-key")))
        assert caught.value.status == 401

    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"authorization": ""},
            {"authorization": "Bearer"},
            {"authorization": "Bearer   "},
            {"authorization": "Basic dXNlcjpwYXNz"},
            {"authorization": "not-a-jwt"},
            {"authorization": "Bearer not-a-jwt"},
            {"authorization": "Bearer a.b.c"},
            {"authorization": "Bearer !!!.@@@.###"},
        ],
        ids=[
            "missing",
            "empty",
            "scheme-only",
            "blank-token",
            "basic-scheme",
            "no-scheme",
            "garbage",
            "garbage-segments",
            "not-base64",
        ],
    )
    def test_a_missing_or_malformed_header_is_401(
        self, authenticator: OidcTaskAuthenticator, headers: dict[str, str]
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(headers)
        assert caught.value.status == 401

    def test_the_token_stays_out_of_the_error(self, authenticator: OidcTaskAuthenticator) -> None:
        token = "secret-looking-token-value"
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(token))
        assert token not in str(caught.value)
        assert caught.value.__cause__ is None
        assert caught.value.__suppress_context__


class TestCertificatesUnavailable:
    def test_a_server_that_is_down_is_transient(self, key: _Key) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        authenticator = OidcTaskAuthenticator(
            audience=AUDIENCE,
            service_account_email=ACCOUNT,
            certs_url=f"http://127.0.0.1:{port}/oauth2/v1/certs",
        )
        with pytest.raises(Transient):
            authenticator.authenticate(_bearer(_token(key.signer)))

    @pytest.mark.parametrize(
        ("status", "body"),
        [(503, b"unavailable"), (200, b"<html>not json</html>")],
        ids=["server-error", "not-json"],
    )
    def test_a_bad_certificate_answer_is_transient(
        self,
        authenticator: OidcTaskAuthenticator,
        key: _Key,
        certs: tuple[str, _CertsScript],
        status: int,
        body: bytes,
    ) -> None:
        certs[1].status, certs[1].body = status, body
        with pytest.raises(Transient):
            authenticator.authenticate(_bearer(_token(key.signer)))


def _stripped(token: str) -> str:
    """The token as Cloud Run's IAM check forwards it: verified, signature replaced."""
    header, payload, _ = token.split(".")
    return f"{header}.{payload}.SIGNATURE_REMOVED_BY_GOOGLE"


class TestBehindCloudRunIam:
    """Cloud Run verifies the invoker's token and strips its signature before the worker."""

    @pytest.fixture
    def behind_iam(self, certs: tuple[str, _CertsScript]) -> OidcTaskAuthenticator:
        return OidcTaskAuthenticator(
            audience=AUDIENCE,
            service_account_email=ACCOUNT,
            certs_url=certs[0],
            platform_verifies_signature=True,
        )

    def test_a_stripped_token_is_accepted_on_its_claims(
        self, behind_iam: OidcTaskAuthenticator, key: _Key, certs: tuple[str, _CertsScript]
    ) -> None:
        behind_iam.authenticate(_bearer(_stripped(_token(key.signer))))
        assert certs[1].hits == []  # nothing to verify: the platform did

    def test_a_stripped_token_is_refused_unless_configured(
        self, authenticator: OidcTaskAuthenticator, key: _Key
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            authenticator.authenticate(_bearer(_stripped(_token(key.signer))))
        assert caught.value.status == 401

    @pytest.mark.parametrize(
        ("overrides", "status"),
        [
            ({"aud": "https://elsewhere.example.test/worker"}, 401),
            ({"iat": -7200, "exp": -3600}, 401),
            ({"aud": None}, 401),
            ({"iss": "https://evil.example.test"}, 401),
            ({"email": "someone-else@project.iam.gserviceaccount.com"}, 403),
            ({"email_verified": False}, 403),
        ],
        ids=["audience", "expired", "no-audience", "issuer", "email", "unverified"],
    )
    def test_the_claims_of_a_stripped_token_are_still_checked(
        self,
        behind_iam: OidcTaskAuthenticator,
        key: _Key,
        overrides: dict[str, Any],
        status: int,
    ) -> None:
        with pytest.raises(Unauthorized) as caught:
            behind_iam.authenticate(_bearer(_stripped(_token(key.signer, **overrides))))
        assert caught.value.status == status

    def test_a_signed_token_is_still_fully_verified(
        self, behind_iam: OidcTaskAuthenticator, stranger_key: _Key
    ) -> None:
        with pytest.raises(Unauthorized):
            behind_iam.authenticate(_bearer(_token(stranger_key.signer, key_id=KID)))

    def test_a_garbage_payload_is_refused(self, behind_iam: OidcTaskAuthenticator) -> None:
        with pytest.raises(Unauthorized):
            behind_iam.authenticate(_bearer("a.%%%.SIGNATURE_REMOVED_BY_GOOGLE"))
