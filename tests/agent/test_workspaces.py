"""Per-session working trees with real git, against an offline GitHub (tests.gitrepos)."""

from __future__ import annotations

import re
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from looprelay.agent.checkout_checks import names_repository
from looprelay.agent.git import sanitise
from looprelay.agent.workspaces import Checkout, Workspaces, clone_url, parse_checkout_pairs
from looprelay.errors import ConfigError, RunnerError
from looprelay.wire.runner_api import DispatchHead
from tests.fake_harness import wait_until
from tests.gitrepos import GitRepos, git, snapshot

SESSION = "loop-github-octo-repo-15"
OTHER = "loop-github-octo-repo-16"
PR_SESSION = "loop-github-octo-repo-7"
DEADLINE = 20.0

MakeWorkspaces = Callable[..., Workspaces]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


@pytest.fixture
def make(tmp_path: Path, root: Path) -> MakeWorkspaces:
    """Workspaces with a root and no checkouts; keyword arguments override any setting."""

    def make(**overrides: Any) -> Workspaces:
        settings: dict[str, Any] = {
            "configured": {},
            "root": root,
            "worktrees": tmp_path / "state" / "worktrees",
            "git_timeout_seconds": 60.0,
        }
        return Workspaces(**{**settings, **overrides})

    return make


@pytest.fixture
def operator(git_repos: GitRepos, tmp_path: Path) -> Path:
    """An operator's checkout of octo/repo with a local commit, a change and an untracked file."""
    checkout = git_repos.clone("octo/repo", tmp_path / "operator")
    (checkout / "local.txt").write_text("committed by the operator\n")
    git("add", "local.txt", cwd=checkout)
    git("commit", "--quiet", "-m", "local work", cwd=checkout)
    (checkout / "README.md").write_text("edited, not committed\n")
    (checkout / "scratch.txt").write_text("untracked\n")
    return checkout


SAME_REPO = DispatchHead(fork=False)


def _prepare(workspaces: Workspaces, session: str = SESSION, **fields: Any) -> Checkout:
    """Prepare ``session``; a pull request's head is a same-repository one unless given."""
    pull_request = fields.pop("pull_request", None)
    return workspaces.prepare(
        repository=fields.pop("repository", "octo/repo"),
        session_name=session,
        pull_request=pull_request,
        head=fields.pop("head", SAME_REPO if pull_request else None),
    )


def _fork_head(sha: str) -> DispatchHead:
    return DispatchHead(fork=True, sha=sha, base_ref="main")


def _head(tree: Path) -> tuple[str, str]:
    return git("symbolic-ref", "--short", "HEAD", cwd=tree), git("rev-parse", "HEAD", cwd=tree)


def _worktrees(repo: Path) -> list[str]:
    listed = git("worktree", "list", "--porcelain", cwd=repo).splitlines()
    return [line.removeprefix("worktree ") for line in listed if line.startswith("worktree ")]


