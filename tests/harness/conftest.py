"""Fixtures of the real-Claude end-to-end tests: one machine and two deployments per store.

Everything is module-scoped and parametrized by store, so each store starts its processes once:
a :class:`Machine`, ``relay`` (``looprelay up`` routing to tmux sessions, ``sessionPerPr:
always``, and runner ``a`` with an operator checkout and a workspace root) and ``headless``
(``looprelay up`` with ``runnerKind: process`` and a fake GitHub App, and runner ``b`` with the
same operator checkout). Both runners run on the one machine with their default state directory
and tmux socket. Every process and tmux server is stopped at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.claude_cli import fresh_claude_home
from tests.fake_github import APP_ID, APP_LOGIN, INSTALLATION_ID, AppKey, FakeGitHub
from tests.faults.runners import start_stack
from tests.firestore_emulator import PROJECT
from tests.gitrepos import offline_github
from tests.harness.machine import FORK, REPO, Deployment, Machine
from tests.harness.payloads import REPOSITORY

STORE_BACKENDS = ["sqlite", pytest.param("firestore", marks=pytest.mark.firestore)]
KEY_ENV = "LOOPRELAY_HARNESS_APP_KEY"
POLL_WAIT = "2"


@pytest.fixture(scope="module", params=STORE_BACKENDS)
def store_yaml(request: pytest.FixtureRequest) -> str:
    """The ``store:`` section of each backend (Firestore: on the emulator, which this starts;
    each deployment adds a collection prefix of its own, so two never meet)."""
    if request.param == "sqlite":
        return "store:\n  backend: sqlite\n"
    request.getfixturevalue("firestore_emulator")  # sets FIRESTORE_EMULATOR_HOST
    return "store:\n  backend: firestore\n  firestore:\n    project: " + PROJECT + "\n"


def _store_config(store_yaml: str) -> str:
    """``store_yaml`` for one deployment: a Firestore store gets collections of its own."""
    if "firestore" not in store_yaml:
        return store_yaml
    return store_yaml + f"    collectionPrefix: h{uuid.uuid4().hex[:10]}_\n"


@pytest.fixture(scope="module")
def machine(
    store_yaml: str, claude_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Machine]:
    """One operator machine per store: offline GitHub with ``REPO`` (and a fork), Claude's
    fresh HOME, the operator's checkout of ``REPO``, a workspace root and a state home."""
    root = tmp_path_factory.mktemp("machine")
    with pytest.MonkeyPatch.context() as patch, fresh_claude_home(claude_bin, root) as claude:
        repos = offline_github(root, patch)  # git's env, inherited by every process started
        main = repos.create(REPO)
        checkout = repos.clone(REPO, root / "operator-checkout")
        yield Machine(
            claude=claude,
            repos=repos,
            checkout=checkout,
            workspace=root / "workspace",
            state_home=root / "state",
            main=main,
        )


@pytest.fixture(scope="module")
def relay(
    machine: Machine, store_yaml: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    """``looprelay up`` routing to tmux sessions (every PR gets its own), and runner ``a``
    serving ``REPO`` from the operator's checkout plus a workspace root, started."""
    directory = tmp_path_factory.mktemp("relay")
    config = (
        _store_config(store_yaml)
        + "routing:\n  authorizedUsers: [codertocat]\n  sessionPerPr: always\n"
        + f"runners:\n  pollWaitSeconds: {POLL_WAIT}\n"
    )
    deployment = Deployment(
        stack=start_stack(directory, config),
        config_path=directory / "looprelay.yaml",
        machine=machine,
        directory=directory,
    )
    try:
        runner = deployment.register("a")
        runner.start(
            *("--checkout", f"{REPO}={machine.checkout}"),
            *("--workspace", str(machine.workspace), "--poll-wait", POLL_WAIT),
        )
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def headless(
    machine: Machine,
    store_yaml: str,
    github_app_key: AppKey,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Deployment, FakeGitHub]]:
    """A second deployment on the same machine: ``looprelay up`` running headless turns and
    replying through a fake GitHub App, and runner ``b`` serving ``REPO`` from the same
    operator checkout, started."""
    with headless_deployment(
        machine,
        store_yaml,
        github_app_key,
        tmp_path_factory.mktemp("headless"),
        runner=("b", "--checkout", f"{REPO}={machine.checkout}"),
    ) as deployed:
        yield deployed


@contextmanager
def headless_deployment(
    machine: Machine,
    store_yaml: str,
    github_app_key: AppKey,
    directory: Path,
    *,
    runner: tuple[str, ...],
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[Deployment, FakeGitHub]]:
    """``looprelay up`` in ``directory`` running headless turns (``runnerKind: process``) and
    replying through a fake GitHub App, with runner ``runner[0]`` registered and started with
    the arguments ``runner[1:]`` (and ``env`` added to its environment); all stopped after."""
    github = FakeGitHub()
    github.app_public_key = github_app_key.public_key
    github.repositories |= {REPO, REPOSITORY, FORK}
    github.start()
    config = (
        _store_config(store_yaml)
        + f"github:\n  apiUrl: {github.url}\n  appId: {APP_ID}\n  privateKeyEnv: {KEY_ENV}\n"
        + "routing:\n  authorizedUsers: [codertocat]\n"
        + f'  botLogins: ["{APP_LOGIN}"]\n  runnerKind: process\n'
        + f"runners:\n  pollWaitSeconds: {POLL_WAIT}\n"
    )
    try:
        deployment = Deployment(
            stack=start_stack(directory, config, {KEY_ENV: github_app_key.private_pem}),
            config_path=directory / "looprelay.yaml",
            machine=machine,
            directory=directory,
            installation=INSTALLATION_ID,
        )
        try:
            name, *args = runner
            deployment.register(name).start(*args, "--poll-wait", POLL_WAIT, env=env)
            yield deployment, github
        finally:
            deployment.stop()
    finally:
        github.stop()
