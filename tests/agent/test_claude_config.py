"""Claude's files prepared before a spawn: folder trust, the bypass disclaimer, session ids.

Real files throughout; the concurrent writers are real threads and processes. One class runs the
real, pinned Claude Code binary in tmux (the tests.claude_cli plugin).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent import json_merge
from looprelay.agent.claude_config import (
    accept_bypass_permissions,
    claude_config_file,
    claude_dir,
    claude_settings_file,
    prepare_claude,
    session_id_in_use,
    trust_directory,
    wants_bypass_permissions,
)
from looprelay.agent.tmux import TmuxTerminal
from looprelay.errors import RunnerError
from tests.agent.conftest import SESSION
from tests.claude_cli import ClaudeHome, UserMessage, screen, wait_for_message

TRUSTED = {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}
PROCESS_DEADLINE_SECONDS = 60.0


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _dirs(root: Path, count: int, prefix: str = "work") -> list[Path]:
    made = [root / f"{prefix}-{index}" for index in range(count)]
    for directory in made:
        directory.mkdir(parents=True)
    return made


def _leftovers(directory: Path) -> list[str]:
    """Temp files and lock directories a merge must not leave behind (its flock file stays)."""
    return sorted(entry.name for entry in directory.iterdir() if entry.suffix in (".tmp", ".lock"))


class TestWhereClaudeReads:
    def test_home_by_default(self, tmp_path: Path) -> None:
        env = {"HOME": str(tmp_path)}
        assert claude_config_file(env) == tmp_path / ".claude.json"
        assert claude_dir(env) == tmp_path / ".claude"
        assert claude_settings_file(env) == tmp_path / ".claude" / "settings.json"

    def test_claude_config_dir_moves_all_three(self, tmp_path: Path) -> None:
        env = {"HOME": str(tmp_path / "home"), "CLAUDE_CONFIG_DIR": str(tmp_path / "cfg")}
        assert claude_config_file(env) == tmp_path / "cfg" / ".claude.json"
        assert claude_dir(env) == tmp_path / "cfg"
        assert claude_settings_file(env) == tmp_path / "cfg" / "settings.json"

    def test_an_empty_claude_config_dir_counts_as_unset(self, tmp_path: Path) -> None:
        env = {"HOME": str(tmp_path), "CLAUDE_CONFIG_DIR": ""}
        assert claude_config_file(env) == tmp_path / ".claude.json"

    @pytest.mark.parametrize("with_config_dir", [False, True])
    def test_a_non_empty_legacy_config_wins(self, tmp_path: Path, with_config_dir: bool) -> None:
        env = {"HOME": str(tmp_path)}
        if with_config_dir:
            env["CLAUDE_CONFIG_DIR"] = str(tmp_path / "cfg")
        legacy = claude_dir(env) / ".config.json"
        legacy.parent.mkdir(parents=True)
        legacy.write_text('{"hasCompletedOnboarding": true}')
        claude_config_file(env).write_text("{}")
        assert claude_config_file(env) == legacy

    def test_an_empty_legacy_config_loses_to_an_existing_main_one(self, tmp_path: Path) -> None:
        env = {"HOME": str(tmp_path)}
        (tmp_path / ".claude").mkdir()
        (tmp_path / ".claude" / ".config.json").write_text("")
        assert claude_config_file(env) == tmp_path / ".claude" / ".config.json"
        (tmp_path / ".claude.json").write_text("{}")
        assert claude_config_file(env) == tmp_path / ".claude.json"


class TestTrustDirectory:
    def test_a_missing_file_is_created_private(self, tmp_path: Path) -> None:
        config, work = tmp_path / "cfg" / ".claude.json", _dirs(tmp_path, 1)[0]
        changes = trust_directory(work, config_file=config)
        assert changes == [
            f"projects[{work}].hasTrustDialogAccepted",
            f"projects[{work}].hasCompletedProjectOnboarding",
        ]
        assert _load(config) == {"projects": {str(work): TRUSTED}}
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        assert _leftovers(config.parent) == []

    def test_the_key_is_the_real_path(self, tmp_path: Path) -> None:
        config, real = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        (tmp_path / "link").symlink_to(real)
        trust_directory(tmp_path / "link" / ".", config_file=config)
        assert list(_load(config)["projects"]) == [str(real)]

    def test_unrelated_keys_other_projects_and_their_order_are_kept(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        before = {
            "numStartups": 3,
            "projects": {
                "/elsewhere": {"allowedTools": ["Bash"], "hasTrustDialogAccepted": False},
                str(work): {"history": ["x"], "hasTrustDialogAccepted": False},
            },
            "userID": "abc",
            "nested": {"é": [1, 2.5, None]},
        }
        config.write_text(json.dumps(before, indent=2))
        changes = trust_directory(work, config_file=config)
        after = _load(config)
        assert changes == [
            f"projects[{work}].hasTrustDialogAccepted",
            f"projects[{work}].hasCompletedProjectOnboarding",
        ]
        assert list(after) == list(before)
        assert list(after["projects"]) == ["/elsewhere", str(work)]
        assert after["projects"]["/elsewhere"] == before["projects"]["/elsewhere"]
        assert after["projects"][str(work)] == {"history": ["x"], **TRUSTED}
        assert {k: v for k, v in after.items() if k != "projects"} == {
            k: v for k, v in before.items() if k != "projects"
        }

    def test_only_the_missing_key_is_reported(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text(json.dumps({"projects": {str(work): {"hasTrustDialogAccepted": True}}}))
        assert trust_directory(work, config_file=config) == [
            f"projects[{work}].hasCompletedProjectOnboarding"
        ]

    def test_a_second_call_changes_nothing_and_does_not_write(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        trust_directory(work, config_file=config)
        before, raw = config.stat(), config.read_bytes()
        assert trust_directory(work, config_file=config) == []
        after = config.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
        assert config.read_bytes() == raw

    def test_the_file_mode_is_kept(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text("{}")
        config.chmod(0o640)
        trust_directory(work, config_file=config)
        assert stat.S_IMODE(config.stat().st_mode) == 0o640

    def test_a_symlinked_config_is_written_at_its_target(self, tmp_path: Path) -> None:
        target, config = tmp_path / "dotfiles" / "claude.json", tmp_path / ".claude.json"
        target.parent.mkdir()
        target.write_text('{"keep": 1}')
        config.symlink_to(target)
        work = _dirs(tmp_path, 1)[0]
        trust_directory(work, config_file=config)
        assert config.is_symlink()
        assert _load(target) == {"keep": 1, "projects": {str(work): TRUSTED}}

    @pytest.mark.parametrize(
        "content",
        [
            b'{"projects": {',
            b"",
            b"\xff\xfe not utf-8",
            b"[1, 2]",
            b'"a string"',
            b"null",
            b'{"projects": []}',
            b'{"projects": {"WORK": true}}',
        ],
        ids=[
            "truncated",
            "empty",
            "not-utf8",
            "array",
            "string",
            "null",
            "projects-not-object",
            "entry-not-object",
        ],
    )
    def test_a_file_that_is_not_a_json_object_is_left_untouched(
        self, tmp_path: Path, content: bytes
    ) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        content = content.replace(b"WORK", str(work).encode())
        config.write_bytes(content)
        config.chmod(0o644)
        before = config.stat()
        with pytest.raises(RunnerError) as caught:
            trust_directory(work, config_file=config)
        assert caught.value.reason == "trust-failed"
        assert str(config) in str(caught.value)
        assert "untouched" in str(caught.value)
        assert config.read_bytes() == content
        after = config.stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_mode) == (
            before.st_ino,
            before.st_mtime_ns,
            before.st_mode,
        )
        assert _leftovers(tmp_path) == []

    def test_a_directory_where_the_file_should_be_is_refused(self, tmp_path: Path) -> None:
        config = tmp_path / ".claude.json"
        config.mkdir()
        with pytest.raises(RunnerError, match="not a regular file") as caught:
            trust_directory(tmp_path, config_file=config)
        assert caught.value.reason == "trust-failed"


class TestClaudesLock:
    def test_waits_for_a_held_lock_and_keeps_what_its_holder_wrote(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text('{"a": 1}')
        lock = tmp_path / ".claude.json.lock"
        lock.mkdir()

        def holder() -> None:  # what Claude does under its lock: rewrite, then release
            time.sleep(0.5)
            temp = tmp_path / "claude-temp"
            temp.write_text('{"a": 1, "claudeWrote": true}')
            os.replace(temp, config)
            lock.rmdir()

        thread = threading.Thread(target=holder)
        thread.start()
        trust_directory(work, config_file=config)
        thread.join()
        assert _load(config) == {"a": 1, "claudeWrote": True, "projects": {str(work): TRUSTED}}
        assert not lock.exists()

    def test_an_abandoned_lock_is_taken_over(self, tmp_path: Path) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        lock = tmp_path / ".claude.json.lock"
        lock.mkdir()
        old = time.time() - json_merge.PEER_LOCK_STALE_SECONDS - 5
        os.utime(lock, (old, old))
        started = time.monotonic()
        trust_directory(work, config_file=config)
        assert time.monotonic() - started < json_merge.PEER_LOCK_STALE_SECONDS
        assert _load(config) == {"projects": {str(work): TRUSTED}}
        assert not lock.exists()

    @pytest.mark.parametrize("stale", [False, True], ids=["live", "stale-but-not-removable"])
    def test_a_lock_that_stays_is_given_up_on_with_the_file_untouched(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stale: bool
    ) -> None:
        monkeypatch.setattr(json_merge, "LOCK_WAIT_SECONDS", 0.5)
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text('{"a": 1}')
        lock = tmp_path / ".claude.json.lock"
        lock.mkdir()
        (lock / "not-empty").write_text("")
        if stale:
            old = time.time() - json_merge.PEER_LOCK_STALE_SECONDS - 5
            os.utime(lock, (old, old))
        with pytest.raises(RunnerError, match="stays held") as caught:
            trust_directory(work, config_file=config)
        assert caught.value.reason == "trust-failed"
        assert str(lock) in str(caught.value)
        assert config.read_text() == '{"a": 1}'
        assert lock.is_dir()


class TestWritersThatTakeNoLock:
    """A writer that lands between the read and the replace (simulated at that exact point)."""

    @staticmethod
    def _interfere(
        monkeypatch: pytest.MonkeyPatch, rewrite: Callable[[Path], None], times: int
    ) -> list[int]:
        calls: list[int] = []
        real = json_merge._replace_if_unchanged

        def replace(path: Path, *args: Any) -> bool:
            calls.append(1)
            if len(calls) <= times:
                rewrite(path)
            return real(path, *args)

        monkeypatch.setattr(json_merge, "_replace_if_unchanged", replace)
        return calls

    def test_a_replaced_file_is_merged_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text('{"a": 1}')

        def rewrite(path: Path) -> None:
            temp = path.with_name("other-writer")
            temp.write_text('{"a": 1, "otherWriter": [1, 2]}')
            os.replace(temp, path)

        calls = self._interfere(monkeypatch, rewrite, times=1)
        trust_directory(work, config_file=config)
        assert len(calls) == 2
        assert _load(config) == {"a": 1, "otherWriter": [1, 2], "projects": {str(work): TRUSTED}}

    def test_a_same_size_rewrite_in_place_is_seen(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text('{"a": 1}')
        mtime = config.stat().st_mtime_ns

        def rewrite(path: Path) -> None:  # same inode, same size, the old mtime put back
            with open(path, "r+b") as handle:
                handle.write(b'{"a": 2}')
            os.utime(path, ns=(mtime, mtime))

        self._interfere(monkeypatch, rewrite, times=1)
        trust_directory(work, config_file=config)
        assert _load(config) == {"a": 2, "projects": {str(work): TRUSTED}}

    def test_a_file_that_keeps_changing_is_given_up_on_untouched(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        config, work = tmp_path / ".claude.json", _dirs(tmp_path, 1)[0]
        config.write_text('{"n": 0}')

        def rewrite(path: Path) -> None:
            path.write_text(json.dumps({"n": _load(path)["n"] + 1}))

        calls = self._interfere(monkeypatch, rewrite, times=1_000)
        with pytest.raises(RunnerError, match="kept changing") as caught:
            trust_directory(work, config_file=config)
        assert caught.value.reason == "trust-failed"
        assert len(calls) == json_merge.MERGE_ROUNDS
        assert _load(config) == {"n": json_merge.MERGE_ROUNDS}
        assert _leftovers(tmp_path) == []


_TRUST_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from looprelay.agent.claude_config import trust_directory
    config = Path(sys.argv[1])
    for directory in sys.argv[2:]:
        trust_directory(Path(directory), config_file=config)
    """
)