def _leftovers(root: Path) -> list[str]:
    partial = root / ".partial"
    return sorted(p.name for p in partial.iterdir()) if partial.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class TestCloneUrl:
    @pytest.mark.parametrize(
        ("protocol", "host", "url"),
        [
            ("https", "github.com", "https://github.com/octo/repo.git"),
            ("ssh", "github.com", "git@github.com:octo/repo.git"),
            ("https", "ghe.example.com", "https://ghe.example.com/octo/repo.git"),
            ("ssh", "ghe.example.com", "git@ghe.example.com:octo/repo.git"),
        ],
    )
    def test_urls_are_built_from_owner_and_repo(self, protocol: str, host: str, url: str) -> None:
        assert clone_url("octo/repo", protocol=protocol, host=host) == url

    @pytest.mark.parametrize("repository", ["octo", "octo/repo/x", "../x", "octo/..", "a b/c", ""])
    def test_a_repository_that_is_not_owner_repo_is_an_invalid_dispatch(
        self, repository: str
    ) -> None:
        with pytest.raises(RunnerError, match="is not owner/repo") as caught:
            clone_url(repository, protocol="https", host="github.com")
        assert caught.value.reason == "invalid-dispatch"

    @pytest.mark.parametrize(
        ("protocol", "host", "fix"),
        [
            ("git", "github.com", "must be one of https, ssh"),
            ("https", "user:pw@github.com", "must be a host name"),
            ("https", "github.com/x", "must be a host name"),
            ("ssh", "", "must be a host name"),
        ],
    )
    def test_a_bad_protocol_or_host_names_the_fix(self, protocol: str, host: str, fix: str) -> None:
        with pytest.raises(ConfigError, match=fix):
            clone_url("octo/repo", protocol=protocol, host=host)

    @pytest.mark.parametrize(
        ("url", "names"),
        [
            ("https://github.com/octo/repo.git", True),
            ("https://github.com/Octo/Repo", True),
            ("git@github.com:octo/repo.git", True),
            ("ssh://git@github.com/octo/repo.git/", True),
            ("/srv/mirror/octo/repo.git", True),
            ("https://github.com/octo/repository.git", False),
            ("https://github.com/other/repo.git", False),
        ],
    )
    def test_a_remote_names_the_repository_by_its_path(self, url: str, names: bool) -> None:
        assert names_repository(url, "octo/repo") is names

    def test_credentials_are_cut_from_urls_in_messages(self) -> None:
        text = "fatal: unable to access 'https://x-access-token:ghs_s3cret@github.com/o/r.git/'"
        assert sanitise(text) == "fatal: unable to access 'https://github.com/o/r.git/'"


class TestSettings:
    def test_checkout_pairs_parse_and_bad_ones_name_the_fix(self, tmp_path: Path) -> None:
        assert parse_checkout_pairs([f"Octo/Repo={tmp_path}"]) == {"octo/repo": tmp_path}
        for bad in ["octo/repo", "octo=/x", "octo/repo=relative/path", "a/b/c=/x"]:
            with pytest.raises(ConfigError, match="owner/repo=/absolute/path"):
                parse_checkout_pairs([bad])

    @pytest.mark.parametrize(
        ("setting", "fix"),
        [
            ({"strategy": "copy"}, "must be worktree or clone"),
            ({"protocol": "ftp"}, "must be one of https, ssh"),
            ({"host": "a host"}, "must be a host name"),
            ({"git_timeout_seconds": 0}, "positive number of seconds"),
        ],
    )
    def test_a_bad_setting_names_the_fix(
        self, make: MakeWorkspaces, setting: dict[str, Any], fix: str
    ) -> None:
        with pytest.raises(ConfigError, match=fix):
            make(**setting)

    def test_only_a_root_can_check_out_pull_requests(self, make: MakeWorkspaces) -> None:
        assert make().can_checkout_pull_requests()
        assert not make(root=None).can_checkout_pull_requests()
        assert make(keep_on_close=True).keep_on_close
        assert not make().keep_on_close


