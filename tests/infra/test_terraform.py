"""infra/ checked without Google: the Terraform parses, wires what the code reads, and scans clean.

Nothing here runs terraform or reaches Google. The HCL is read with python-hcl2 and the few
expressions the checks need are evaluated by ``_Eval`` with ``terraform.tfvars.example`` as the
variables and resource attributes as placeholders. checkov runs from its own venv (see
``_checkov``): it vendors a fork of python-hcl2 under the same module name, so the two cannot
share one environment.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore
from looprelay.app import cloud
from looprelay.config.model import Config, load_config
from looprelay.errors import ConfigError
from tests.firestore_queries import (
    QueryShape,
    argument_sets,
    query_methods,
    shape_of,
)

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
MAIN = ROOT / "functions" / "main.py"
EXAMPLE_VARS = INFRA / "terraform.tfvars.example"
REQUIRE_ENV = "LOOPRELAY_REQUIRE_FIRESTORE"
CHECKOV_BUDGET_SECONDS = 60.0
FUNCTION = "google_cloudfunctions2_function"
# Plain environment variables a function may get that no looprelay code reads, and why.
PLATFORM_ENV = {"THREADS": "functions-framework's gunicorn thread count"}
# Names the cloud entry modules read from the environment that Terraform need not set, and why.
NOT_WIRED = {
    "FUNCTION_TARGET": "set by Cloud Functions to the entry point",
    cloud.CONFIG_ENV: "optional config file; the deployment uses LOOPRELAY__ overrides instead",
}
# The handler each entry point serves, built by looprelay.app.cloud from the environment.
BUILDERS: dict[str, Callable[[Config, dict[str, str]], object]] = {
    "webhook": cloud.build_ingress,
    "worker": cloud.build_worker,
    "runners": cloud.build_runner_api,
    "sweeper": cloud.build_sweeper,
    "poller": cloud.build_poller,
    "status": lambda config, environ: cloud.build_status_reader(config),
}
# Collections whose documents carry expires_at (firestore store, runners, runner_changes).
TTL_COLLECTIONS = ("deliveries", "events", "registration_tokens", "runner_changes")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9+/_-]{32,}")
CREDENTIAL_PATTERNS = {
    "PEM block": re.compile(r"-----BEGIN [A-Z ]*(PRIVATE KEY|CERTIFICATE)-----"),
    "GitHub token": re.compile(r"\b(gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),
    "Google API key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"),
    "service-account key": re.compile(r"\"private_key(_id)?\"\s*:"),
    "AWS key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "assigned secret": re.compile(r"(?i)\b(password|secret_data|token)\s*=\s*\"[^\"$]{8,}\""),
}


def _required(what: str) -> None:
    """Skip for ``what`` missing, unless CI requires it (``LOOPRELAY_REQUIRE_FIRESTORE``)."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {what}", pytrace=False)
    pytest.skip(f"{what} (set {REQUIRE_ENV}=1 to make this a failure)")


@functools.cache
def _hcl2() -> Any:
    # bc-python-hcl2 (checkov's fork) installs the same ``hcl2`` package and overwrites it.
    try:
        importlib.metadata.version("bc-python-hcl2")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.fail(
            "bc-python-hcl2 (pulled in by checkov) is installed next to python-hcl2 and clobbers "
            "its hcl2 package; install checkov into its own venv (infra/README.md)"
        )
    try:
        import hcl2
        from hcl2.utils import SerializationOptions
    except ImportError:
        _required("python-hcl2 is not installed (pip install -e '.[test]')")
    options = SerializationOptions(
        strip_string_quotes=True, explicit_blocks=False, with_comments=False
    )
    return functools.partial(hcl2.load, serialization_options=options)


