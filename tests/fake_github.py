"""A loopback fake of the few GitHub REST endpoints ``GitHubRest`` calls, over real HTTP.

It answers as GitHub's docs describe ("REST API endpoints for issue comments", "... for
reactions", "Generating an installation access token for a GitHub App"):

- ``POST /app/installations/{id}/access_tokens`` verifies the App's RS256 JWT against the public
  key the test configured (signature, ``iss``, ``iat`` not ahead, ``exp`` at most 10 min ahead)
  and issues an installation token acting as ``app_login``;
- ``POST|GET /repos/{o}/{r}/issues/{n}/comments`` creates (201) or lists comments, paginated
  with ``per_page``/``page`` and a ``Link`` header;
- ``GET /repos/{o}/{r}/issues/comments/{id}`` reads one;
- ``POST /repos/{o}/{r}/{issues|pulls}/comments/{id}/reactions``: 201 new, 200 existing;
- ``GET /app/hook/deliveries`` lists ``app_deliveries`` newest first, ``per_page`` at a time,
  with a ``Link: <...&cursor=...>; rel="next"`` header, and ``POST
  /app/hook/deliveries/{id}/attempts`` records the id in ``redelivered`` (202) and adds the new
  attempt (``redelivery_status``, at ``attempt_clock``) to the log; both need the App's JWT, as on
  GitHub (docs: "REST API endpoints for GitHub App webhooks"). With ``app_quota`` set, the
  App's calls carry ``x-ratelimit-*`` headers and once it is spent answer 403 until a test
  refills it, as GitHub's primary rate limit does.

The GitHub App manifest flow (docs: "Registering a GitHub App from a manifest"): ``POST
/settings/apps/new?state=`` (or ``/organizations/{org}/settings/apps/new``) takes the form's
``manifest``, checks its fields (``manifest_problems``) and redirects to its ``redirect_url``
with a code and the state; ``POST /app-manifests/{code}/conversions`` answers the code once
(201, the documented fields) with a new App whose key this fake then verifies JWTs with.
``GET /app`` (the App's JWT) and ``GET /user`` (a token) say who a credential is. A path under
``/api/v3`` is served as GitHub Enterprise Server's API is.

``fake.poll`` serves the listings the poll ingress reads (``tests/fake_github_poll.py``).

Every request is recorded; :meth:`FakeGitHub.script` answers the next N matching calls with a
chosen status/headers/body and/or a delay. Time (JWT and token expiry) comes from ``clock``.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fake_github_poll import PollListings
from tests.loopback import LoopbackServer

REPOSITORY = "octo/widgets"
APP_ID = 4242
APP_LOGIN = "looprelay-test[bot]"
INSTALLATION_ID = 77
MAX_BODY_CHARS = 65_536
HOLD_SECONDS = 60.0
"""The longest a scripted answer held with ``until`` waits: a test that never releases it
fails on its own timeout, not by hanging the fake."""
REACTIONS = frozenset({"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"})

_REPO = r"/repos/(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"/app/installations/(?P<id>\d+)/access_tokens"), "_issue_token"),
    ("POST", re.compile(_REPO + r"/issues/(?P<number>\d+)/comments"), "_create_comment"),
    ("GET", re.compile(_REPO + r"/issues/(?P<number>\d+)/comments"), "_list_comments"),
    ("GET", re.compile(_REPO + r"/issues/comments/(?P<id>\d+)"), "_get_comment"),
    ("GET", re.compile(_REPO + r"/labels/(?P<name>[^/]+)"), "_get_label"),
    (
        "POST",
        re.compile(_REPO + r"/(?P<kind>issues|pulls)/comments/(?P<id>\d+)/reactions"),
        "_react",
    ),
]
_APP_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"/app/hook/deliveries"), "_list_deliveries"),
    ("POST", re.compile(r"/app/hook/deliveries/(?P<id>\d+)/attempts"), "_redeliver"),
    ("GET", re.compile(r"/app"), "_get_app"),
    ("GET", re.compile(r"/app/installations"), "_list_installations"),
]
_FLOW_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(r"(/organizations/(?P<org>[^/]+))?/settings/apps/new"), "_new_app"),
    ("POST", re.compile(r"/app-manifests/(?P<code>[^/]+)/conversions"), "_convert"),
    ("GET", re.compile(r"/user"), "_user"),
    ("GET", re.compile(r"/installation/repositories"), "_installation_repositories"),
]
_KINDS = {"issues": "issue", "pulls": "review"}
Answer = tuple[int, dict[str, str], Any]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as it arrived."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    json: Any
    at: float = field(default_factory=time.monotonic)
    """When it arrived (``time.monotonic``), to check the waits between retries."""


@dataclass
class FakeComment:
    """A stored comment; ``author`` None is GitHub's ``"user": null``."""

    id: int
    repository: str
    number: int
    author: str | None
    body: str
    kind: str = "issue"
    reactions: list[tuple[str, str]] = field(default_factory=list)  # (login, content)


