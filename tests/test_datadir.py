"""The data directory of ``looprelay up`` is kept like ``~/.ssh`` (issue 13): it holds comment
bodies from private repositories, so nobody but its owner may reach it or its files.

Real directories, real SQLite files opened through the config's own adapters, under the usual
umask 022, so a file left to the defaults would come out 0644.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.app.adapters import open_queue, open_stores
from looprelay.config.model import Config, load_config
from looprelay.config.secrets import webhook_secrets_from_env
from looprelay.core.model import DeliveryRecord
from looprelay.datadir import (
    LOCK_FILE,
    QUEUE_FILE,
    STORE_FILE,
    WEBHOOK_SECRET_FILE,
    WORKER_TOKEN_FILE,
    ensure_data_dir,
    lock_data_dir,
    read_or_create_secret,
)
from looprelay.errors import ConfigError
from looprelay.ports import Task
from tests.routing.conftest import NOW

NOBODY = 65534
"""A uid that is not the test's (the ``nobody`` account on Debian)."""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The umask most shells start with; with it, files left to the defaults are 0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    """The operator's config as ``looprelay up`` loads it: store and queue in the data dir."""
    path = tmp_path / "looprelay.yaml"
    path.write_text("routing:\n  authorizedUsers: [octocat]\n", encoding="utf-8")
    return load_config(path, environ={})


class TestTheDirectory:
    def test_an_existing_755_directory_becomes_700_and_every_file_in_it_0600(
        self, tmp_path: Path, config: Config, caplog: pytest.LogCaptureFixture
    ) -> None:
        data = tmp_path / "data"
        data.mkdir()
        data.chmod(0o755)

        with caplog.at_level(logging.WARNING, logger="looprelay.files"):
            assert ensure_data_dir(data) == data
        lock = lock_data_dir(data)
        read_or_create_secret(data / WEBHOOK_SECRET_FILE)
        read_or_create_secret(data / WORKER_TOKEN_FILE)
        stores = open_stores(config, data_dir=data)
        queue = open_queue(config, data_dir=data)
        assert isinstance(queue, SqliteQueue)
        try:
            # A comment body on disk in each database, the queue's through its writer process.
            stores.store.begin_delivery(
                DeliveryRecord(
                    delivery_id="d-1", event="issue_comment", received_at=NOW, envelope="{...}"
                )
            )
            assert queue.enqueue(Task(name="d-1", body=b'{"comment": "private words"}'))
            files = {path.name: _mode(path) for path in data.iterdir()}
        finally:
            queue.close()
            stores.close()
            lock.close()

        assert _mode(data) == 0o700
        expected = {
            STORE_FILE,
            f"{STORE_FILE}-wal",
            f"{STORE_FILE}-shm",
            QUEUE_FILE,
            f"{QUEUE_FILE}-wal",
            f"{QUEUE_FILE}-shm",
            LOCK_FILE,
            WEBHOOK_SECRET_FILE,
            WORKER_TOKEN_FILE,
        }
        assert expected <= files.keys()
        assert {name: mode for name, mode in files.items() if mode != 0o600} == {}
        [warning] = [r.getMessage() for r in caplog.records]
        assert str(data) in warning and "mode 755" in warning and "now 700" in warning

    def test_a_missing_directory_is_created_700_with_its_parents(self, tmp_path: Path) -> None:
        data = ensure_data_dir(tmp_path / "state" / "looprelay")
        assert _mode(data) == 0o700

    def test_a_private_directory_is_left_alone_without_a_warning(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        data = tmp_path / "data"
        data.mkdir(mode=0o700)
        with caplog.at_level(logging.WARNING, logger="looprelay.files"):
            ensure_data_dir(data)
        assert _mode(data) == 0o700
        assert caplog.records == []

    def test_another_users_directory_is_refused_in_one_line(self, tmp_path: Path) -> None:
        other = _another_users_directory(tmp_path)
        mode_before = _mode(other)

        with pytest.raises(ConfigError) as refused:
            ensure_data_dir(other)

        message = str(refused.value)
        assert "\n" not in message
        assert str(other) in message and "not to this user" in message
        assert _mode(other) == mode_before

    def test_a_file_where_the_directory_should_be_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "data"
        path.write_text("not a directory", encoding="utf-8")
        with pytest.raises(ConfigError, match="is not a directory; pass a directory"):
            ensure_data_dir(path)


def _another_users_directory(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        other = tmp_path / "someone-elses"
        other.mkdir(mode=0o755)
        os.chown(other, NOBODY, NOBODY)
        return other
    # Not root: the root directory is someone else's, and the refusal comes before any chmod.
    other = Path("/")
    assert other.stat().st_uid != os.geteuid()
    return other


class TestDatabaseFiles:
    def test_a_database_left_0644_by_an_older_version_is_made_private_on_open(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        path = tmp_path / "looprelay.db"
        SqliteStore(path).close()
        for each in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            each.touch()
            each.chmod(0o644)

        with caplog.at_level(logging.WARNING, logger="looprelay.files"):
            SqliteStore(path).close()

        assert _mode(path) == 0o600
        assert all(
            _mode(Path(f"{path}{suffix}")) == 0o600
            for suffix in ("-wal", "-shm")
            if Path(f"{path}{suffix}").exists()
        )
        assert any("now 600" in r.getMessage() for r in caplog.records)

    def test_a_configured_store_path_outside_the_data_directory_is_private_too(
        self, tmp_path: Path
    ) -> None:
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        path = tmp_path / "looprelay.yaml"
        path.write_text(f"store:\n  sqlite:\n    path: {shared / 'store.db'}\n", encoding="utf-8")
        stores = open_stores(load_config(path, environ={}), data_dir=None)
        stores.close()

        assert {p.name: _mode(p) for p in shared.iterdir() if _mode(p) != 0o600} == {}


class TestWeakSecrets:
    @pytest.mark.parametrize(
        ("secret", "warned"),
        [("short-secret", True), ("x" * 15, True), ("x" * 16, False), ("a1" * 32, False)],
    )
    def test_a_webhook_secret_under_128_bits_is_warned_about_once_at_start(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture, secret: str, warned: bool
    ) -> None:
        path = tmp_path / "looprelay.yaml"
        path.write_text("github:\n  webhookSecrets: [HOOK_SECRET]\n", encoding="utf-8")
        config = load_config(path, environ={})

        with caplog.at_level(logging.WARNING, logger="looprelay.datadir"):
            secrets = webhook_secrets_from_env(config.github, {"HOOK_SECRET": secret})

        assert secrets == [secret.encode()]
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == int(warned)
        if warned:
            assert "HOOK_SECRET" in messages[0] and "under 128 bits" in messages[0]
            assert secret not in messages[0]

    def test_an_operators_short_secret_file_is_warned_about_and_a_generated_one_is_not(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        short = tmp_path / WEBHOOK_SECRET_FILE
        fd = os.open(short, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"hunter2\n")
        os.close(fd)

        with caplog.at_level(logging.WARNING, logger="looprelay.datadir"):
            assert read_or_create_secret(short) == ("hunter2", False)
            generated, created = read_or_create_secret(tmp_path / WORKER_TOKEN_FILE)
            read_or_create_secret(tmp_path / WORKER_TOKEN_FILE)

        assert created and len(generated) == 64
        [warning] = [r.getMessage() for r in caplog.records]
        assert str(short) in warning and "7 bytes" in warning and "hunter2" not in warning