def _parse(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        parsed: dict[str, Any] = _hcl2()(handle)
    return parsed


@functools.cache
def _infra() -> dict[str, Any]:
    """Every .tf file merged: {"resource": {type: {name: body}}, "variable", "locals", ...}."""
    merged: dict[str, Any] = {"resource": {}, "variable": {}, "locals": {}, "output": {}}
    for path in sorted(INFRA.glob("*.tf")):
        parsed = _parse(path)
        for block in parsed.get("resource", []):
            for kind, named in block.items():
                merged["resource"].setdefault(kind, {}).update(named)
        for key in ("variable", "output"):
            for block in parsed.get(key, []):
                merged[key].update(block)
        for block in parsed.get("locals", []):
            merged["locals"].update(block)
    return merged


def _resources(kind: str) -> dict[str, Any]:
    return dict(_infra()["resource"].get(kind, {}))


@functools.cache
def _variables() -> dict[str, Any]:
    values = {
        name: spec["default"] for name, spec in _infra()["variable"].items() if "default" in spec
    }
    values.update(_parse(EXAMPLE_VARS))
    missing = set(_infra()["variable"]) - set(values)
    assert not missing, f"terraform.tfvars.example lacks required variables {sorted(missing)}"
    return values


# --- a small evaluator for the expressions infra/ uses ----------------------------------------

_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>\d+(?:\.\d+)?)|(?P<name>[A-Za-z_][\w-]*)'
    r"|(?P<punct>[()\[\]{},.=]))"
)

_LITERALS = ("true", "false", "null")


class _Eval:
    """Evaluates literals, var./local./each. references, resource references (as a placeholder
    naming them) and the functions concat, merge, jsonencode, tostring, toset and coalesce. Anything
    else fails the test, naming the expression: extend this class rather than guess."""

    def __init__(self, each: tuple[str, Any] | None = None) -> None:
        self._each = each

    def value(self, node: Any) -> Any:
        """Evaluate a parsed HCL value: dicts and lists element-wise, strings as templates."""
        if isinstance(node, dict):
            return {key: self.value(item) for key, item in node.items()}
        if isinstance(node, list):
            return [self.value(item) for item in node]
        if isinstance(node, str):
            return self._template(node)
        return node

    def _template(self, text: str) -> Any:
        parts, rest = [], text
        while "${" in rest:
            before, _, after = rest.partition("${")
            end = _closing(after)
            if not before and end == len(after) - 1 and not parts:
                return self.expression(after[:end])
            parts += [before, _as_text(self.expression(after[:end]))]
            rest = after[end + 1 :]
        return "".join([*parts, rest])

    def expression(self, text: str) -> Any:
        """Evaluate one expression (the inside of ``${...}``)."""
        tokens, at = [], 0
        while text[at:].strip():
            match = _TOKEN.match(text, at)
            assert match, f"cannot evaluate {text!r} at {text[at:]!r}"
            tokens.append((match.lastgroup, match.group(match.lastgroup or "")))
            at = match.end()
        value, used = self._primary(tokens, 0, text)
        assert used == len(tokens), f"cannot evaluate {text!r}"
        return value

    def _primary(self, tokens: list[tuple[str | None, str]], at: int, text: str) -> Any:
        kind, token = tokens[at]
        if kind in ("str", "num") or token in _LITERALS:
            # JSON reads HCL's string, number, true, false and null literals alike.
            return json.loads(token), at + 1
        if token == "{":
            return self._object(tokens, at + 1, text)
        if token == "[":
            return self._list(tokens, at + 1, "]", text)
        if kind == "name" and at + 1 < len(tokens) and tokens[at + 1][1] == "(":
            args, at = self._list(tokens, at + 2, ")", text)
            return _FUNCTIONS[token](*args), at
        if kind == "name":
            return self._reference(tokens, at, text)
        raise AssertionError(f"cannot evaluate {text!r} at {token!r}")

    def _list(self, tokens: list[Any], at: int, close: str, text: str) -> tuple[list[Any], int]:
        items = []
        while tokens[at][1] != close:
            item, at = self._primary(tokens, at, text)
            items.append(item)
            at += tokens[at][1] == ","
        return items, at + 1

    def _object(self, tokens: list[Any], at: int, text: str) -> tuple[dict[str, Any], int]:
        result = {}
        while tokens[at][1] != "}":
            key = tokens[at][1]
            assert tokens[at + 1][1] == "=", f"cannot evaluate {text!r}"
            result[key], at = self._primary(tokens, at + 2, text)
            at += tokens[at][1] == ","
        return result, at + 1

    def _reference(self, tokens: list[Any], at: int, text: str) -> tuple[Any, int]:
        path, at = [tokens[at][1]], at + 1
        while at < len(tokens) and tokens[at][1] in (".", "["):
            if tokens[at][1] == ".":
                path.append(tokens[at + 1][1])
                at += 2
            else:
                key, at = self._primary(tokens, at + 1, text)
                path.append(key)
                at += 1  # ]
        return self._resolve(path), at

    def _resolve(self, path: list[Any]) -> Any:
        head, *rest = path
        if head == "var":
            value = _variables()[rest.pop(0)]
        elif head == "local":
            value = _Eval().value(_infra()["locals"][rest.pop(0)])
        elif head == "each":
            assert self._each is not None, "each. outside a for_each"
            value = dict(zip(("key", "value"), self._each, strict=True))
        else:  # a resource's attribute: known only after apply
            return "<" + ".".join(str(part) for part in path) + ">"
        for part in rest:
            value = value[part]
        return value


