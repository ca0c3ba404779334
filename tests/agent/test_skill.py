"""The loop's skill: its text, its install into a real git checkout, the CLI command, and the
one-line restatement the daemon prompt keeps (seed 001 R3.3, R3.4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from looprelay.agent.claude_config import prepare_claude
from looprelay.agent.skill import install_skill, skill_directory, skill_files
from looprelay.agent.tmux import TmuxTerminal
from looprelay.cli import cli
from looprelay.config.templates import EVENT_PROMPT, SPAWN_PROMPT, bundled_template
from looprelay.core.interaction import AGENT_COMMENT_MARKER, ARTIFACT_RULE, DIRECTIVES
from looprelay.core.render import PromptContext, render_prompt
from looprelay.errors import RunnerError
from tests.agent.conftest import SESSION
from tests.claude_cli import DEADLINE_SECONDS, ClaudeHome, read_attachments, screen
from tests.fake_harness import wait_until

ARTIFACTS = ("brainstorm.md", "requirements.md", "bugfix.md", "design.md", "tasks.md")
INSTALLED = (".gitignore", "SKILL.md", "reference/collaboration.md")


def _front_matter(text: str) -> tuple[dict[str, object], str]:
    match = re.fullmatch(r"---\n(.*?)\n---\n(.*)", text, re.DOTALL)
    assert match, "SKILL.md must open with YAML front matter between --- lines"
    return yaml.safe_load(match.group(1)), match.group(2)


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A real git checkout with one commit and its own ignore file."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "README.md").write_text("hello\n")
    (repo / ".gitignore").write_text("build/\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init")
    return repo


class TestSkillText:
    def test_front_matter_names_and_describes_the_skill(self) -> None:
        meta, _ = _front_matter(skill_files()["SKILL.md"].decode("utf-8"))
        assert meta["name"] == "looprelay"
        # Claude Code's limits: a lower-case, hyphenated name; a description up to 1024 chars.
        assert re.fullmatch(r"[a-z0-9-]{1,64}", str(meta["name"]))
        description = str(meta["description"])
        assert 0 < len(description) <= 1024
        assert "pull request" in description and "where to ask" in description

    def test_the_principles_carry_both_rules_and_point_to_the_reference(self) -> None:
        _, body = _front_matter(skill_files()["SKILL.md"].decode("utf-8"))
        for artifact in ARTIFACTS:
            assert f"`{artifact}`" in body
        assert "review\n   of the pull request that carries it" in body
        assert "commit and push it, open or update that pull request" in body
        assert "Never paste its contents into a comment on the work\n   item" in body
        assert "`work-item`" in body and "`cli`" in body
        assert "Silence is not consent" in body
        assert AGENT_COMMENT_MARKER in body
        assert "(reference/collaboration.md)" in body

    def test_the_reference_states_the_full_rules(self) -> None:
        text = skill_files()["reference/collaboration.md"].decode("utf-8")
        headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
        assert headings[1:6] == [
            "Where questions go",
            "`work-item` mode (the default)",
            "`cli` mode",
            "No mode named",
            "Silence is not consent",
        ]
        assert "Artifacts are reviewed on their pull request" in headings
        assert "A missing answer is never approval" in text
        assert f"```\n{AGENT_COMMENT_MARKER}\n```" in text
        for artifact in ARTIFACTS:
            assert f"`{artifact}`" in text
        assert "Commit the artifact, push the branch, and\n  open the pull request" in text
        assert "**Never paste an artifact's contents into a comment on the work item**" in text
        assert "It holds in `work-item` and `cli` mode alike." in text


class TestDaemonPromptRestatesTheArtifactRule:
    def test_the_restatement_is_one_line_naming_every_artifact(self) -> None:
        assert "\n" not in ARTIFACT_RULE
        for artifact in ARTIFACTS:
            assert artifact in ARTIFACT_RULE
        assert "pull-request review" in ARTIFACT_RULE

    @pytest.mark.parametrize("template", [SPAWN_PROMPT, EVENT_PROMPT])
    @pytest.mark.parametrize("mode", sorted(DIRECTIVES))
    def test_every_rendered_prompt_carries_it_once(self, template: str, mode: str) -> None:
        context = PromptContext(
            work_item="github:octo/repo#15",
            event="issue_comment",
            action="created",
            repository="octo/repo",
            delivery_id="d-1",
            interaction_directive=DIRECTIVES[mode],
            graph_context="",
            payload_excerpt="<untrusted>hi</untrusted>",
        )
        text = render_prompt(bundled_template(template), context, sandboxed=False)
        assert text.count(ARTIFACT_RULE) == 1


class TestInstall:
    def test_writes_the_skill_files_with_the_packaged_content(self, checkout: Path) -> None:
        written = install_skill(checkout)
        target = checkout / ".claude" / "skills" / "looprelay"
        assert written == [target / name for name in INSTALLED]
        assert skill_directory(checkout) == target
        for name, content in skill_files().items():
            assert (target / name).read_bytes() == content
        assert (target / ".gitignore").read_text() == "*\n"

    def test_git_status_stays_clean_and_the_repository_is_not_changed(self, checkout: Path) -> None:
        config_before = (checkout / ".git" / "config").read_bytes()
        exclude_before = (checkout / ".git" / "info" / "exclude").read_bytes()
        install_skill(checkout)
        assert _git(checkout, "status", "--porcelain", "--untracked-files=all") == ""
        assert (checkout / ".gitignore").read_text() == "build/\n"
        assert (checkout / ".git" / "config").read_bytes() == config_before
        assert (checkout / ".git" / "info" / "exclude").read_bytes() == exclude_before

    def test_a_tracked_claude_directory_keeps_its_files_and_status(self, checkout: Path) -> None:
        (checkout / ".claude").mkdir()
        (checkout / ".claude" / "settings.json").write_text("{}\n")
        _git(checkout, "add", ".claude")
        _git(checkout, "-c", "user.name=t", "-c", "user.email=t@e.com", "commit", "-qm", "c")
        install_skill(checkout)
        assert _git(checkout, "status", "--porcelain", "--untracked-files=all") == ""
        assert (checkout / ".claude" / "settings.json").read_text() == "{}\n"

    def test_a_second_install_rewrites_nothing(self, checkout: Path) -> None:
        install_skill(checkout)
        target = skill_directory(checkout)
        stamps = {name: (target / name).stat() for name in INSTALLED}
        assert install_skill(checkout) == []
        for name, before in stamps.items():
            after = (target / name).stat()
            assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    def test_only_a_changed_file_is_rewritten(self, checkout: Path) -> None:
        install_skill(checkout)
        skill_md = skill_directory(checkout) / "SKILL.md"
        skill_md.write_text("edited by hand\n")
        assert install_skill(checkout) == [skill_md]
        assert skill_md.read_bytes() == skill_files()["SKILL.md"]
        assert sorted(p.name for p in skill_md.parent.iterdir()) == [
            ".gitignore",
            "SKILL.md",
            "reference",
        ]

    def test_a_symlinked_directory_is_installed_at_its_target(
        self, checkout: Path, tmp_path: Path
    ) -> None:
        (tmp_path / "link").symlink_to(checkout)
        written = install_skill(tmp_path / "link")
        assert written[0].is_relative_to(checkout)
        assert (checkout / ".claude" / "skills" / "looprelay" / "SKILL.md").is_file()

    @pytest.mark.parametrize(
        "link",
        [
            ".claude",
            ".claude/skills",
            ".claude/skills/looprelay",
            ".claude/skills/looprelay/reference",
            ".claude/skills/looprelay/SKILL.md",
            ".claude/skills/looprelay/.gitignore",
        ],
    )
    def test_a_symlink_on_the_way_is_refused(
        self, checkout: Path, tmp_path: Path, link: str
    ) -> None:
        outside = tmp_path / "outside"
        outside.mkdir()
        path = checkout / link
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(outside / "target" if link.endswith(("SKILL.md", "ignore")) else outside)
        with pytest.raises(RunnerError) as caught:
            install_skill(checkout)
        assert caught.value.reason == "skill-failed"
        assert f"{path} is a symlink" in str(caught.value)
        assert list(outside.iterdir()) == []

    def test_a_file_where_a_directory_belongs_is_refused(self, checkout: Path) -> None:
        (checkout / ".claude").write_text("not a directory\n")
        with pytest.raises(RunnerError, match=r"\.claude is not a directory") as caught:
            install_skill(checkout)
        assert caught.value.reason == "skill-failed"
        assert (checkout / ".claude").read_text() == "not a directory\n"

    def test_a_directory_where_a_file_belongs_is_refused(self, checkout: Path) -> None:
        (checkout / ".claude" / "skills" / "looprelay" / "SKILL.md").mkdir(parents=True)
        with pytest.raises(RunnerError, match=r"SKILL\.md is not a regular file") as caught:
            install_skill(checkout)
        assert caught.value.reason == "skill-failed"

    def test_a_missing_directory_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(RunnerError, match="is not a directory") as caught:
            install_skill(tmp_path / "absent")
        assert caught.value.reason == "skill-failed"
        assert not (tmp_path / "absent").exists()


class TestSkillCommand:
    def test_install_prints_what_it_wrote_and_who_uses_it(self, checkout: Path) -> None:
        result = CliRunner().invoke(cli, ["skill", "install", str(checkout)])
        assert result.exit_code == 0, result.output
        target = checkout / ".claude" / "skills" / "looprelay"
        assert result.output.splitlines() == [
            *(f"wrote {target / name}" for name in INSTALLED),
            f"Claude Code picks the skill up in sessions started in {checkout}.",
        ]
        again = CliRunner().invoke(cli, ["skill", "install", str(checkout)])
        assert again.output.splitlines()[0] == f"{target} is up to date"

    def test_the_default_directory_is_the_current_one(self, checkout: Path) -> None:
        runner = CliRunner()
        previous = Path.cwd()
        os.chdir(checkout)
        try:
            result = runner.invoke(cli, ["skill", "install"])
        finally:
            os.chdir(previous)
        assert result.exit_code == 0, result.output
        assert (checkout / ".claude" / "skills" / "looprelay" / "SKILL.md").is_file()

    def test_a_refusal_is_one_error_line(self, checkout: Path) -> None:
        (checkout / ".claude").symlink_to(checkout.parent)
        done = subprocess.run(
            [sys.executable, "-m", "looprelay.cli", "skill", "install", str(checkout)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stdout == ""
        assert done.stderr.startswith(f"error: {checkout / '.claude'} is a symlink")
        assert len(done.stderr.strip().splitlines()) == 1


class TestRealClaudeLoadsTheSkill:
    def test_a_session_in_the_checkout_lists_the_skill(
        self, terminal: TmuxTerminal, checkout: Path, claude_home: ClaudeHome
    ) -> None:
        install_skill(checkout)
        prepare_claude(checkout, harness_args=[], environ={"HOME": str(claude_home.home)})
        argv = claude_home.command("--session-id", str(uuid.uuid4()), "which skills do you have?")
        terminal.spawn(SESSION, cwd=checkout, argv=argv)
        listing = wait_until(
            lambda: read_attachments(claude_home.home, "skill_listing"),
            seconds=DEADLINE_SECONDS,
            what="the skill listing in Claude's transcript",
            explain=lambda: screen(terminal, SESSION),
        )
        assert "looprelay" in listing[0]["names"]
        assert "- looprelay: Rules for working on a GitHub issue" in listing[0]["content"]
