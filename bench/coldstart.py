"""Cold start of each Cloud Functions entry point, measured with ``python -X importtime``.

Each case runs one fresh interpreter several times and reports the median total import time,
with each process's wall time and CPU time (user + system; the figure that stays put when other
work loads the machine). Two kinds of case:

- **as functions-framework starts them**: what ``functions-framework --asgi --target T`` runs
  before it listens (``functions_framework.aio.create_asgi_app`` loads ``main.py`` and wraps
  the target; ``_http.create_server`` picks the server). For ``webhook``, ``worker``,
  ``runners`` and ``sweeper`` that is ``functions/main.py`` with ``FUNCTION_TARGET`` set, as
  Cloud Functions sets it, so ``main`` builds that target's application at import with a
  cloud-shaped config (Cloud Tasks queue, Firestore store, GitHub App auth). No Google service
  is reached: the queue's endpoint and ``FIRESTORE_EMULATOR_HOST`` point at a closed loopback
  port, and clients connect lazily. The floors start the same way, from a ``main.py`` of a few
  lines in a temporary folder:
  ``bare``, an ``async def`` returning a response (the least any ASGI function costs);
  ``bare+google-auth``, the same plus ``google.auth.transport.requests``, the least a function
  that sends one authenticated REST call to Cloud Tasks with google-auth loads (the webhook's
  queue does exactly that); ``bare+google-auth+pydantic``, the same plus pydantic and PyYAML,
  which looprelay's config is read with (the least the webhook loads before any code of its
  own); ``bare+google-auth+pydantic-model``, the same plus one small model built and
  validated (``import pydantic`` alone is lazy and loads none of its model machinery);
  ``bare+tasks_v2``, the bare function plus Google's ``google.cloud.tasks_v2`` client,
  for comparison.
- **imports**: ``import functions_framework`` (``functions_framework``; the floor issue 13's
  target names) and ``import main`` with ``FUNCTION_TARGET`` unset (``main``: what every entry
  point shares).

Then it lists the webhook's 10 heaviest imports (self time) and checks that the webhook path
loads no Firestore client, no google-cloud-tasks, gRPC or protobuf (the queue speaks Cloud Tasks'
REST API itself), no libtmux and no Jinja2 beyond what Flask itself loads (functions-framework
imports Flask, which imports ``jinja2``; looprelay's renderer would add ``jinja2.sandbox``). A
``WARNING`` line says when it does. Nothing here asserts; tests/infra/test_coldstart.py does.

    .venv/bin/python bench/coldstart.py [--runs 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[1]
FUNCTIONS = ROOT / "functions"
ENTRY_POINTS = ("webhook", "worker", "runners", "sweeper", "status")
FLOORS = {
    "bare": "",
    "bare+google-auth": "import google.auth.transport.requests\n",
    "bare+google-auth+pydantic": "import google.auth.transport.requests, pydantic, yaml\n",
    # `import pydantic` alone is lazy: a config read with pydantic also pays for building and
    # running one model's validator, which loads pydantic's model machinery.
    "bare+google-auth+pydantic-model": (
        "import google.auth.transport.requests, pydantic, yaml\n"
        "class Settings(pydantic.BaseModel):\n"
        "    secret_env: str\n"
        "    retries: int = 3\n"
        "Settings.model_validate(yaml.safe_load('secret_env: S'))\n"
    ),
    "bare+tasks_v2": "from google.cloud import tasks_v2\n",
}
"""The floor functions: what each ``main.py`` imports besides functions-framework."""
BARE_MAIN = """import functions_framework.aio
from starlette.responses import Response
{imports}

@functions_framework.aio.http
async def webhook(request):
    return Response(status_code=202)