def _closing(text: str) -> int:
    """Index of the ``}`` closing an interpolation whose body starts ``text``."""
    depth, quoted = 0, False
    for index, char in enumerate(text):
        if char == '"' and text[index - 1 : index] != "\\":
            quoted = not quoted
        elif not quoted and char == "{":
            depth += 1
        elif not quoted and char == "}":
            if depth == 0:
                return index
            depth -= 1
    raise AssertionError(f"unclosed interpolation in {text!r}")


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _coalesce(*values: Any) -> Any:
    return next(value for value in values if value not in (None, ""))


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "concat": lambda *lists: [item for items in lists for item in items],
    "merge": lambda *maps: {key: value for m in maps for key, value in m.items()},
    "jsonencode": lambda value: json.dumps(value, separators=(",", ":")),
    "tostring": _as_text,
    "toset": lambda items: list(dict.fromkeys(items)),
    "coalesce": _coalesce,
}


# --- the deployed functions, as Terraform would create them -----------------------------------


def _instances(kind: str) -> Iterator[tuple[str, dict[str, Any], _Eval]]:
    """Each instance of each resource of ``kind``: (address, body, evaluator with ``each``)."""
    for name, body in _resources(kind).items():
        if "for_each" not in body:
            yield f"{kind}.{name}", body, _Eval()
            continue
        keyed = _Eval().value(body["for_each"])
        pairs = keyed.items() if isinstance(keyed, dict) else ((key, key) for key in keyed)
        for key, value in pairs:
            yield f'{kind}.{name}["{key}"]', body, _Eval((key, value))


def _block(body: dict[str, Any], name: str) -> dict[str, Any]:
    (block,) = body[name]
    return dict(block)


def _secret_blocks(service: dict[str, Any], ev: _Eval) -> list[dict[str, Any]]:
    """The function's secret_environment_variables, static and dynamic, evaluated."""
    blocks = [ev.value(block) for block in service.get("secret_environment_variables", [])]
    for dynamic in service.get("dynamic", []):
        for label, spec in dynamic.items():
            if label != "secret_environment_variables":
                continue
            (content,) = spec["content"]
            for item in ev.value(spec["for_each"]):
                inner = {**content}
                for key, raw in content.items():
                    inner[key] = raw.replace(f"{label}.value", json.dumps(item))
                blocks.append(ev.value(inner))
    return blocks