@pytest.mark.usefixtures("git_repos")
class TestWorktreeStrategy:
    def test_a_work_item_gets_a_tree_at_main_on_a_branch_named_after_it(
        self, make: MakeWorkspaces, git_repos: GitRepos, root: Path
    ) -> None:
        main = git_repos.tip("octo/repo")
        checkout = _prepare(make())
        assert checkout == Checkout(
            root / SESSION, created=True, strategy="worktree", branch=SESSION, commit=main
        )
        assert _head(checkout.path) == (SESSION, main)
        assert (checkout.path / "README.md").read_text() == "# octo/repo\n"
        shared = root / ".repos" / "octo" / "repo.git"
        assert str(checkout.path) in _worktrees(shared)
        assert git("status", "--porcelain", cwd=checkout.path) == ""

    def test_two_work_items_get_two_trees_of_one_shared_clone(
        self, make: MakeWorkspaces, root: Path
    ) -> None:
        workspaces = make()
        first, second = _prepare(workspaces), _prepare(workspaces, OTHER)
        assert first.path != second.path
        (first.path / "mine.txt").write_text("only here\n")
        assert not (second.path / "mine.txt").exists()
        assert (_head(first.path)[0], _head(second.path)[0]) == (SESSION, OTHER)
        assert sorted(p.name for p in (root / ".repos" / "octo").iterdir()) == ["repo.git"]

    def test_the_shared_clone_is_fetched_before_each_new_tree(
        self, make: MakeWorkspaces, git_repos: GitRepos
    ) -> None:
        workspaces = make()
        _prepare(workspaces)
        newer = git_repos.commit("octo/repo", files={"NEWS.md": "news\n"})
        assert _prepare(workspaces, OTHER).commit == newer

    def test_a_second_prepare_reuses_the_tree_and_keeps_the_agents_work(
        self, make: MakeWorkspaces
    ) -> None:
        workspaces = make()
        first = _prepare(workspaces)
        (first.path / "work.txt").write_text("agent's work\n")
        git("add", "work.txt", cwd=first.path)
        git("commit", "--quiet", "-m", "agent's commit", cwd=first.path)
        (first.path / "draft.txt").write_text("not committed\n")
        again = _prepare(make())  # a restarted agent: a new object, the same root
        assert (again.path, again.reused, again.strategy) == (first.path, True, "worktree")
        assert again.commit == git("rev-parse", "HEAD", cwd=first.path) != first.commit
        assert (first.path / "draft.txt").read_text() == "not committed\n"

    def test_a_leftover_branch_behind_main_is_moved_to_main(
        self, make: MakeWorkspaces, git_repos: GitRepos
    ) -> None:
        workspaces = make()
        old = _prepare(workspaces)
        assert workspaces.remove(old.path)
        newer = git_repos.commit("octo/repo", files={"NEWS.md": "news\n"})
        again = _prepare(workspaces)
        assert (again.branch, again.commit, again.reused) == (SESSION, newer, False)

    def test_a_leftover_branch_with_commits_of_its_own_is_continued(
        self, make: MakeWorkspaces
    ) -> None:
        workspaces = make()
        old = _prepare(workspaces)
        (old.path / "work.txt").write_text("agent's work\n")
        git("add", "work.txt", cwd=old.path)
        git("commit", "--quiet", "-m", "agent's commit", cwd=old.path)
        work = git("rev-parse", "HEAD", cwd=old.path)
        assert workspaces.remove(old.path)
        again = _prepare(workspaces)
        assert (again.branch, again.commit) == (SESSION, work)
        assert (again.path / "work.txt").read_text() == "agent's work\n"

    def test_a_tree_deleted_by_hand_is_made_again(self, make: MakeWorkspaces, root: Path) -> None:
        workspaces = make()
        first = _prepare(workspaces)
        shutil.rmtree(first.path)  # still registered as a worktree of the shared clone
        again = _prepare(workspaces)
        assert again.path == first.path and not again.reused
        assert _head(again.path)[0] == SESSION

    def test_an_empty_directory_is_made_into_a_tree(self, make: MakeWorkspaces, root: Path) -> None:
        (root / SESSION).mkdir(parents=True)
        assert _prepare(make()).branch == SESSION

    def test_two_threads_preparing_one_new_repository_both_get_trees(
        self, make: MakeWorkspaces, git_repos: GitRepos
    ) -> None:
        workspaces, results, errors = make(), {}, []
        main = git_repos.tip("octo/repo")

        def prepare(session: str) -> None:
            try:
                results[session] = _prepare(workspaces, session)
            except RunnerError as exc:
                errors.append(exc)

        threads = [threading.Thread(target=prepare, args=(s,)) for s in (SESSION, OTHER)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        assert errors == []
        assert {s: c.commit for s, c in results.items()} == {SESSION: main, OTHER: main}


@pytest.mark.usefixtures("git_repos")
class TestCloneStrategy:
    def test_a_work_item_gets_a_full_clone_of_its_own(
        self, make: MakeWorkspaces, git_repos: GitRepos, root: Path
    ) -> None:
        checkout = _prepare(make(strategy="clone"))
        main = git_repos.tip("octo/repo")
        assert checkout == Checkout(
            root / SESSION, created=True, strategy="clone", branch=SESSION, commit=main
        )
        assert (checkout.path / ".git").is_dir()
        origin = git("config", "remote.origin.url", cwd=checkout.path)
        assert origin == "https://github.com/octo/repo.git"
        assert not (root / ".repos").exists()
        assert _prepare(make(strategy="clone")).reused

    def test_a_pull_request_clone_is_at_the_pull_requests_head(
        self, make: MakeWorkspaces, git_repos: GitRepos
    ) -> None:
        head = git_repos.add_pull_request("octo/repo", 7)
        checkout = _prepare(make(strategy="clone"), PR_SESSION, pull_request=7)
        assert (checkout.strategy, checkout.branch, checkout.commit) == ("clone", PR_SESSION, head)
        assert (checkout.path / "pr-7.txt").is_file()

    def test_ssh_urls_reach_the_same_repository(
        self, make: MakeWorkspaces, git_repos: GitRepos
    ) -> None:
        checkout = _prepare(make(strategy="clone", protocol="ssh"))
        assert git("config", "remote.origin.url", cwd=checkout.path) == (
            "git@github.com:octo/repo.git"
        )
        assert checkout.commit == git_repos.tip("octo/repo")


@pytest.mark.usefixtures("git_repos")
class TestPullRequests:
    @pytest.mark.parametrize("fork", [None, "someone/repo"], ids=["same-repository", "fork"])
    def test_a_pr_session_is_at_the_pr_head(
        self, make: MakeWorkspaces, git_repos: GitRepos, fork: str | None
    ) -> None:
        head = git_repos.add_pull_request("octo/repo", 7, fork=fork)
        given = _fork_head(head) if fork else SAME_REPO
        checkout = _prepare(make(), PR_SESSION, pull_request=7, head=given)
        assert (checkout.strategy, checkout.branch, checkout.commit, checkout.trusted) == (
            "fork-clone" if fork else "worktree",
            PR_SESSION,
            head,
            fork is None,
        )
        assert (checkout.path / "pr-7.txt").read_text() == "pull request 7\n"
        assert head != git_repos.tip("octo/repo")

    def test_a_pr_never_uses_the_operators_checkout(
        self, make: MakeWorkspaces, git_repos: GitRepos, operator: Path, root: Path
    ) -> None:
        head = git_repos.add_pull_request("octo/repo", 7)
        before = snapshot(operator)
        checkout = _prepare(make(configured={"octo/repo": operator}), PR_SESSION, pull_request=7)
        assert (checkout.strategy, checkout.commit) == ("worktree", head)
        assert _worktrees(operator) == [str(operator)]
        assert snapshot(operator) == before

    def test_a_pr_session_needs_a_workspace_root(
        self, make: MakeWorkspaces, operator: Path
    ) -> None:
        workspaces = make(root=None, configured={"octo/repo": operator})
        with pytest.raises(RunnerError, match="start the runner with --workspace") as caught:
            _prepare(workspaces, PR_SESSION, pull_request=7)
        assert caught.value.reason == "checkout-missing"

    def test_a_pr_that_does_not_exist_fails_readably(
        self, make: MakeWorkspaces, root: Path
    ) -> None:
        with pytest.raises(RunnerError, match="refs/pull/99/head") as caught:
            _prepare(make(), PR_SESSION, pull_request=99)
        assert caught.value.reason == "workspace-failed"
        assert not (root / PR_SESSION).exists()


class TestOperatorCheckout:
    def test_a_work_item_gets_a_worktree_at_its_head_and_the_checkout_is_unchanged(
        self, make: MakeWorkspaces, operator: Path, tmp_path: Path
    ) -> None:
        before = snapshot(operator)
        workspaces = make(root=None, configured={"octo/repo": operator})
        checkout = _prepare(workspaces)
        assert checkout == Checkout(
            tmp_path / "state" / "worktrees" / SESSION,
            created=True,
            strategy="operator-worktree",
            branch=SESSION,
            commit=str(before["head"]),
        )
        assert (checkout.path / "local.txt").is_file()  # the operator's commit
        assert (checkout.path / "README.md").read_text() == "# octo/repo\n"  # not their edit
        assert not (checkout.path / "scratch.txt").exists()
        assert snapshot(operator) == before
        assert _prepare(workspaces).reused
        assert workspaces.remove(checkout.path)
        assert not checkout.path.exists()
        assert _worktrees(operator) == [str(operator)]
        assert snapshot(operator) == before
        assert git("rev-parse", f"refs/heads/{SESSION}", cwd=operator) == before["head"]

    def test_with_a_workspace_root_the_worktree_goes_under_it(
        self, make: MakeWorkspaces, operator: Path, root: Path
    ) -> None:
        checkout = _prepare(make(configured={"Octo/Repo": operator}))
        assert (checkout.path, checkout.strategy) == (root / SESSION, "operator-worktree")
        assert not (root / ".repos").exists()  # no fetch, no clone for it

    def test_two_runners_sharing_the_checkout_get_trees_on_two_branches(
        self, make: MakeWorkspaces, operator: Path, tmp_path: Path
    ) -> None:
        """Two state directories, one checkout: a work item that moved from one to the other."""
        first, second = (
            make(root=None, configured={"octo/repo": operator}, worktrees=tmp_path / name)
            for name in ("runner-a", "runner-b")
        )
        mine, theirs = _prepare(first), _prepare(second)
        assert (mine.branch, theirs.branch) == (SESSION, f"{SESSION}-2")
        assert mine.path != theirs.path
        assert mine.commit == theirs.commit

    def test_other_repositories_still_use_the_root(
        self, make: MakeWorkspaces, git_repos: GitRepos, operator: Path
    ) -> None:
        git_repos.create("octo/other")
        checkout = _prepare(make(configured={"octo/repo": operator}), repository="octo/other")
        assert (checkout.strategy, checkout.commit) == ("worktree", git_repos.tip("octo/other"))


@pytest.mark.usefixtures("git_repos")
class TestRemove:
    def test_a_worktree_goes_and_the_shared_clone_and_branch_stay(
        self, make: MakeWorkspaces, root: Path
    ) -> None:
        workspaces = make()
        checkout, other = _prepare(workspaces), _prepare(workspaces, OTHER)
        assert workspaces.remove(checkout.path)
        shared = root / ".repos" / "octo" / "repo.git"
        assert not checkout.path.exists()
        assert _worktrees(shared) == [str(shared), str(other.path)]
        assert git("rev-parse", f"refs/heads/{SESSION}", cwd=shared) == checkout.commit
        assert not workspaces.remove(checkout.path)  # nothing left to remove

    def test_a_worktree_whose_repository_was_deleted_still_goes(
        self, make: MakeWorkspaces, root: Path
    ) -> None:
        workspaces = make()
        checkout = _prepare(workspaces)
        shutil.rmtree(root / ".repos")
        assert workspaces.remove(checkout.path)
        assert not checkout.path.exists()

    def test_a_clone_goes(self, make: MakeWorkspaces) -> None:
        workspaces = make(strategy="clone")
        checkout = _prepare(workspaces)
        assert workspaces.remove(checkout.path)
        assert not checkout.path.exists()

    def test_nothing_the_agent_did_not_make_is_touched(
        self, make: MakeWorkspaces, git_repos: GitRepos, root: Path, tmp_path: Path
    ) -> None:
        operator = git_repos.clone("octo/repo", root / "loop-operator")
        workspaces = make(configured={"octo/other": operator})
        session = _prepare(workspaces).path
        outside = tmp_path / "loop-outside"
        nested = session / "loop-nested"
        for directory in (outside, nested, root / "not-a-session"):
            directory.mkdir()
        (root / "loop-link").symlink_to(outside)
        refused = [
            outside,
            root,
            root / ".repos",
            root / ".repos" / "octo" / "repo.git",
            nested,
            root / "loop-link",
            operator,
            root / "not-a-session",
            root / "loop-missing",
        ]
        assert [p for p in refused if workspaces.remove(p)] == []
        assert all(p.exists() for p in refused if p.name != "loop-missing")


class TestFailures:
    @pytest.mark.usefixtures("git_repos")
    @pytest.mark.parametrize("strategy", ["worktree", "clone"])
    def test_a_missing_repository_fails_readably_and_leaves_nothing(
        self, make: MakeWorkspaces, root: Path, strategy: str
    ) -> None:
        with pytest.raises(RunnerError) as caught:
            _prepare(make(strategy=strategy), repository="octo/missing")
        assert caught.value.reason == "workspace-failed"
        message = str(caught.value)
        assert message.startswith(f"cannot prepare octo/missing for {SESSION}: git ")
        assert "does not appear to be a git repository" in message
        assert not (root / SESSION).exists()
        assert not (root / ".repos" / "octo" / "missing.git").exists()
        assert _leftovers(root) == []

    @pytest.mark.usefixtures("git_repos")
    def test_a_hanging_git_is_killed_at_its_timeout(
        self, make: MakeWorkspaces, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        pid_file, ssh = tmp_path / "ssh.pid", tmp_path / "hanging-ssh"
        ssh.write_text(f"#!/bin/sh\necho $$ > '{pid_file}'\nexec sleep 600\n")
        ssh.chmod(0o755)
        monkeypatch.setenv("GIT_SSH_COMMAND", str(ssh))  # ssh that never answers, like a dead host
        workspaces = make(protocol="ssh", host="git.example", git_timeout_seconds=1.0)
        started = time.monotonic()
        with pytest.raises(RunnerError, match="ran past 1 s and was killed") as caught:
            _prepare(workspaces)
        assert time.monotonic() - started < DEADLINE
        assert caught.value.reason == "workspace-failed"
        pid = int(pid_file.read_text())
        wait_until(lambda: not _alive(pid), seconds=DEADLINE, what="the hanging ssh to be killed")
        assert not (root / SESSION).exists()
        assert not (root / ".repos" / "octo" / "repo.git").exists()

    def test_credentials_in_a_rewritten_url_never_reach_the_message(
        self, make: MakeWorkspaces, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with socket.socket() as probe:  # a loopback port nothing listens on
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        base = f"https://x-access-token:s3cret@127.0.0.1:{port}/"
        monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
        monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.{base}.insteadOf")
        monkeypatch.setenv("GIT_CONFIG_VALUE_0", "https://git.example/")
        with pytest.raises(RunnerError) as caught:
            _prepare(make(host="git.example", git_timeout_seconds=30.0))
        assert caught.value.reason == "workspace-failed"
        assert "s3cret" not in str(caught.value)
        assert "x-access-token" not in str(caught.value)

    @pytest.mark.usefixtures("git_repos")
    def test_a_directory_that_is_not_a_work_tree_is_refused_untouched(
        self, make: MakeWorkspaces, root: Path
    ) -> None:
        (root / SESSION).mkdir(parents=True)
        (root / SESSION / "notes.txt").write_text("someone's notes\n")
        with pytest.raises(RunnerError, match="is not a git work tree; move it away") as caught:
            _prepare(make())
        assert caught.value.reason == "workspace-failed"
        assert (root / SESSION / "notes.txt").read_text() == "someone's notes\n"

    @pytest.mark.usefixtures("git_repos")
    def test_a_symlink_in_the_sessions_place_is_refused(
        self, make: MakeWorkspaces, root: Path, tmp_path: Path
    ) -> None:
        root.mkdir()
        (root / SESSION).symlink_to(tmp_path)
        with pytest.raises(RunnerError, match="is not a directory") as caught:
            _prepare(make())
        assert caught.value.reason == "workspace-failed"

    @pytest.mark.parametrize(
        ("fields", "match"),
        [
            ({"repository": "../../etc"}, "is not owner/repo"),
            ({"session_name": "../loop-x"}, "session name"),
            ({"session_name": "loop-a/b"}, "session name"),
            ({"pull_request": 0}, "not a pull request number"),
        ],
    )
    def test_bad_dispatch_values_are_refused(
        self, make: MakeWorkspaces, fields: dict[str, Any], match: str
    ) -> None:
        args: dict[str, Any] = {
            "repository": "octo/repo",
            "session_name": SESSION,
            "pull_request": None,
        }
        with pytest.raises(RunnerError, match=match) as caught:
            make().prepare(**{**args, **fields})
        assert caught.value.reason == "invalid-dispatch"

    def test_an_operator_checkout_that_vanished_fails_readably(
        self, make: MakeWorkspaces, tmp_path: Path
    ) -> None:
        gone = tmp_path / "gone"
        with pytest.raises(RunnerError, match=re.escape(f"{gone} is not a directory")) as caught:
            _prepare(make(configured={"octo/repo": gone}))
        assert caught.value.reason == "workspace-failed"

    def test_no_checkout_and_no_root_is_checkout_missing(self, make: MakeWorkspaces) -> None:
        with pytest.raises(RunnerError, match="add --checkout octo/repo=PATH") as caught:
            _prepare(make(root=None))
        assert caught.value.reason == "checkout-missing"


class TestCheck:
    def test_a_good_configuration_passes(
        self, make: MakeWorkspaces, operator: Path, root: Path
    ) -> None:
        git("remote", "set-url", "origin", "https://github.com/Octo/Repo", cwd=operator)
        git("remote", "add", "upstream", "https://github.com/someone/else.git", cwd=operator)
        make(configured={"octo/repo": operator}).check()
        assert root.is_dir()

    @pytest.mark.parametrize(
        ("setup", "match"),
        [
            ("missing", "no such directory; give the path of a clone of octo/repo"),
            ("plain", "not a git work tree; give the path of a clone of octo/repo"),
            ("other", "no remote is octo/repo \\(origin .*other.git\\); give the path"),
            ("no-remote", "no remote is octo/repo \\(it has none\\)"),
        ],
    )
    def test_a_bad_checkout_names_the_fix(
        self, make: MakeWorkspaces, git_repos: GitRepos, tmp_path: Path, setup: str, match: str
    ) -> None:
        path = tmp_path / "checkout"
        if setup == "plain":
            path.mkdir()
        elif setup == "other":
            git_repos.create("octo/other")
            git_repos.clone("octo/other", path)
        elif setup == "no-remote":
            git("init", "--quiet", str(path))
        with pytest.raises(ConfigError, match=match) as caught:
            make(configured={"octo/repo": path}).check()
        assert str(caught.value).startswith(f"--checkout octo/repo={path}: ")
        assert "\n" not in str(caught.value)

    def test_a_remote_with_credentials_is_shown_without_them(
        self, make: MakeWorkspaces, operator: Path
    ) -> None:
        url = "https://x-access-token:s3cret@github.com/octo/other.git"
        git("remote", "set-url", "origin", url, cwd=operator)
        with pytest.raises(ConfigError, match="no remote is octo/repo") as caught:
            make(configured={"octo/repo": operator}).check()
        assert "s3cret" not in str(caught.value)

    def test_a_root_that_cannot_be_created_names_the_fix(
        self, make: MakeWorkspaces, tmp_path: Path
    ) -> None:
        (tmp_path / "a-file").write_text("")
        with pytest.raises(ConfigError, match=r"cannot be created or written.*writable directory"):
            make(root=tmp_path / "a-file" / "workspace").check()

    def test_git_missing_from_path_names_the_fix(
        self, make: MakeWorkspaces, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        with pytest.raises(ConfigError, match="git is not on PATH; install git"):
            make().check()
