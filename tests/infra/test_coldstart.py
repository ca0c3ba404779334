"""The webhook's cold start stays light: importing the functions module builds nothing and loads
no store, template or tmux code, and the webhook's builder loads only ingress and its queue. The
queue speaks Cloud Tasks' REST API itself, so the webhook loads no gRPC, protobuf or
google-cloud-tasks (docs/decisions/0003-cloud-tasks-over-rest.md).

Each check runs in a fresh interpreter (``sys.modules`` of this test run is full of everything).
Flask, which functions-framework imports before it loads ``main``, itself imports ``jinja2``; so
for ``main`` the check is "no Jinja2 module beyond Flask's", and ``jinja2.sandbox`` (looprelay's
renderer) never. The builder is checked without functions-framework, where no Jinja2 at all may
load. ``bench/coldstart.py`` measures the times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NEVER_ON_IMPORT = ("google.cloud.firestore", "google.cloud.tasks_v2", "jinja2.sandbox")
NEVER_FOR_THE_WEBHOOK = (
    "google.cloud.firestore",
    "jinja2",
    "google.cloud.tasks_v2",
    "google.api_core",
    "grpc",
    "google.protobuf",
    "proto",  # proto-plus
    "jwt",  # the webhook verifies HMAC; GitHub App auth is the worker's
)
LOOPRELAY_NEVER_ON_IMPORT = ("looprelay.core.render", "looprelay.agent", "looprelay.service.worker")
LOOPRELAY_NEVER_FOR_THE_WEBHOOK = (
    # The worker's, the runner API's and the sweeper's parts, and every store and GitHub
    # adapter: the webhook verifies, enqueues and answers.
    "looprelay.service.route",
    "looprelay.core.decide",
    "looprelay.service.runners",
    "looprelay.service.lease_desk",
    "looprelay.service.sweeper",
    "looprelay.app.services",
    "looprelay.app.longpoll",
    "looprelay.app.runner_http",
    "looprelay.app.webhook",  # up's webhook (the embedded queue's durable ack)
    *(
        f"looprelay.adapters.sqlite.{name}"
        for name in ("database", "store", "work_items", "runners", "queue", "enqueue_committer")
    ),
    "looprelay.adapters.sqlite.worker_connection",
    *(
        f"looprelay.adapters.firestore.{name}"
        for name in (
            "common",
            "store",
            "work_items",
            "runners",
            "listener",
            "dispatch_feed",
            "runner_changes",
        )
    ),
    *(f"looprelay.adapters.github.{name}" for name in ("rest", "auth", "app_hooks")),
    "looprelay.adapters.gcp.oidc",
    "looprelay.core.model",  # the store's documents: the webhook stores nothing
    "libtmux",
)
_PRINT_MODULES = "import json, sys\nprint(json.dumps(sorted(sys.modules)))"


def _modules_after(code: str, **env: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` in ``functions/``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FUNCTION_TARGET", "LOOPRELAY_CONFIG") and not k.startswith("LOOPRELAY__")
    }
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\n{_PRINT_MODULES}"],
        cwd=ROOT / "functions",
        env=base | {"PYTHONPATH": str(ROOT / "shared")} | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    modules: list[str] = json.loads(result.stdout.splitlines()[-1])
    return set(modules)


def _matching(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in prefixes))


class TestImportingTheFunctionsModule:
    def test_loads_no_store_queue_template_or_tmux_library(self) -> None:
        modules = _modules_after("import main")

        assert "main" in modules
        assert _matching(modules, NEVER_ON_IMPORT) == []
        assert _matching(modules, LOOPRELAY_NEVER_ON_IMPORT) == []

    def test_loads_no_jinja2_module_beyond_what_flask_loads(self) -> None:
        flask_only = _modules_after("import functions_framework")

        modules = _modules_after("import main")

        assert _matching(modules - flask_only, ("jinja2",)) == []


class TestTheWebhookBuilder:
    def test_loads_the_rest_queue_and_no_grpc_protobuf_store_template_or_tmux(self) -> None:
        # The webhook function's whole application, as functions/main.py builds it.
        queue = {
            "project": "p",
            "location": "us-central1",
            "queue": "q",
            "workerUrl": "https://worker.example/",
            "apiEndpoint": "http://127.0.0.1:9",  # nothing is sent while building
        }
        code = (
            "import os\n"
            "from looprelay.app.compose import build_app\n"
            "from looprelay.app.cloud import cloud_config\n"
            "build_app(cloud_config(os.environ), os.environ, function='webhook')"
        )

        modules = _modules_after(
            code,
            TEST_WEBHOOK_SECRET="s",
            LOOPRELAY__github__webhookSecrets="[TEST_WEBHOOK_SECRET]",
            LOOPRELAY__queue__backend="cloudtasks",
            LOOPRELAY__queue__cloudtasks=json.dumps(queue),
        )

        # The builder really built the cloud queue, with google-auth's session.
        assert "looprelay.adapters.gcp.cloud_tasks" in modules
        assert "google.auth.transport.requests" in modules
        assert _matching(modules, NEVER_FOR_THE_WEBHOOK) == []
        assert _matching(modules, LOOPRELAY_NEVER_ON_IMPORT) == []
        assert _matching(modules, LOOPRELAY_NEVER_FOR_THE_WEBHOOK) == []


class TestTheDeployedEntryPoint:
    def test_the_collector_runs_again_once_the_application_is_built(self) -> None:
        # main.py pauses garbage collection while it loads; a pause that outlived the load
        # would grow the instance's memory for as long as it serves.
        queue = {
            "project": "p",
            "location": "us-central1",
            "queue": "q",
            "workerUrl": "https://worker.example/",
            "apiEndpoint": "http://127.0.0.1:9",
        }
        code = (
            "import gc, sys\n"
            "import main\n"
            "assert 'looprelay.app.compose' in sys.modules, 'the webhook was not built'\n"
            "assert gc.isenabled(), 'garbage collection is still paused'\n"
            "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()\n"
        )

        _modules_after(
            code,
            FUNCTION_TARGET="webhook",
            TEST_WEBHOOK_SECRET="s",
            LOOPRELAY__github__webhookSecrets="[TEST_WEBHOOK_SECRET]",
            LOOPRELAY__queue__backend="cloudtasks",
            LOOPRELAY__queue__cloudtasks=json.dumps(queue),
        )

    def test_building_the_runner_api_starts_no_thread(self) -> None:
        # functions-framework imports main in gunicorn's arbiter, which forks the worker that
        # serves: a listener's thread or gRPC stream started here would live in the wrong
        # process (issue 22). The listeners start on the worker's first request.
        code = (
            "import threading\n"
            "import main\n"
            "assert 'looprelay.adapters.firestore.listener' in sys.modules, 'not built'\n"
            "assert threading.active_count() == 1, threading.enumerate()\n"
        )

        _modules_after(
            f"import sys\n{code}",
            FUNCTION_TARGET="runners",
            FIRESTORE_EMULATOR_HOST="127.0.0.1:9",  # nothing may be sent while building
            LOOPRELAY__store__backend='"firestore"',
            LOOPRELAY__store__firestore__project='"demo-coldstart"',
        )

    def test_the_status_page_is_built_at_import_and_starts_no_thread(self) -> None:
        # Its own function now (issue 22): built at import like the others, so a
        # misconfigured deployment fails its rollout, and connecting nothing before the fork.
        code = (
            "import sys, threading\n"
            "import main\n"
            "assert 'looprelay.service.status' in sys.modules, 'the status page was not built'\n"
            "assert 'looprelay.service.sweeper' not in sys.modules, 'built the sweeper too'\n"
            "assert threading.active_count() == 1, threading.enumerate()\n"
        )

        _modules_after(
            code,
            FUNCTION_TARGET="status",
            FIRESTORE_EMULATOR_HOST="127.0.0.1:9",  # nothing may be sent while building
            LOOPRELAY__store__backend='"firestore"',
            LOOPRELAY__store__firestore__project='"demo-coldstart"',
        )
