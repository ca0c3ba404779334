"""Pytest plugin: Google's Cloud Firestore emulator for the session, a clean store per test.

The emulator is the jar of the ``google-cloud-cli-firestore-emulator`` Debian package, run with
java directly (the wrapper script's bash parent exits before the JVM does). Set
``FIRESTORE_EMULATOR_HOST`` to use an emulator that is already running instead. When the jar
or java is missing the Firestore tests skip, unless ``LOOPRELAY_REQUIRE_FIRESTORE=1`` (CI),
where they fail.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from google.cloud import firestore

from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore

PROJECT = "demo-looprelay"
EMULATOR_PACKAGE = "google-cloud-cli-firestore-emulator"
KNOWN_JAR = Path(
    "/usr/lib/google-cloud-sdk/platform/cloud-firestore-emulator/cloud-firestore-emulator.jar"
)
MAIN_CLASS = "com.google.cloud.datastore.emulator.firestore.CloudFirestore"
START_DEADLINE_SECONDS = 30.0
STOP_DEADLINE_SECONDS = 10.0
WIPE_DEADLINE_SECONDS = 60.0
"""Longest one wipe of the emulator's data may take before the test errors."""
REQUIRE_ENV = "LOOPRELAY_REQUIRE_FIRESTORE"


def _find_jar() -> Path | None:
    if shutil.which("dpkg"):
        listing = subprocess.run(
            ["dpkg", "-L", EMULATOR_PACKAGE], capture_output=True, text=True, check=False
        ).stdout
        for line in listing.splitlines():
            if line.endswith("/cloud-firestore-emulator.jar") and Path(line).is_file():
                return Path(line)
    return KNOWN_JAR if KNOWN_JAR.is_file() else None


def _unavailable(what: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {what}; the Firestore contract cannot run", pytrace=False)
    pytest.skip(f"Firestore emulator tests skipped: {what} (set {REQUIRE_ENV}=1 to fail)")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


WIPE_DEADLINE_SECONDS = 60.0
"""A wipe waits for the emulator's JVM, which a loaded 2-core machine can stall for seconds."""


def _request(host: str, method: str, path: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(host, timeout=timeout)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _wait_until_ready(host: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the Firestore emulator exited with {process.returncode} on start")
        with contextlib.suppress(OSError):  # refused while the JVM is still starting
            status, body = _request(host, "GET", "/")
            if status == 200 and body.strip() == b"Ok":
                return
        time.sleep(0.1)
    pytest.fail(f"the Firestore emulator at {host} was not ready in {START_DEADLINE_SECONDS} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    # start_new_session made the JVM its own process-group leader.
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_DEADLINE_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def firestore_emulator() -> Iterator[str]:
    """``host:port`` of a running Firestore emulator; FIRESTORE_EMULATOR_HOST is set to it."""
    running = os.environ.get("FIRESTORE_EMULATOR_HOST")
    if running:
        yield running
        return
    jar, java = _find_jar(), shutil.which("java")
    if jar is None:
        _unavailable(f"the emulator jar is in neither `dpkg -L {EMULATOR_PACKAGE}` nor {KNOWN_JAR}")
    if java is None:
        _unavailable("java is not on PATH (the emulator needs Java 11 or later)")
    port = _free_port()
    host = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            java,
            "-Duser.language=en",
            "-cp",
            str(jar),
            MAIN_CLASS,
            "--host=127.0.0.1",
            f"--port={port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_until_ready(host, process)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("FIRESTORE_EMULATOR_HOST", host)
            yield host
    finally:
        _stop(process)


@pytest.fixture
def firestore_client(firestore_emulator: str) -> Iterator[firestore.Client]:
    """A client on project ``demo-looprelay`` of the emulator, whose data is wiped first."""
    status, body = _request(
        firestore_emulator,
        "DELETE",
        f"/emulator/v1/projects/{PROJECT}/databases/(default)/documents",
        timeout=WIPE_DEADLINE_SECONDS,
    )
    assert status == 200, f"wiping the Firestore emulator failed: {status} {body!r}"
    client = firestore.Client(project=PROJECT)
    yield client
    client.close()


@pytest.fixture
def firestore_store(firestore_client: firestore.Client) -> FirestoreStore:
    """A fresh ``FirestoreStore`` on the emulator, with collections unique to the test."""
    return FirestoreStore(firestore_client, collection_prefix=f"t{uuid.uuid4().hex[:12]}_")


@pytest.fixture
def firestore_runner_registry(firestore_client: firestore.Client) -> FirestoreRunnerRegistry:
    """A fresh ``FirestoreRunnerRegistry`` on the emulator, with collections unique to the test."""
    return FirestoreRunnerRegistry(firestore_client, collection_prefix=f"t{uuid.uuid4().hex[:12]}_")


@pytest.fixture
def firestore_work_item_store(firestore_client: firestore.Client) -> FirestoreWorkItemStore:
    """A fresh ``FirestoreWorkItemStore`` on the emulator, with collections unique to the test."""
    return FirestoreWorkItemStore(firestore_client, collection_prefix=f"t{uuid.uuid4().hex[:12]}_")
