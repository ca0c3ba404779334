"""Registering a runner and reading its credentials: each mistake is one line saying the fix."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from looprelay.agent.credentials import Credentials, read_credentials, write_credentials
from looprelay.agent.register import register
from looprelay.errors import ConfigError


class _Refusing(BaseHTTPRequestHandler):
    """A server that refuses every registration with 400 and an empty JSON object."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        body = b"{}"
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def refusing_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _register(server: str) -> None:
    register(server=server, token="t", name="box", labels={}, version="0", capacity=1)


class TestRegister:
    @pytest.mark.parametrize("server", ["127.0.0.1:8484", "looprelay.example.com", "ftp://x"])
    def test_a_server_url_without_http_or_https_is_refused_before_any_call(
        self, server: str
    ) -> None:
        with pytest.raises(ConfigError, match="must be a URL like https://") as refused:
            _register(server)
        assert "\n" not in str(refused.value)

    def test_a_refusal_without_a_reason_still_says_what_happened(
        self, refusing_server: str
    ) -> None:
        with pytest.raises(ConfigError) as refused:
            _register(refusing_server)
        assert "(HTTP 400 with no reason given)" in str(refused.value)
        assert "check --server" in str(refused.value)


class TestCredentials:
    def test_a_file_missing_fields_names_them_in_one_line(self, tmp_path: Path) -> None:
        path = tmp_path / "runner.json"
        path.write_text(json.dumps({"server": "http://127.0.0.1:1", "name": "box"}))
        path.chmod(0o600)
        with pytest.raises(ConfigError) as refused:
            read_credentials(path)
        message = str(refused.value)
        assert "runner_id" in message and "secret" in message
        assert "register again" in message and "\n" not in message

    def test_a_file_that_is_not_json_says_so(self, tmp_path: Path) -> None:
        path = tmp_path / "runner.json"
        path.write_text("runner_id = r-1")
        path.chmod(0o600)
        with pytest.raises(ConfigError, match="is not JSON; register again"):
            read_credentials(path)

    def test_written_credentials_are_0600_whatever_temporary_was_left_beside_them(
        self, tmp_path: Path
    ) -> None:
        # Issue 24: a leftover runner.json.tmp of mode 0644 gave runner.json its mode, and
        # the agent then refused to read its own secret.
        path = tmp_path / "runner.json"
        leftover = tmp_path / "runner.json.tmp"
        leftover.write_text("left by a crash")
        leftover.chmod(0o644)
        credentials = Credentials(
            server="http://127.0.0.1:1", runner_id="r-1", secret="s", name="x"
        )
        write_credentials(path, credentials)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert read_credentials(path) == credentials
        assert leftover.read_text() == "left by a crash"  # never written through
        assert sorted(p.name for p in tmp_path.iterdir()) == ["runner.json", "runner.json.tmp"]
