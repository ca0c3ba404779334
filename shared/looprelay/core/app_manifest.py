"""The GitHub App manifest of ``looprelay app create`` (docs: "Registering a GitHub App from a
manifest"): the permissions and events looprelay uses, and nothing more."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

EVENT_PERMISSIONS: dict[str, tuple[str, str]] = {
    # event -> (permission, level): what GitHub requires before it sends the event, and what
    # the REST client writes with (comments and reactions on issues and pull requests).
    "issues": ("issues", "write"),
    "issue_comment": ("issues", "write"),
    "pull_request": ("pull_requests", "write"),
    "pull_request_review": ("pull_requests", "write"),
    "pull_request_review_comment": ("pull_requests", "write"),
    "check_run": ("checks", "read"),
    "check_suite": ("checks", "read"),
    "workflow_run": ("actions", "read"),
    "status": ("statuses", "read"),
}
ALWAYS_SENT = frozenset({"installation", "installation_repositories", "ping"})
"""Events GitHub sends every App without a subscription; a manifest may not list them."""
BASE_PERMISSIONS = {
    # Comments on pull requests go through the issues API and reactions on review comments
    # through the pulls API, so both are written whatever the events; metadata is mandatory.
    "issues": "write",
    "pull_requests": "write",
    "metadata": "read",
}


def app_manifest(
    *,
    name: str,
    url: str,
    webhook_url: str,
    redirect_url: str,
    events: Iterable[str],
) -> dict[str, Any]:
    """Return the manifest registering a private App that sends ``events`` to ``webhook_url``
    and redirects to ``redirect_url`` with the code; raises ``ValueError`` for an event whose
    permission is unknown here (it would be registered and never sent)."""
    wanted = sorted(set(events) - ALWAYS_SENT)
    unknown = [event for event in wanted if event not in EVENT_PERMISSIONS]
    if unknown:
        raise ValueError(f"no known permission sends the event(s) {', '.join(unknown)}")
    permissions = dict(BASE_PERMISSIONS)
    for event in wanted:
        permission, level = EVENT_PERMISSIONS[event]
        permissions.setdefault(permission, level)
    return {
        "name": name,
        "url": url,
        "hook_attributes": {"url": webhook_url, "active": True},
        "redirect_url": redirect_url,
        "public": False,
        "default_permissions": permissions,
        "default_events": wanted,
    }