@functools.cache
def _functions() -> dict[str, dict[str, Any]]:
    """Entry point -> {address, env, secrets (name -> secret block), service (raw)}."""
    deployed: dict[str, dict[str, Any]] = {}
    for address, body, ev in _instances(FUNCTION):
        entry_point = ev.value(_block(body, "build_config")["entry_point"])
        service = _block(body, "service_config")
        assert entry_point not in deployed, f"two functions serve {entry_point}"
        deployed[entry_point] = {
            "address": address,
            "name": ev.value(body["name"]),
            "env": ev.value(service.get("environment_variables", {})),
            "secrets": {block["key"]: block for block in _secret_blocks(service, ev)},
            "service": {key: ev.value(value) for key, value in service.items() if key != "dynamic"},
        }
    return deployed


def _entry_points() -> set[str]:
    """The @functions_framework.aio.http functions of functions/main.py."""
    tree = ast.parse(MAIN.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(ast.unparse(d) == "functions_framework.aio.http" for d in node.decorator_list)
    }


def _config(env: dict[str, str]) -> Config:
    return load_config(None, environ=env)


@pytest.fixture(scope="module")
def app_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


# --- the checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(INFRA.glob("*.tf")), ids=lambda p: p.name)
def test_every_tf_file_parses(path: Path) -> None:
    assert _parse(path), f"{path.name} is empty"


def test_example_variables_parse() -> None:
    assert _variables()["project"]


def test_each_entry_point_has_exactly_one_function_and_vice_versa() -> None:
    in_code, in_infra = _entry_points(), set(_functions())
    assert in_code, "no @functions_framework.aio.http entry point found in functions/main.py"
    assert in_code - in_infra == set(), "entry points without a function in infra/"
    assert in_infra - in_code == set(), "functions in infra/ without an entry point"


def test_every_plain_variable_is_a_valid_config_key() -> None:
    for entry_point, fn in _functions().items():
        env = fn["env"]
        unknown = {
            name for name in env if not name.startswith("LOOPRELAY__") and name not in PLATFORM_ENV
        }
        assert not unknown, f"{entry_point}: environment variables no code reads: {unknown}"
        try:
            config = _config(env)
        except ConfigError as exc:
            pytest.fail(f"{entry_point}: the environment Terraform sets is not valid:\n{exc}")
        assert config.store.backend == "firestore", entry_point
        assert config.queue.backend == "cloudtasks", entry_point


def test_the_cloud_modules_read_nothing_unwired() -> None:
    # Names (literals or module constants) read with environ.get / environ[...] by the code the
    # functions run at start-up; names held in the config are covered by the builder test.
    modules = [MAIN, *(ROOT / "shared" / "looprelay" / m for m in ("app/cloud.py", "logs.py"))]
    read = set()
    for path in modules:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("environ.get"):
                read.add(_name_of(node.args[0], constants, path))
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
                read.add(_name_of(node.slice, constants, path))
    for entry_point, fn in _functions().items():
        wired = set(fn["env"]) | set(fn["secrets"])
        missing = {name for name in read if name not in wired and name not in NOT_WIRED}
        assert not missing, f"{entry_point} reads {missing}, which infra/ does not set"


def _name_of(node: ast.expr, constants: dict[str, Any], path: Path) -> str:
    name = node.value if isinstance(node, ast.Constant) else constants.get(ast.unparse(node))
    assert isinstance(name, str), f"{path.name}: environment name {ast.unparse(node)} unknown"
    return name