@dataclass(frozen=True)
class FakeDelivery:
    """One attempt in the App's delivery log; ``status_code`` 2xx is GitHub's "OK"."""

    id: int
    guid: str
    delivered_at: datetime
    status_code: int
    event: str = "issue_comment"
    redelivery: bool = False


@dataclass
class _Listing:
    """The delivery log newest first and by id, for the list it was built from (``key``)."""

    key: tuple[int, int]
    ordered: list[FakeDelivery]
    by_id: dict[int, FakeDelivery]
    max_id: int

    @classmethod
    def of(cls, deliveries: list[FakeDelivery]) -> _Listing:
        ordered = sorted(deliveries, key=lambda d: (d.delivered_at, d.id), reverse=True)
        by_id = {d.id: d for d in ordered}
        return cls((id(deliveries), len(deliveries)), ordered, by_id, max(by_id, default=0))

    def add(self, attempt: FakeDelivery, length: int) -> None:
        """Index a newly appended attempt; only the newest is added in place."""
        self.max_id = max(self.max_id, attempt.id)
        newest = self.ordered[0] if self.ordered else None
        if newest is None or (attempt.delivered_at, attempt.id) >= (newest.delivered_at, newest.id):
            self.ordered.insert(0, attempt)
            self.by_id[attempt.id] = attempt
            self.key = (self.key[0], length)


@dataclass
class _Scripted:
    pattern: re.Pattern[str]
    remaining: int
    status: int | None
    headers: dict[str, str]
    body: Any
    delay: float
    after: bool
    until: threading.Event | None


@dataclass(frozen=True)
class AppKey:
    """An App's RSA key pair: the PEM the client signs with, the public key the fake checks."""

    private_pem: str
    public_key: rsa.RSAPublicKey