_CLAUDE_LIKE_WRITER = textwrap.dedent(
    """
    # Writes as Claude does: under the mkdir lock, re-read, add one key, atomic replace.
    import json, os, sys, time
    path, count = sys.argv[1], int(sys.argv[2])
    lock = path + ".lock"
    for index in range(count):
        give_up = time.monotonic() + 30  # waits on the lock's release, never for good
        while True:
            try:
                os.mkdir(lock)
                break
            except FileExistsError:
                if time.monotonic() > give_up:
                    raise SystemExit("the lock was never released")
                time.sleep(0.001)
        try:
            try:
                with open(path) as handle:
                    data = json.load(handle)
            except FileNotFoundError:
                data = {}
            data[f"claudeKey{index}"] = index
            with open(path + ".claude-tmp", "w") as handle:
                json.dump(data, handle)
            os.replace(path + ".claude-tmp", path)
        finally:
            os.rmdir(lock)
    """
)


def _python(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", script, *args], stderr=subprocess.PIPE)


def _finish(processes: list[subprocess.Popen[bytes]]) -> None:
    try:
        for process in processes:
            _, stderr = process.communicate(timeout=PROCESS_DEADLINE_SECONDS)
            assert process.returncode == 0, stderr.decode()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


class TestConcurrentWriters:
    def test_threads_trusting_different_directories_all_land(self, tmp_path: Path) -> None:
        config, works = tmp_path / ".claude.json", _dirs(tmp_path, 16)
        barrier, errors = threading.Barrier(8), []

        def trust(mine: list[Path]) -> None:
            barrier.wait()
            try:
                for work in mine:
                    trust_directory(work, config_file=config)
            except RunnerError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=trust, args=(works[i::8],)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(PROCESS_DEADLINE_SECONDS)
        assert errors == []
        assert _load(config)["projects"] == {str(work): TRUSTED for work in works}

    def test_processes_and_a_claude_like_writer_lose_nothing(self, tmp_path: Path) -> None:
        config = tmp_path / ".claude.json"
        config.write_text('{"userID": "u"}')
        groups = [_dirs(tmp_path, 5, prefix=f"p{index}") for index in range(4)]
        processes = [_python(_CLAUDE_LIKE_WRITER, str(config), "60")]
        processes += [_python(_TRUST_SCRIPT, str(config), *map(str, group)) for group in groups]
        _finish(processes)
        data = _load(config)
        assert data["userID"] == "u"
        assert set(data["projects"]) == {str(work) for group in groups for work in group}
        assert all(entry == TRUSTED for entry in data["projects"].values())
        assert {key for key in data if key.startswith("claudeKey")} == {
            f"claudeKey{index}" for index in range(60)
        }
        assert not (tmp_path / ".claude.json.lock").exists()


class TestBypassPermissions:
    @pytest.mark.parametrize(
        ("args", "wanted"),
        [
            ([], False),
            (["--model", "opus"], False),
            (["--dangerously-skip-permissions"], True),
            (["--model", "opus", "--dangerously-skip-permissions"], True),
            (["--permission-mode", "bypassPermissions"], True),
            (["--permission-mode=bypassPermissions"], True),
            (["--permission-mode", "acceptEdits"], False),
            (["--permission-mode=plan"], False),
            (["--permission-mode", "bypassPermissions", "--permission-mode", "plan"], False),
            (["--permission-mode=plan", "--permission-mode", "bypassPermissions"], True),
            (["--permission-mode"], False),
            (["--allow-dangerously-skip-permissions"], False),
        ],
    )
    def test_which_argv_asks_for_it(self, args: list[str], wanted: bool) -> None:
        assert wants_bypass_permissions(args) is wanted

    def test_not_accepted_unless_asked(self, tmp_path: Path) -> None:
        env, work = {"HOME": str(tmp_path)}, _dirs(tmp_path, 1)[0]
        changes = prepare_claude(work, harness_args=["--model", "opus"], environ=env)
        assert len(changes) == 2
        assert not claude_settings_file(env).exists()
        assert "bypassPermissionsModeAccepted" not in _load(claude_config_file(env))

    @pytest.mark.parametrize(
        "args",
        [
            ["--dangerously-skip-permissions"],
            ["--permission-mode", "bypassPermissions"],
            ["--permission-mode=bypassPermissions"],
        ],
    )
    def test_accepted_when_asked_then_left_alone(self, tmp_path: Path, args: list[str]) -> None:
        env, work = {"HOME": str(tmp_path)}, _dirs(tmp_path, 1)[0]
        changes = prepare_claude(work, harness_args=args, environ=env)
        assert changes[2:] == ["skipDangerousModePermissionPrompt", "bypassPermissionsModeAccepted"]
        assert _load(claude_settings_file(env)) == {"skipDangerousModePermissionPrompt": True}
        assert _load(claude_config_file(env))["bypassPermissionsModeAccepted"] is True
        stamps = [
            (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (claude_settings_file(env), claude_config_file(env))
        ]
        assert prepare_claude(work, harness_args=args, environ=env) == []
        assert stamps == [
            (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (claude_settings_file(env), claude_config_file(env))
        ]

    def test_the_legacy_key_is_not_written_once_settings_have_it(self, tmp_path: Path) -> None:
        # Claude 2.1.x moves the legacy key into settings.json and deletes it; putting it back
        # on every spawn would rewrite the config each time.
        settings, config = tmp_path / "settings.json", tmp_path / ".claude.json"
        settings.write_text('{"theme": "dark", "skipDangerousModePermissionPrompt": true}')
        assert accept_bypass_permissions(config_file=config, settings_file=settings) == []
        assert not config.exists()

    def test_an_unparseable_settings_file_is_left_untouched(self, tmp_path: Path) -> None:
        settings, config = tmp_path / "settings.json", tmp_path / ".claude.json"
        settings.write_text("{ // comments are not JSON\n}")
        with pytest.raises(RunnerError) as caught:
            accept_bypass_permissions(config_file=config, settings_file=settings)
        assert caught.value.reason == "trust-failed"
        assert settings.read_text() == "{ // comments are not JSON\n}"
        assert not config.exists()


class TestSessionIdInUse:
    SESSION = "0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11"

    def test_no_claude_state_means_free(self, tmp_path: Path) -> None:
        assert session_id_in_use(self.SESSION, environ={"HOME": str(tmp_path)}) is False

    @pytest.mark.parametrize("with_config_dir", [False, True])
    def test_a_transcript_in_any_project_means_in_use(
        self, tmp_path: Path, with_config_dir: bool
    ) -> None:
        env = {"HOME": str(tmp_path)}
        if with_config_dir:
            env["CLAUDE_CONFIG_DIR"] = str(tmp_path / "cfg")
        project = claude_dir(env) / "projects" / "-somewhere-else"
        project.mkdir(parents=True)
        (project / f"{self.SESSION}.jsonl").write_text('{"type":"user"}\n')
        assert session_id_in_use(self.SESSION, environ=env) is True
        assert session_id_in_use(str(uuid.uuid4()), environ=env) is False

    @pytest.mark.parametrize("bad", ["*", "../x", "0B9D6F4E-3A53-4D7C-9A55-2F0F6F4B1C11", ""])
    def test_an_id_that_is_not_a_uuid_is_refused(self, tmp_path: Path, bad: str) -> None:
        with pytest.raises(RunnerError) as caught:
            session_id_in_use(bad, environ={"HOME": str(tmp_path)})
        assert caught.value.reason == "invalid-session-id"


class TestRealClaude:
    """Prepared by prepare_claude, the real binary in tmux submits its prompt at once (in an
    unprepared folder it stops at the trust dialog: tests/agent/test_real_claude.py)."""

    @pytest.mark.parametrize(
        "args", [[], ["--dangerously-skip-permissions"]], ids=["plain", "bypass"]
    )
    def test_after_preparation_the_prompt_reaches_the_transcript(
        self, terminal: TmuxTerminal, claude_home: ClaudeHome, tmp_path: Path, args: list[str]
    ) -> None:
        work, environ = _dirs(tmp_path, 1)[0], {"HOME": str(claude_home.home)}
        session, prompt = str(uuid.uuid4()), f"looprelay trust check {uuid.uuid4().hex[:8]}"
        changes = prepare_claude(work, harness_args=args, environ=environ)
        assert changes[:2] == [
            f"projects[{work}].hasTrustDialogAccepted",
            f"projects[{work}].hasCompletedProjectOnboarding",
        ]
        argv = claude_home.command(*args, "--session-id", session, prompt)
        terminal.spawn(SESSION, cwd=work, argv=argv)
        message = wait_for_message(
            claude_home.home,
            lambda message: message.session_id == session,
            explain=lambda: screen(terminal, SESSION),
        )
        assert message == UserMessage(cwd=str(work), session_id=session, text=prompt)
        assert session_id_in_use(session, environ=environ) is True