"""
FRAMEWORK_START = (
    "from functions_framework._http import create_server\n"
    "from functions_framework.aio import create_asgi_app\n"
    "create_server(create_asgi_app({target!r}, 'main.py', 'http'), False)"
)
"""What ``functions-framework --asgi --target T`` runs before it listens (``_cli.py``)."""
CLOSED_PORT = "127.0.0.1:9"  # discard: nothing listens, and nothing is sent at import
FORBIDDEN_ON_WEBHOOK = (
    "google.cloud.firestore",
    "google.cloud.tasks_v2",
    "grpc",
    "google.protobuf",
    "libtmux",
    "jinja2.sandbox",
)
TOP = 10


@dataclass(frozen=True)
class ImportLine:
    """One line of ``-X importtime``: microseconds spent in the module alone and with children."""

    module: str
    depth: int
    self_us: int
    cumulative_us: int


@dataclass(frozen=True)
class Run:
    """One measured process."""

    lines: tuple[ImportLine, ...]
    wall_ms: float
    cpu_ms: float

    @property
    def total_ms(self) -> float:
        """Every top-level import's cumulative time, startup's included."""
        return sum(line.cumulative_us for line in self.lines if line.depth == 0) / 1000

    @property
    def modules(self) -> frozenset[str]:
        """Every module the process imported."""
        return frozenset(line.module for line in self.lines)


def parse_importtime(stderr: str) -> tuple[ImportLine, ...]:
    """Read ``import time: self [us] | cumulative | imported package`` lines; skip the rest."""
    lines = []
    for raw in stderr.splitlines():
        if not raw.startswith("import time:") or "imported package" in raw:
            continue
        self_us, cumulative_us, name = raw.removeprefix("import time:").split("|", 2)
        stripped = name.lstrip(" ")
        depth = (len(name) - len(stripped) - 1) // 2
        lines.append(ImportLine(stripped.strip(), depth, int(self_us), int(cumulative_us)))
    return tuple(lines)


def cloud_env(case: str, key_pem: str, data: Path) -> dict[str, str]:
    """The environment a deployed ``case`` gets: ours minus Python and looprelay settings, plus
    a cloud-shaped config that builds offline."""
    drop = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "FUNCTION_TARGET", "LOOPRELAY_CONFIG")
    env = {k: v for k, v in os.environ.items() if k not in drop and "LOOPRELAY__" not in k}
    env["PYTHONPATH"] = str(ROOT / "shared")
    if case not in ENTRY_POINTS:
        return env
    queue = {"project": "bench", "location": "us-central1", "queue": "work"}
    queue |= {"workerUrl": "https://worker.example/", "apiEndpoint": f"http://{CLOSED_PORT}"}
    oidc = {"serviceAccountEmail": "tasks@bench.iam.gserviceaccount.com", "audience": "x"}
    return env | {
        "FUNCTION_TARGET": case,
        "FIRESTORE_EMULATOR_HOST": CLOSED_PORT,
        "BENCH_WEBHOOK_SECRET": "bench-secret",
        "BENCH_APP_KEY": key_pem,
        "LOOPRELAY__github__webhookSecrets": "[BENCH_WEBHOOK_SECRET]",
        "LOOPRELAY__github__appId": "1",
        "LOOPRELAY__github__privateKeyEnv": "BENCH_APP_KEY",
        "LOOPRELAY__queue__backend": "cloudtasks",
        "LOOPRELAY__queue__cloudtasks": json.dumps(queue),
        "LOOPRELAY__store__backend": "firestore",
        "LOOPRELAY__store__firestore__project": "bench",
        "LOOPRELAY__worker__oidc": json.dumps(oidc),
        "HOME": str(data),
    }


@dataclass(frozen=True)
class Case:
    """One measured process: what it runs, where, with which environment."""

    statement: str
    cwd: Path
    env: dict[str, str]


def build_cases(key_pem: str, data: Path) -> dict[str, Case]:
    """Every case, in the order of the table; writes the floors' ``main.py`` under ``data``."""
    plain = cloud_env("baseline", key_pem, data)
    cases = {"functions_framework": Case("import functions_framework", FUNCTIONS, plain)}
    for name, imports in FLOORS.items():
        folder = data / name
        folder.mkdir()
        (folder / "main.py").write_text(BARE_MAIN.format(imports=imports), encoding="utf-8")
        start = FRAMEWORK_START.format(target="webhook")
        cases[name] = Case(start, folder, plain | {"FUNCTION_TARGET": "webhook"})
    cases["main"] = Case("import main", FUNCTIONS, plain)
    for name in ENTRY_POINTS:
        start = FRAMEWORK_START.format(target=name)
        cases[name] = Case(start, FUNCTIONS, cloud_env(name, key_pem, data))
    return cases