class FakeGitHub:
    """The fake's state and routes; start it, point ``GitHubRest(api_url=fake.url)`` at it."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.comments: dict[int, FakeComment] = {}
        self.repositories = {REPOSITORY}
        self.tokens: dict[str, str] = {}  # accepted token -> the login it acts as
        self.issued: list[tuple[int, str, float]] = []  # (installation, token, expires at)
        self.jwt_claims: list[dict[str, Any]] = []  # claims of every App JWT accepted
        self.app_id = APP_ID
        self.app_login = APP_LOGIN
        self.app_public_key: rsa.RSAPublicKey | None = None
        self.installations = {INSTALLATION_ID}
        self.app_deliveries: list[FakeDelivery] = []  # any order; listed newest first
        self.redelivered: list[int] = []  # attempt ids of every accepted redelivery request
        self.redelivery_status = 202  # what the new attempt of a redelivery gets
        self.attempt_clock: Callable[[], datetime] = lambda: datetime.now(UTC)  # its time
        self.app_quota: int | None = None  # App calls left before the rate limit; None: no limit
        self.token_ttl_seconds = 3600.0
        self.clock: Callable[[], float] = time.time
        self._script: list[_Scripted] = []
        self._next_id = 1000
        self._listing: _Listing | None = None
        self.labels: dict[str, set[str]] = {}  # repository -> the labels it has
        self.manifests: list[dict[str, Any]] = []  # every manifest posted, as parsed
        self.manifest_owner: str | None = None  # the organization of the last one, if any
        self.created: dict[str, Any] | None = None  # the conversion's answer, once made
        self._codes: dict[str, dict[str, Any]] = {}  # code -> its manifest, until converted
        self._lock = threading.Lock()
        self._loopback = LoopbackServer(_handler_for(self))
        self.poll = PollListings(
            self, REPOSITORY
        )  # the poll ingress's listings (tests/fake_github_poll.py)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, the ``api_url`` to give the client."""
        return self._loopback.url

    def add_comment(
        self,
        body: str,
        *,
        number: int = 1,
        author: str | None = "octocat",
        kind: str = "issue",
        repository: str = REPOSITORY,
    ) -> int:
        """Store a comment on ``repository#number`` as if someone posted it; return its id."""
        with self._lock:
            return self._store(repository, number, author, body, kind).id

    def on(self, number: int, repository: str = REPOSITORY) -> list[FakeComment]:
        """The comments on ``repository#number``, oldest first."""
        with self._lock:
            return [
                c
                for c in self.comments.values()
                if (c.repository, c.number, c.kind) == (repository, number, "issue")
            ]

    def script(
        self,
        count: int = 1,
        *,
        match: str = "",
        status: int | None = None,
        headers: dict[str, str] | None = None,
        body: Any = None,
        delay: float = 0.0,
        after: bool = False,
        until: threading.Event | None = None,
    ) -> None:
        """Answer the next ``count`` calls whose ``"METHOD /path"`` matches ``match`` (a regex,
        searched) with ``status``, ``headers`` and ``body`` after ``delay`` seconds; status None
        answers as usual after the delay (a hang). ``after``: the call is carried out first
        (a comment is stored) and only its answer is replaced, as when GitHub did the work and
        a proxy answers 502 or the answer never arrives. ``until``: the answer waits, after
        the delay, until the test sets it (at most ``HOLD_SECONDS``), to hold a caller mid-call."""
        entry = _Scripted(
            re.compile(match), count, status, headers or {}, body, delay, after, until
        )
        with self._lock:
            self._script.append(entry)

    def calls(self, method: str, path_pattern: str = "") -> list[RecordedRequest]:
        """Recorded requests with ``method`` whose path matches ``path_pattern`` (searched)."""
        with self._lock:
            return [
                r for r in self.requests if r.method == method and re.search(path_pattern, r.path)
            ]

    def deliver(self, event: str, payload: dict[str, Any], *, delivery_id: str) -> int:
        """Post ``payload`` to the created App's webhook URL, signed with its webhook secret as
        GitHub signs (``X-Hub-Signature-256``); return the HTTP status."""
        import hashlib
        import hmac

        import requests

        assert self.created is not None, "no App was created"
        body = json.dumps(payload).encode()
        secret = self.created["webhook_secret"].encode()
        signature = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery_id,
            "X-Hub-Signature-256": signature,
            "X-GitHub-Hook-Installation-Target-ID": str(self.app_id),
        }
        response = requests.post(self.created["hook_url"], data=body, headers=headers, timeout=30)
        return response.status_code

    def start(self) -> None:
        """Serve in a background thread."""
        self._loopback.start()

    def stop(self) -> None:
        """Stop serving and release the port (hanging handlers are daemon threads)."""
        self._loopback.stop()

    def answer(self, request: RecordedRequest) -> Answer:
        """Record ``request`` and answer it: as scripted, or as GitHub would."""
        with self._lock:
            self.requests.append(request)
            scripted = self._take_script(f"{request.method} {request.path}")
        if scripted is None:
            with self._lock:
                return self._route(request)
        if scripted.after:
            with self._lock:
                usual = self._route(request)
        time.sleep(scripted.delay)
        if scripted.until is not None:
            scripted.until.wait(HOLD_SECONDS)
        if scripted.status is not None:
            return scripted.status, scripted.headers, scripted.body
        if scripted.after:
            return usual
        with self._lock:
            return self._route(request)

    def _take_script(self, line: str) -> _Scripted | None:
        for entry in self._script:
            if entry.remaining > 0 and entry.pattern.search(line):
                entry.remaining -= 1
                return entry
        return None

    def _route(self, request: RecordedRequest) -> Answer:
        return self._flow(request) or self._api_route(request)

    def _api_route(self, request: RecordedRequest) -> Answer:
        for method, pattern, name in _APP_ROUTES:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                return self._as_app(request, name, match.groupdict())
        for method, pattern, name in _ROUTES:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                if name == "_issue_token":
                    return self._issue_token(request, int(match["id"]))
                login = self._login(request.headers)
                if login is None:
                    return _error(401, "Bad credentials")
                if match["repo"] not in self.repositories:
                    return _error(404, "Not Found")
                handler: Callable[..., Answer] = getattr(self, name)
                return handler(request, login, **match.groupdict())
        listed = self.poll.route(request)
        return listed if listed is not None else _error(404, "Not Found")

    def _flow(self, request: RecordedRequest) -> Answer | None:
        for method, pattern, name in _FLOW_ROUTES:
            match = pattern.fullmatch(request.path)
            if match and method == request.method:
                handler: Callable[..., Answer] = getattr(self, name)
                return handler(request, **match.groupdict())
        return None

    def _as_app(self, request: RecordedRequest, name: str, args: dict[str, str]) -> Answer:
        _, _, token = request.headers.get("authorization", "").partition(" ")
        if self._verify_jwt(token) is None:  # an installation token is refused too
            return _error(401, "A JSON web token could not be decoded")
        if self.app_quota is None:
            handler: Callable[..., Answer] = getattr(self, name)
            return handler(request, **args)
        limits = {"x-ratelimit-limit": "5000", "x-ratelimit-reset": str(int(self.clock()) + 3600)}
        if self.app_quota <= 0:
            status, _, body = _error(403, "API rate limit exceeded for app ID 4242.")
            return status, limits | {"x-ratelimit-remaining": "0"}, body
        self.app_quota -= 1
        status, headers, body = getattr(self, name)(request, **args)
        return status, headers | limits | {"x-ratelimit-remaining": str(self.app_quota)}, body

    def _login(self, headers: dict[str, str]) -> str | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() not in ("bearer", "token"):
            return None
        for _installation, issued, expires_at in self.issued:
            if issued == token and self.clock() < expires_at:
                return self.app_login
        return self.tokens.get(token)

    def _issue_token(self, request: RecordedRequest, installation_id: int) -> Answer:
        _, _, token = request.headers.get("authorization", "").partition(" ")
        claims = self._verify_jwt(token)
        if claims is None:
            return _error(401, "A JSON web token could not be decoded")
        if installation_id not in self.installations:
            return _error(404, "Not Found")
        self.jwt_claims.append(claims)
        issued = f"ghs_fake{len(self.issued) + 1:04d}"
        expires_at = int(self.clock() + self.token_ttl_seconds)
        self.issued.append((installation_id, issued, expires_at))
        stamp = datetime.fromtimestamp(expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return 201, {}, {"token": issued, "expires_at": stamp, "repository_selection": "all"}

    def _verify_jwt(self, token: str) -> dict[str, Any] | None:
        if self.app_public_key is None:
            return None
        options = {"verify_exp": False, "verify_iat": False, "require": ["iat", "exp", "iss"]}
        try:
            claims = jwt.decode(token, self.app_public_key, algorithms=["RS256"], options=options)
        except jwt.PyJWTError:
            return None
        now = self.clock()
        fresh = claims["iat"] <= now + 1 and now < claims["exp"] <= now + 600
        return claims if fresh and claims["iss"] == str(self.app_id) else None

    def _create_comment(
        self, request: RecordedRequest, login: str, repo: str, number: str
    ) -> Answer:
        body = (request.json or {}).get("body")
        if not isinstance(body, str) or not body or len(body) > MAX_BODY_CHARS:
            return _error(422, "Validation Failed")
        return 201, {}, self._render(self._store(repo, int(number), login, body, "issue"))

    def _list_comments(
        self, request: RecordedRequest, login: str, repo: str, number: str
    ) -> Answer:
        per_page = min(int(request.query.get("per_page", ["30"])[0]), 100)
        page = int(request.query.get("page", ["1"])[0])
        listed = [
            c
            for c in self.comments.values()
            if (c.repository, c.number, c.kind) == (repo, int(number), "issue")
        ]
        last = max(1, -(-len(listed) // per_page))
        links = {"next": page + 1, "last": last} if page < last else {}
        base = f"{self.url}{request.path}"
        link = ", ".join(
            f'<{base}?{urlencode({"per_page": per_page, "page": to})}>; rel="{rel}"'
            for rel, to in links.items()
        )
        chunk = listed[(page - 1) * per_page : page * per_page]
        return 200, {"Link": link} if link else {}, [self._render(c) for c in chunk]

    def _get_comment(self, request: RecordedRequest, login: str, repo: str, id: str) -> Answer:
        comment = self.comments.get(int(id))
        if comment is None or (comment.repository, comment.kind) != (repo, "issue"):
            return _error(404, "Not Found")
        return 200, {}, self._render(comment)

    def _react(self, request: RecordedRequest, login: str, repo: str, kind: str, id: str) -> Answer:
        comment = self.comments.get(int(id))
        if comment is None or (comment.repository, comment.kind) != (repo, _KINDS[kind]):
            return _error(404, "Not Found")
        content = (request.json or {}).get("content")
        if content not in REACTIONS:
            return _error(422, "Validation Failed")
        reaction = {"id": int(id) * 10 + len(comment.reactions), "content": content}
        if (login, content) in comment.reactions:
            return 200, {}, reaction
        comment.reactions.append((login, content))
        return 201, {}, reaction

    def _list_deliveries(self, request: RecordedRequest) -> Answer:
        per_page = min(int(request.query.get("per_page", ["30"])[0]), 100)
        start = int(request.query.get("cursor", ["v1_0"])[0].removeprefix("v1_"))
        ordered = self._indexed_deliveries().ordered
        chunk = ordered[start : start + per_page]
        headers = {}
        if start + per_page < len(ordered):
            query = urlencode({"per_page": per_page, "cursor": f"v1_{start + per_page}"})
            headers["Link"] = f'<{self.url}{request.path}?{query}>; rel="next"'
        return 200, headers, [_render_delivery(d) for d in chunk]

    def _redeliver(self, request: RecordedRequest, id: str) -> Answer:
        listing = self._indexed_deliveries()
        original = listing.by_id.get(int(id))
        if original is None:
            return _error(404, "Not Found")
        self.redelivered.append(int(id))
        attempt = FakeDelivery(
            id=listing.max_id + 1,
            guid=original.guid,
            delivered_at=self.attempt_clock().replace(microsecond=0),
            status_code=self.redelivery_status,
            event=original.event,
            redelivery=True,
        )
        self.app_deliveries.append(attempt)
        listing.add(attempt, len(self.app_deliveries))
        return 202, {}, {}

    def _new_app(self, request: RecordedRequest, org: str | None) -> Answer:
        raw = (request.json or {}).get("manifest", [""])
        state = request.query.get("state", [""])[0]
        try:
            manifest = json.loads(raw[0] if isinstance(raw, list) else raw)
        except ValueError:
            return _error(422, "manifest is not JSON")
        problems = manifest_problems(manifest)
        if problems or not state:
            return _error(422, "; ".join(problems) or "no state")
        self.manifests.append(manifest)
        self.manifest_owner = org
        code = f"code{len(self.manifests):04d}"
        self._codes[code] = manifest
        query = urlencode({"code": code, "state": state})
        return 302, {"Location": f"{manifest['redirect_url']}?{query}"}, None

    def _convert(self, request: RecordedRequest, code: str) -> Answer:
        manifest = self._codes.pop(code, None)
        if manifest is None:
            return _error(404, "Not Found")
        key = make_app_key()
        self.app_public_key = key.public_key
        self.app_id += 1
        slug = f"{manifest['name']}-{self.app_id}"
        owner = self.manifest_owner or "octocat"
        self.created = {
            "id": self.app_id,
            "slug": slug,
            "node_id": f"A_kw{self.app_id}",
            "owner": {"login": owner, "id": 1, "type": "User"},
            "name": manifest["name"],
            "description": None,
            "external_url": manifest["url"],
            "html_url": f"https://github.com/apps/{slug}",
            "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z",
            "permissions": manifest["default_permissions"],
            "events": manifest["default_events"],
            "client_id": f"Iv1.{self.app_id:016x}",
            "client_secret": "fake-client-secret-" + "0" * 21,
            "webhook_secret": f"fake-webhook-secret-{self.app_id:020d}",
            "pem": key.private_pem,
            "hook_url": manifest["hook_attributes"]["url"],
        }
        return 201, {}, {k: v for k, v in self.created.items() if k != "hook_url"}

    def _get_app(self, request: RecordedRequest) -> Answer:
        created = self.created or {}
        return 200, {}, {"id": self.app_id, "slug": created.get("slug", "looprelay-test")}

    def _list_installations(self, request: RecordedRequest) -> Answer:
        return 200, {}, [{"id": i, "app_id": self.app_id} for i in sorted(self.installations)]

    def _installation_repositories(self, request: RecordedRequest) -> Answer:
        if self._login(request.headers) != self.app_login:
            return _error(401, "Bad credentials")
        listed = [{"full_name": name} for name in sorted(self.repositories)]
        return 200, {}, {"total_count": len(listed), "repositories": listed}

    def _get_label(self, request: RecordedRequest, login: str, repo: str, name: str) -> Answer:
        label = unquote(name)
        if label not in self.labels.get(repo, set()):
            return _error(404, "Not Found")
        return 200, {}, {"name": label, "color": "0e8a16"}

    def _user(self, request: RecordedRequest) -> Answer:
        login = self._login(request.headers)
        if login is None:
            return _error(401, "Bad credentials")
        return 200, {}, {"login": login, "id": 1, "type": "User"}

    def _indexed_deliveries(self) -> _Listing:
        """``app_deliveries`` newest first and by id, sorted again only when a test changed
        the list (a test may list tens of thousands of attempts, page by page)."""
        key = (id(self.app_deliveries), len(self.app_deliveries))
        if self._listing is None or self._listing.key != key:
            self._listing = _Listing.of(self.app_deliveries)
        return self._listing

    def _store(
        self, repo: str, number: int, author: str | None, body: str, kind: str
    ) -> FakeComment:
        self._next_id += 1
        comment = FakeComment(self._next_id, repo, number, author, body, kind)
        self.comments[comment.id] = comment
        return comment

    def _render(self, comment: FakeComment) -> dict[str, Any]:
        user = None if comment.author is None else {"login": comment.author, "type": "User"}
        return {
            "id": comment.id,
            "url": f"{self.url}/repos/{comment.repository}/issues/comments/{comment.id}",
            "html_url": f"https://github.com/{comment.repository}/issues/{comment.number}",
            "body": comment.body,
            "user": user,
            "author_association": "NONE",
        }


def _render_delivery(delivery: FakeDelivery) -> dict[str, Any]:
    ok = 200 <= delivery.status_code < 300
    return {
        "id": delivery.id,
        "guid": delivery.guid,
        "delivered_at": delivery.delivered_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "redelivery": delivery.redelivery,
        "duration": 0.27,
        "status": "OK" if ok else f"Invalid HTTP Response: {delivery.status_code}",
        "status_code": delivery.status_code,
        "event": delivery.event,
        "action": "created",
        "installation_id": INSTALLATION_ID,
        "repository_id": 1296269,
        "throttled_at": None,
    }


def manifest_problems(manifest: Any) -> list[str]:
    """What GitHub would refuse, or what looprelay needs, missing from an App manifest."""
    if not isinstance(manifest, dict):
        return ["the manifest is not an object"]
    problems = [f"no {key}" for key in ("name", "url", "redirect_url") if not manifest.get(key)]
    if not (manifest.get("hook_attributes") or {}).get("url"):
        problems.append("no hook_attributes.url")
    if manifest.get("public") is not False:
        problems.append("public is not false")
    permissions = manifest.get("default_permissions") or {}
    wanted = (("metadata", "read"), ("issues", "write"), ("pull_requests", "write"))
    for permission, level in wanted:
        if permissions.get(permission) != level:
            problems.append(f"default_permissions.{permission} is not {level}")
    events = manifest.get("default_events") or []
    if not events or {"installation", "ping"} & set(events):
        problems.append("default_events is empty or lists an event sent without subscription")
    return problems


def _error(status: int, message: str) -> Answer:
    return status, {}, {"message": message, "documentation_url": "https://docs.github.com/rest"}


def _handler_for(fake: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        # Keep-alive, as GitHub: a sweep test makes thousands of calls.
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self._respond()

        def do_GET(self) -> None:
            self._respond()

        def _respond(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            url = urlsplit(self.path)
            form = "form-urlencoded" in (self.headers.get("Content-Type") or "")
            request = RecordedRequest(
                method=self.command,
                path=url.path.removeprefix("/api/v3"),  # GitHub Enterprise Server's API
                query=parse_qs(url.query),
                headers={name.lower(): value for name, value in self.headers.items()},
                json=(parse_qs(raw.decode()) if form else json.loads(raw)) if raw else None,
            )
            status, headers, body = fake.answer(request)
            data = b"" if body is None else json.dumps(body).encode()
            # After a scripted hang the client may have hung up; nothing to tell it then.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Keep test output quiet; ``FakeGitHub.requests`` is the log."""

    return _Handler


def make_app_key() -> AppKey:
    """A fresh 2048-bit RSA key pair, as a GitHub App's."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # GitHub hands out PKCS#1 PEM files
        serialization.NoEncryption(),
    )
    return AppKey(private_pem=pem.decode(), public_key=key.public_key())


@pytest.fixture(scope="session")
def github_app_key() -> AppKey:
    """One App key pair for the session (generating RSA keys is slow)."""
    return make_app_key()


@pytest.fixture
def fake_github() -> Iterator[FakeGitHub]:
    """A running fake GitHub on a free loopback port, stopped after the test."""
    fake = FakeGitHub()
    fake.start()
    yield fake
    fake.stop()