def test_each_function_builds_its_handler_from_exactly_its_environment(
    app_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Firestore's client connects lazily; pointed at an emulator address it needs no
    # credentials. The Cloud Tasks client likewise, given an endpoint (a test-only override).
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", "127.0.0.1:9")
    test_only = {"LOOPRELAY__queue__cloudtasks__apiEndpoint": '"http://127.0.0.1:9"'}
    for entry_point, fn in _functions().items():
        builder = BUILDERS[entry_point]
        config = _config({**fn["env"], **test_only})
        values = {
            name: app_key if name == config.github.private_key_env else secrets.token_hex(32)
            for name in fn["secrets"]
        }
        env = {**fn["env"], **test_only, **values}
        assert builder(config, env) is not None
        # Every secret wired in is one the handler needs: without it, it refuses to start.
        for name in values:
            with pytest.raises(ConfigError, match=name):
                builder(config, {k: v for k, v in env.items() if k != name})


def test_secrets_come_from_secret_manager_and_never_as_plain_values() -> None:
    for entry_point, fn in _functions().items():
        config = _config(fn["env"])
        named = {*config.github.webhook_secrets, config.github.private_key_env}
        named |= {config.github.token_env} if config.github.token_env else set()
        leaked = named & set(fn["env"])
        assert not leaked, f"{entry_point}: secret variables set as plain values: {leaked}"
        for name, block in fn["secrets"].items():
            assert name in named, f"{entry_point}: secret {name} is not named by the config"
            assert block["secret"].startswith("<google_secret_manager_secret."), block
            assert block["project_id"] == _variables()["project"], block
    assert not _resources("google_secret_manager_secret_version"), (
        "secret values would land in files and in the Terraform state; add them with gcloud"
    )


def test_the_webhook_gets_only_webhook_secrets_the_status_page_none_and_the_rest_the_app_key() -> (
    None
):
    for entry_point, fn in _functions().items():
        config = _config(fn["env"])
        wanted = {
            "webhook": set(config.github.webhook_secrets),
            "status": set(),
        }.get(entry_point, {config.github.private_key_env})
        assert set(fn["secrets"]) == wanted, entry_point


def test_the_queue_retry_policy_and_rate_limits_are_explicit_and_match_the_config() -> None:
    (queue,) = _resources("google_cloud_tasks_queue").values()
    ev = _Eval()
    retry, rates = ev.value(_block(queue, "retry_config")), ev.value(_block(queue, "rate_limits"))
    assert set(retry) == {
        "max_attempts",
        "min_backoff",
        "max_backoff",
        "max_doublings",
        "max_retry_duration",
    }
    assert set(rates) == {"max_dispatches_per_second", "max_concurrent_dispatches"}
    seconds = {key: float(retry[key].removesuffix("s")) for key in retry if "backoff" in key}
    assert 0 < seconds["min_backoff"] <= seconds["max_backoff"]
    assert 0 < float(retry["max_retry_duration"].removesuffix("s")) <= 3 * 24 * 3600
    assert 0 < rates["max_dispatches_per_second"] <= 500
    assert 1 <= rates["max_concurrent_dispatches"] <= 5000
    config = _config(_functions()["webhook"]["env"]).queue
    assert config.retry.max_attempts == retry["max_attempts"]
    assert config.retry.min_backoff_seconds == seconds["min_backoff"]
    assert config.retry.max_backoff_seconds == seconds["max_backoff"]
    assert config.retry.max_doublings == retry["max_doublings"]
    assert config.cloudtasks.queue == "<google_cloud_tasks_queue.deliveries.name>"


def _invokers() -> dict[str, dict[str, str]]:
    """Function key -> {IAM binding address: member} of every invoker binding in infra/."""
    invokers: dict[str, dict[str, str]] = {}
    for kind, named in _infra()["resource"].items():
        if not re.fullmatch(
            r"google_(cloud_run(_v2)?_service|cloudfunctions2?_function)_iam_\w+", kind
        ):
            continue
        for name, body in named.items():
            assert kind.endswith("_member"), f"{kind}.{name}: use _member, never replace a policy"
            target = body.get("service") or body.get("name") or body.get("cloud_function")
            key = re.search(rf'{FUNCTION}\.fn\["(\w+)"\]', target)
            assert key, f"{kind}.{name} names no function: {target}"
            assert body["role"] in ("roles/run.invoker", "roles/cloudfunctions.invoker")
            invokers.setdefault(key.group(1), {})[f"{kind}.{name}"] = body["member"]
    return invokers


def test_who_may_invoke_each_function() -> None:
    invokers = {key: set(bindings.values()) for key, bindings in _invokers().items()}
    assert invokers["worker"] == {"${google_service_account.tasks.member}"}
    assert invokers["sweeper"] == {"${google_service_account.scheduler.member}"}
    assert invokers["poller"] == {"${google_service_account.scheduler.member}"}
    public = {key for key, members in invokers.items() if "allUsers" in members}
    assert public == {"webhook", "runners"}, "only the HMAC- and secret-checked functions"
    config = _config(_functions()["webhook"]["env"])
    assert config.queue.cloudtasks.service_account_email == "<google_service_account.tasks.email>"
    assert config.worker.oidc is not None
    assert config.worker.oidc.service_account_email == config.queue.cloudtasks.service_account_email
    assert config.worker.oidc.audience == config.queue.cloudtasks.worker_url
    worker_name = _functions()["worker"]["name"]
    assert config.queue.cloudtasks.worker_url.endswith(f".cloudfunctions.net/{worker_name}")
    jobs = _resources("google_cloud_scheduler_job")
    assert set(jobs) == {"sweeper", "poller"}
    for name, job in jobs.items():
        target = _block(job, "http_target")
        oidc = _block(target, "oidc_token")
        assert oidc["service_account_email"] == "${google_service_account.scheduler.email}"
        assert target["uri"] == f'${{google_cloudfunctions2_function.fn["{name}"].url}}'
        assert oidc["audience"] == target["uri"]


def test_the_functions_that_queue_tasks_may_enqueue_and_sign_them_and_no_other() -> None:
    # The worker queues wakes (core/wake.py): without both grants Cloud Tasks refuses them
    # and every lone comment's attempt falls back to waiting out its window.
    def functions(kind: str, role: str) -> set[str]:
        members = {body["member"] for body in _resources(kind).values() if body["role"] == role}
        return {m for m in members if m.startswith('${google_service_account.fn["')}

    queuing = {
        f'${{google_service_account.fn["{key}"].member}}' for key in ("webhook", "poller", "worker")
    }
    enqueue = functions("google_cloud_tasks_queue_iam_member", "roles/cloudtasks.enqueuer")
    assert enqueue == queuing
    acts = functions("google_service_account_iam_member", "roles/iam.serviceAccountUser")
    assert acts == queuing
    for body in _resources("google_service_account_iam_member").values():
        assert body["service_account_id"] == "${google_service_account.tasks.name}"


def test_the_status_page_has_a_function_of_its_own_for_operators_only() -> None:
    """Issue 22: on the sweeper (one request, one instance) a sweep held the page up and a
    page view could make a scheduled sweep be skipped."""
    service = _functions()["status"]["service"]
    assert service["max_instance_request_concurrency"] > 1
    assert 1 <= service["max_instance_count"] <= 3
    sweeper = _functions()["sweeper"]["service"]
    assert sweeper["max_instance_request_concurrency"] == 1
    # Its invokers are operator_members, one binding each, and nobody public.
    bindings = _invokers()["status"]
    assert set(bindings.values()) == {"${each.value}"}, bindings
    for address in bindings:
        kind, name = address.split(".")
        assert _resources(kind)[name]["for_each"] == "${toset(var.operator_members)}", address
    assert "allUsers" not in bindings.values()


def test_the_status_function_may_read_firestore_and_nothing_else() -> None:
    # Grants name it directly, or per function key (for_each over function names); secret
    # access follows local.functions' secret_env, checked empty here.
    direct, keyed = '${google_service_account.fn["status"].member}', "fn[each.key]"
    roles = set()
    for kind, named in _infra()["resource"].items():
        for name, body in named.items():
            member = str(body.get("member", ""))
            granted = member == direct or (
                keyed in member and "status" in _Eval().value(body["for_each"])
            )
            if kind.endswith("_iam_member") and granted:
                roles.add(body["role"])
                assert "database" in body["condition"][0]["expression"], f"{kind}.{name}"
    assert roles == {"roles/datastore.viewer"}
    assert _functions()["status"]["secrets"] == {}


def test_firestore_ttl_policies_cover_every_expiring_collection() -> None:
    prefix = _variables()["collection_prefix"]
    ttl = {}
    for address, body, ev in _instances("google_firestore_field"):
        if "ttl_config" in body:
            ttl[ev.value(body["collection"])] = ev.value(body["field"])
            assert body.get("index_config") == [{}], f"{address}: exempt the TTL field"
    assert {f"{prefix}{name}": "expires_at" for name in TTL_COLLECTIONS}.items() <= ttl.items()
    adapters = "".join(
        p.read_text()
        for p in (ROOT / "shared" / "looprelay" / "adapters" / "firestore").glob("*.py")
    )
    for name in TTL_COLLECTIONS:
        assert f'{{collection_prefix}}{name}"' in adapters, f"no adapter writes {name} any more"


def _declared_indexes() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """(collection without the prefix, fields) of every composite index infra declares."""
    prefix = _variables()["collection_prefix"]
    declared = set()
    for _, body, ev in _instances("google_firestore_index"):
        fields = []
        for dynamic in body.get("dynamic", []):
            spec = dynamic["fields"]
            fields += [tuple(pair) for pair in ev.value(spec["for_each"])]
        fields += [(f["field_path"], f["order"]) for f in ev.value(body.get("fields", []))]
        declared.add((ev.value(body["collection"]).removeprefix(prefix), tuple(fields)))
    return declared


def test_composite_indexes_serve_every_query_the_adapters_send(
    firestore_store: FirestoreStore,
    firestore_work_item_store: FirestoreWorkItemStore,
    firestore_runner_registry: FirestoreRunnerRegistry,
    record_queries: list[Any],
) -> None:
    """Production refuses a query no index serves; the emulator does not, so every query
    method is run here with every combination of its filters and each shape checked."""
    adapters = (firestore_store, firestore_work_item_store, firestore_runner_registry)
    shapes: set[QueryShape] = set()
    for adapter in adapters:
        for name in query_methods(type(adapter)):
            method = getattr(adapter, name)
            for arguments in argument_sets(method):
                sent = len(record_queries)
                method(**arguments)
                where = f"{type(adapter).__name__}.{name}"
                assert len(record_queries) > sent, f"{where}({arguments}) sent no query"
                shapes |= {shape_of(query, where) for query in record_queries[sent:]}
    declared = _declared_indexes()

    unserved = [s for s in shapes if s.needs_composite() and not s.served_by(declared)]
    unused = {i for i in declared if not any(s.could_use(i) for s in shapes)}

    assert not unserved, "declare these in infra/firestore.tf: " + "; ".join(map(str, unserved))
    assert len({s.method for s in shapes}) >= 6  # the search found the query methods
    assert not unused, f"no query needs these indexes any more: {unused}"


def test_firestore_is_native_mode_and_outputs_name_both_urls() -> None:
    (database,) = _resources("google_firestore_database").values()
    assert database["type"] == "FIRESTORE_NATIVE"
    outputs = _infra()["output"]
    assert 'fn["webhook"]' in outputs["webhook_url"]["value"]
    assert 'fn["runners"]' in outputs["runner_api_url"]["value"]
    operator = Config.model_validate(_Eval().expression("local.operator_config"))
    deployed = _config(_functions()["worker"]["env"])
    assert operator.store == deployed.store
    assert operator.queue.cloudtasks == deployed.queue.cloudtasks


def test_nothing_in_infra_looks_like_a_credential_or_a_project_id() -> None:
    for path in sorted(p for p in INFRA.rglob("*") if p.is_file() and ".terraform" not in p.parts):
        text = path.read_text(encoding="utf-8")
        for what, pattern in CREDENTIAL_PATTERNS.items():
            found = pattern.search(text)
            assert not found, f"{path.name}: {what}: {found.group(0)[:12]}..."
        random = [word for word in _TOKEN_LIKE.findall(text) if _looks_random(word)]
        assert not random, f"{path.name}: random-looking strings {[w[:8] for w in random]}"
    for address, body in _project_holders():
        for key in ("project", "project_id"):
            if key in body:
                assert body[key] == "${var.project}", f"{address}.{key} = {body[key]!r}"


def _looks_random(word: str) -> bool:
    """A key or token: letters and digits mixed, and hex or about 4+ bits per character."""
    if not (any(c.isdigit() for c in word) and any(c.isalpha() for c in word)):
        return False
    counts = [word.count(char) for char in set(word)]
    entropy = -sum(n / len(word) * math.log2(n / len(word)) for n in counts)
    return entropy >= 4.0 or re.fullmatch(r"[0-9a-fA-F]+", word) is not None


def _project_holders() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every provider, resource and function service_config block (they name projects)."""
    for path in sorted(INFRA.glob("*.tf")):
        for block in _parse(path).get("provider", []):
            yield from ((f"provider.{name}", body) for name, body in block.items())
    for kind, named in _infra()["resource"].items():
        for name, body in named.items():
            yield f"{kind}.{name}", body
            for block in body.get("service_config", []):
                yield f"{kind}.{name}.service_config", block


# --- checkov ----------------------------------------------------------------------------------

_SKIP_COMMENT = re.compile(r"#\s*checkov:skip=(CKV2?_[A-Z]+_\d+)(?::(.*))?")
_SEVERE = ("HIGH", "CRITICAL")
# --skip-download: no calls to Prisma Cloud (offline, checkov then reports no severities).
# No --quiet: the JSON then lists the skipped checks too, so each one's reason is checked.
CHECKOV_ARGS = ("--framework", "terraform", "--compact", "-o", "json", "--skip-download")


def _checkov() -> Path:
    """checkov next to this interpreter (the venv's bin; a symlink into checkov's own venv is
    fine), else on PATH."""
    beside = Path(sys.executable).parent / "checkov"
    found = beside if beside.exists() else shutil.which("checkov")
    if found is None:
        _required("checkov is not installed (infra/README.md: its own venv, linked into .venv/bin)")
    return Path(found)


def test_checkov_finds_no_unjustified_failure() -> None:
    checkov = _checkov()
    started = time.monotonic()
    run = subprocess.run(
        [str(checkov), "-d", str(INFRA), *CHECKOV_ARGS],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert run.returncode in (0, 1), run.stderr[-2000:]
    report = json.loads(run.stdout)
    reports = report if isinstance(report, list) else [report]
    results = [r.get("results", {}) for r in reports]
    summary = [r.get("summary", {}) for r in reports]
    assert all(s.get("parsing_errors", 0) == 0 for s in summary), summary
    failed = [c for r in results for c in r.get("failed_checks", [])]
    unjustified = [
        f"{c['check_id']} {c['resource']}: {c['check_name']} (severity {c.get('severity')})"
        for c in failed
        if c.get("severity") in (None, *_SEVERE)
    ]
    assert not unjustified, "checkov failures (fix, or suppress inline with a reason):\n" + (
        "\n".join(unjustified)
    )
    for check in (c for r in results for c in r.get("skipped_checks", [])):
        reason = check["check_result"].get("suppress_comment") or ""
        assert len(reason) >= 20 and reason != "No comment provided", check["check_id"]
    for path in INFRA.glob("*.tf"):
        for match in _SKIP_COMMENT.finditer(path.read_text(encoding="utf-8")):
            assert len((match.group(2) or "").strip()) >= 20, f"{path.name}: {match.group(0)}"
    print(f"checkov: {summary} in {elapsed:.1f} s")
    if elapsed > CHECKOV_BUDGET_SECONDS:
        print(f"checkov took {elapsed:.0f} s, over the {CHECKOV_BUDGET_SECONDS:.0f} s budget")


def test_a_held_poll_is_answered_before_the_runner_api_times_out() -> None:
    """Polls are held for minutes (issue 22), and still end before the platform cuts them."""
    functions = _Eval().value(_infra()["locals"]["functions"])
    variables = _variables()
    wait = variables["runner_poll_wait_seconds"]
    assert _functions()["runners"]["env"]["LOOPRELAY__runners__pollWaitSeconds"] == str(wait)
    assert wait >= 120, "an idle runner's poll is held for minutes"
    assert functions["runners"]["timeout_seconds"] >= wait + 30
