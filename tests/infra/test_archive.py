"""The Cloud Functions source archive: reproducible, complete, and deployable.

``functions/build.sh`` builds it; here it is built twice, unpacked, its requirements installed
into a clean venv (no looprelay, no project venv on the path; cached between sessions), and
every entry point served through the real ``functions-framework`` command, as Cloud Functions
runs it (``tests/deployed_functions.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from looprelay.core.envelope import project_envelope
from looprelay.core.signature import sign_body
from looprelay.core.wake import WAKE_MARGIN
from tests.cloudtasks_recorder import CloudTasksRecorder, recorder_config, scheduled_for
from tests.deployed_functions import START_SECONDS, Deployed, Served, build_archive
from tests.fake_github import APP_ID, REPOSITORY, AppKey, FakeDelivery, FakeGitHub
from tests.samples import payload, payload_bytes

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ("webhook", "worker", "runners", "sweeper", "poller", "status")
SECRET = "archive-test-secret"
INSTALL_BUDGET_SECONDS = 180


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def archive(functions_archive: Path) -> Path:
    """The archive, built once a session (``tests/deployed_functions.py``)."""
    return functions_archive


class TestBuild:
    def test_two_builds_are_byte_identical(self, archive: Path, tmp_path: Path) -> None:
        assert _sha256(build_archive(tmp_path / "again.zip")) == _sha256(archive)

    def test_file_times_and_the_checkout_path_do_not_change_a_byte(
        self, archive: Path, tmp_path: Path
    ) -> None:
        copy = tmp_path / "elsewhere"
        for part in ("functions", "shared/looprelay", "templates"):
            shutil.copytree(ROOT / part, copy / part, copy_function=shutil.copy)
        for path in copy.rglob("*"):
            os.utime(path, (1_900_000_000, 1_900_000_000))
        (copy / "shared/looprelay/__pycache__").mkdir(exist_ok=True)
        (copy / "shared/looprelay/__pycache__/cloud.cpython-311.pyc").write_bytes(b"stale")

        subprocess.run(
            ["bash", str(copy / "functions/build.sh")],
            check=True,
            capture_output=True,
            env=os.environ | {"PYTHON": sys.executable},
        )

        assert _sha256(copy / "build/functions-source.zip") == _sha256(archive)

    def test_it_holds_main_requirements_and_the_package_with_its_templates(
        self, archive: Path
    ) -> None:
        with zipfile.ZipFile(archive) as opened:
            names = opened.namelist()
            contents = {name: opened.read(name) for name in names}
        package = ROOT / "shared" / "looprelay"
        expected = {"main.py", "requirements.txt", "looprelay/templates/__init__.py"}
        expected |= {f"looprelay/templates/{p.name}" for p in (ROOT / "templates").glob("*.j2")}
        expected |= {
            f"looprelay/{p.relative_to(package).as_posix()}"
            for p in package.rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert expected <= set(names)
        assert any(name.endswith(".j2") for name in names)
        assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
        assert names == sorted(names)
        assert contents["main.py"] == (ROOT / "functions/main.py").read_bytes()
        assert contents["looprelay/app/cloud.py"] == (package / "app/cloud.py").read_bytes()

    def test_every_entry_is_dated_and_moded_alike(self, archive: Path, tmp_path: Path) -> None:
        with zipfile.ZipFile(archive) as opened:
            infos = opened.infolist()
        assert {info.date_time for info in infos} == {(1980, 1, 1, 0, 0, 0)}
        assert {info.external_attr >> 16 for info in infos} == {0o100644}

        epoch = 1_700_000_000
        with zipfile.ZipFile(
            build_archive(tmp_path / "dated.zip", SOURCE_DATE_EPOCH=str(epoch))
        ) as z:
            assert {info.date_time for info in z.infolist()} == {time.gmtime(epoch)[:6]}

    def test_requirements_are_the_project_dependencies(self) -> None:
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        lines = (ROOT / "functions/requirements.txt").read_text().splitlines()
        required = {line for line in lines if line and not line.startswith("#")}

        assert required == set(project["dependencies"])


def _stripped_token(*, audience: str, email: str) -> str:
    """An ID token of the queue's account as Cloud Run's IAM check hands it on: verified, its
    signature replaced (``worker.oidc.platformVerifiesSignature``)."""

    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "iss": "https://accounts.google.com",
        "aud": audience,
        "email": email,
        "email_verified": True,
        "iat": now,
        "exp": now + 600,
    }
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.SIGNATURE_REMOVED_BY_GOOGLE"


def _post(served: Served, path: str = "/", **kwargs: object) -> requests.Response:
    served.wait_until_listening()
    return requests.post(served.url + path, timeout=30, **kwargs)  # type: ignore[arg-type]


class TestFromACleanVenv:
    def test_every_entry_point_imports_from_the_archive_alone(self, deployed: Deployed) -> None:
        script = (
            "import json, sys, main, looprelay\n"
            f"print(json.dumps([main.__file__, looprelay.__file__, "
            f"[callable(getattr(main, n)) for n in {list(ENTRY_POINTS)!r}]]))"
        )
        result = subprocess.run(
            [str(deployed.bin / "python"), "-c", script],
            cwd=deployed.source,
            env=deployed.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

        assert result.returncode == 0, result.stderr
        main_file, package_file, callables = json.loads(result.stdout)
        assert Path(main_file).parent == deployed.source
        assert Path(package_file).is_relative_to(deployed.source)  # not the project's install
        assert callables == [True] * len(ENTRY_POINTS)

    def test_the_webhook_queues_a_signed_delivery(
        self, serve: Callable[..., Served], cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        queue = recorder_config(cloudtasks_recorder).model_dump(by_alias=True)
        served = serve(
            "webhook",
            TEST_WEBHOOK_SECRET=SECRET,
            LOOPRELAY__github__webhookSecrets="[TEST_WEBHOOK_SECRET]",
            LOOPRELAY__queue__backend="cloudtasks",
            LOOPRELAY__queue__cloudtasks=json.dumps(queue),
        )
        body, delivery = payload_bytes("issue_comment.created"), str(uuid.uuid4())
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": "issue_comment",
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sign_body(body, SECRET.encode()),
        }

        response = _post(served, headers=headers, data=body)

        assert response.status_code == 202, served.output()
        [task] = cloudtasks_recorder.held().values()
        assert json.loads(task)["delivery_id"] == delivery

    def test_the_webhook_without_a_secret_refuses_to_start(
        self, serve: Callable[..., Served]
    ) -> None:
        served = serve("webhook")

        assert served.process.wait(timeout=START_SECONDS) != 0
        assert "github.webhookSecrets" in served.output()

    def test_the_worker_refuses_a_request_without_a_token(
        self, serve: Callable[..., Served], tmp_path: Path
    ) -> None:
        oidc = {"serviceAccountEmail": "tasks@demo.iam.gserviceaccount.com", "audience": "x"}
        served = serve(
            "worker",
            LOOPRELAY__worker__oidc=json.dumps(oidc),
            LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"),
        )

        response = _post(served, json={"delivery_id": "d-1", "event": "issues"})

        assert response.status_code == 401, served.output()

    def test_the_worker_queues_the_wake_of_a_lone_comment_and_answers_at_once(
        self, serve: Callable[..., Served], tmp_path: Path, cloudtasks_recorder: CloudTasksRecorder
    ) -> None:
        queue = recorder_config(cloudtasks_recorder)
        audience = "https://worker.example.test/worker"
        oidc = {
            "serviceAccountEmail": queue.service_account_email,
            "audience": audience,
            "platformVerifiesSignature": True,
        }
        served = serve(
            "worker",
            LOOPRELAY__worker__oidc=json.dumps(oidc),
            LOOPRELAY__queue__backend="cloudtasks",
            LOOPRELAY__queue__cloudtasks=json.dumps(queue.model_dump(by_alias=True)),
            LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"),
        )
        envelope = project_envelope(
            event="issue_comment",
            delivery_id=str(uuid.uuid4()),
            payload=payload("issue_comment.created"),
            max_text_chars=10_000,
            received_at=datetime.now(UTC),
        )
        token = _stripped_token(audience=audience, email=queue.service_account_email)

        response = _post(
            served,
            data=envelope.model_dump_json(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )

        assert response.status_code == 200, served.output()
        answer = response.json()
        assert answer["status"] == "waiting", answer
        [(name, task)] = cloudtasks_recorder.tasks.items()
        assert name.rsplit("/", 1)[-1].startswith("wk-")
        until = datetime.fromisoformat(answer["until"])
        assert scheduled_for(task) == pytest.approx((until + WAKE_MARGIN).timestamp(), abs=0.001)
        assert task["httpRequest"]["oidcToken"]["serviceAccountEmail"] == (
            queue.service_account_email
        )

    def test_the_runner_api_refuses_a_request_without_credentials(
        self, serve: Callable[..., Served], tmp_path: Path
    ) -> None:
        served = serve("runners", LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"))

        response = _post(served, "/runner/v1/heartbeat", json={"version": "t", "capacity": 1})

        assert response.status_code == 401, served.output()

    def test_the_sweeper_redelivers_a_failed_delivery(
        self,
        serve: Callable[..., Served],
        tmp_path: Path,
        fake_github: FakeGitHub,
        github_app_key: AppKey,
    ) -> None:
        fake_github.app_public_key = github_app_key.public_key
        failed_at = datetime.now(UTC) - timedelta(minutes=5)
        fake_github.app_deliveries = [FakeDelivery(31, "lost", failed_at, status_code=502)]
        served = serve(
            "sweeper",
            TEST_GH_APP_KEY=github_app_key.private_pem,
            LOOPRELAY__github__apiUrl=fake_github.url,
            LOOPRELAY__github__appId=str(APP_ID),
            LOOPRELAY__github__privateKeyEnv="TEST_GH_APP_KEY",
            LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"),
        )

        response = _post(served)

        assert response.status_code == 200, served.output()
        assert response.json()["redelivered"] == 1
        assert fake_github.redelivered == [31]
        # The status page is the status function's, not the sweeper's (issue 22).
        assert requests.get(served.url + "/status", timeout=30).status_code == 404

    def test_the_poller_queues_a_comment_it_polled(
        self,
        serve: Callable[..., Served],
        tmp_path: Path,
        fake_github: FakeGitHub,
        github_app_key: AppKey,
        cloudtasks_recorder: CloudTasksRecorder,
    ) -> None:
        fake_github.app_public_key = github_app_key.public_key
        fake_github.poll.open_issue(1)
        queue = recorder_config(cloudtasks_recorder).model_dump(by_alias=True)
        served = serve(
            "poller",
            TEST_GH_APP_KEY=github_app_key.private_pem,
            LOOPRELAY__github__apiUrl=fake_github.url,
            LOOPRELAY__github__appId=str(APP_ID),
            LOOPRELAY__github__privateKeyEnv="TEST_GH_APP_KEY",
            LOOPRELAY__github__poll__repositories=json.dumps([REPOSITORY]),
            LOOPRELAY__queue__backend="cloudtasks",
            LOOPRELAY__queue__cloudtasks=json.dumps(queue),
            LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"),
        )
        first = _post(served)  # first sight: where polling begins
        comment_id = fake_github.poll.comment(1, "polled in the cloud")

        second = _post(served)

        assert first.status_code == second.status_code == 200, served.output()
        [polled] = second.json()["repositories"]
        assert (polled["repository"], polled["queued"], polled["error"]) == (REPOSITORY, 1, "")
        [task] = cloudtasks_recorder.held().values()
        assert json.loads(task)["delivery_id"] == f"poll-comment-{comment_id}"

    def test_the_status_function_serves_the_page_and_its_json(
        self, serve: Callable[..., Served], tmp_path: Path
    ) -> None:
        served = serve("status", LOOPRELAY__store__sqlite__path=str(tmp_path / "store.db"))
        served.wait_until_listening()

        page = requests.get(served.url + "/status", timeout=30)
        view = requests.get(
            served.url + "/status", headers={"Accept": "application/json"}, timeout=30
        ).json()
        root = requests.get(served.url + "/", timeout=30, allow_redirects=False)

        assert page.status_code == 200, served.output()
        assert "<title>looprelay status</title>" in page.text
        assert view["runners"] == [] and view["replays"] == []
        assert (root.status_code, root.headers["location"]) == (307, "/status")


def test_the_clean_install_stays_within_its_budget(deployed: Deployed) -> None:
    """Every requirement installs from a wheel: about 15 s from pip's cache, about 60 s when
    it downloads everything. A requirement built from source would take minutes. The venv is
    cached by its requirements, so the figure is of the install that made it, redone when they
    change. ``pytest -rP`` shows it."""
    print(f"clean venv: pip install -r requirements.txt took {deployed.install_seconds:.1f} s")
    assert deployed.install_seconds < INSTALL_BUDGET_SECONDS