def measure(name: str, case: Case) -> Run:
    """Run one process for ``case`` and parse its import times; raises when it fails."""
    started, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", case.statement],
        cwd=case.cwd,
        env=case.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    wall_ms = (time.perf_counter() - started) * 1000
    cpu_ms = (
        _cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - _cpu_seconds(usage)
    ) * 1000
    if result.returncode != 0:
        tail = "\n".join(line for line in result.stderr.splitlines() if "import time:" not in line)
        raise SystemExit(f"{name}: `{case.statement}` failed:\n{tail[-2000:]}")
    return Run(parse_importtime(result.stderr), wall_ms, cpu_ms)


def _cpu_seconds(usage: resource.struct_rusage) -> float:
    """User plus system CPU time: unlike wall time, it barely moves when other work shares the
    machine, so it is the column to compare runs made at different loads by."""
    return usage.ru_utime + usage.ru_stime


def median_run(runs: list[Run]) -> Run:
    """The run whose total is the median one (for the listing of heavy imports)."""
    ordered = sorted(runs, key=lambda run: run.total_ms)
    return ordered[len(ordered) // 2]


def _key_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()


def _warnings(webhook: Run, bare: Run) -> list[str]:
    found = [
        f"WARNING: the webhook imports {module}"
        for module in sorted(webhook.modules)
        if module in FORBIDDEN_ON_WEBHOOK
        or module.startswith(tuple(f"{prefix}." for prefix in FORBIDDEN_ON_WEBHOOK))
        or module == "looprelay.core.render"
    ]
    extra_jinja = sorted(
        m for m in webhook.modules - bare.modules if m == "jinja2" or m.startswith("jinja2.")
    )
    found += [
        f"WARNING: the webhook imports {m} beyond what a bare function loads" for m in extra_jinja
    ]
    return sorted(set(found))


def print_table(medians: dict[str, float], walls: dict[str, float], cpus: dict[str, float]) -> None:
    """One row per case: its import time as a multiple of ``import functions_framework`` (the
    issue's floor) and of the bare ASGI function started the same way (the same mode's floor),
    what it adds over the latter, and the process's wall and CPU time."""
    ff, bare = medians["functions_framework"], medians["bare"]
    header = f"{'case':<20}{'import ms':>10}{'x ff':>7}{'x bare':>8}{'+ms bare':>10}"
    print(f"{header}{'process ms':>12}{'cpu ms':>9}{'cpu x bare':>12}")
    for name, ms in medians.items():
        row = f"{name:<27}{ms:>10.1f}{ms / ff:>7.2f}{ms / bare:>8.2f}{ms - bare:>10.1f}"
        print(f"{row}{walls[name]:>12.1f}{cpus[name]:>9.1f}{cpus[name] / cpus['bare']:>12.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="measured runs per case (median)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()

    results: dict[str, list[Run]] = {}
    with tempfile.TemporaryDirectory(prefix="coldstart-") as data:
        cases = build_cases(_key_pem(), Path(data))
        results = {name: [] for name in cases}
        for name, case in cases.items():
            measure(name, case)  # warm-up: writes the .pyc files a deployment ships
        # Round-robin, so a burst of load elsewhere on the machine hits every case alike.
        for run in range(1, args.runs + 1):
            print(f"run {run} of {args.runs}", file=sys.stderr)
            for name, case in cases.items():
                results[name].append(measure(name, case))

    medians = {case: statistics.median(r.total_ms for r in runs) for case, runs in results.items()}
    walls = {case: statistics.median(r.wall_ms for r in runs) for case, runs in results.items()}
    cpus = {case: statistics.median(r.cpu_ms for r in runs) for case, runs in results.items()}
    webhook, bare = median_run(results["webhook"]), median_run(results["bare"])
    heaviest = sorted(webhook.lines, key=lambda line: line.self_us, reverse=True)[:TOP]
    warnings = _warnings(webhook, bare)
    if args.json:
        print(
            json.dumps(
                {"runs": args.runs, "import_ms": medians, "process_ms": walls, "cpu_ms": cpus}
            )
        )
        return
    print_table(medians, walls, cpus)
    print(f"\nwebhook: {TOP} heaviest imports (self ms, cumulative ms)")
    for line in heaviest:
        print(f"  {line.self_us / 1000:>7.1f} {line.cumulative_us / 1000:>8.1f}  {line.module}")
    print()
    for warning in warnings:
        print(warning)
    if not warnings:
        print(
            "ok: the webhook imports no google.cloud.firestore, google.cloud.tasks_v2, grpc, "
            "google.protobuf or libtmux, and no Jinja2 module beyond what a bare function loads"
        )


if __name__ == "__main__":
    main()
