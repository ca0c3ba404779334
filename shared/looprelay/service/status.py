"""The operator's status view, read through the ports and rendered: HTML for ``GET /status``,
aligned text for ``looprelay status``. The view itself is built by ``core.status``.

The HTML is one self-contained page (inline CSS, one inline script of ours, :data:`COPY_SCRIPT`,
allowed by its hash; no external asset) that reloads itself; Jinja2 autoescapes every value, so
a hostile title or reason stays text.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache

from jinja2 import Environment, Template
from markupsafe import Markup

from looprelay.config.templates import bundled_template
from looprelay.core.deliveries import DeliveryPage, build_delivery_page, fold_deliveries
from looprelay.core.model import DISPATCH_OPEN
from looprelay.core.resend import is_interrupted, resend_id
from looprelay.core.status import StatusInputs, StatusView, build_status
from looprelay.ports import Clock, PollCursors, RunnerRegistry, Store, WorkItemStore
from looprelay.service.lease_desk import leasable_heads

RECENT_DELIVERIES = 50
MAX_RECENT_DELIVERIES = 1_000
"""The most deliveries one page may ask for (``/status?deliveries=N``)."""
DEAD_LETTERS = 50
WORK_ITEMS = 100
OPEN_DISPATCHES = 200
FAILED_DISPATCHES_READ = 2000
"""Failed dispatches read to find the interrupted ones (oldest first: the newest are kept)."""
INTERRUPTED_SHOWN = 50
DELIVERY_EVENTS = 200
"""Events a delivery's page shows (a delivery causes a handful)."""
REFRESH_SECONDS = 10
STATUS_TEMPLATE = "status.html.j2"
DELIVERY_TEMPLATE = "status_delivery.html.j2"
COPY_SCRIPT = (
    'document.addEventListener("click", function (event) {'
    ' var button = event.target.closest("button[data-copy]");'
    " if (!button) { return; }"
    ' var text = button.getAttribute("data-copy");'
    " function done() {"
    ' button.textContent = "copied";'
    ' setTimeout(function () { button.textContent = "copy"; }, 1500); }'
    " function fallback() {"
    ' var area = document.createElement("textarea"); area.value = text;'
    " document.body.appendChild(area); area.select();"
    ' document.execCommand("copy"); area.remove(); done(); }'
    " if (navigator.clipboard && window.isSecureContext) {"
    " navigator.clipboard.writeText(text).then(done, fallback); } else { fallback(); }"
    " });"
)
"""The page's one script: a copy button copies its ``data-copy`` text. The page's CSP allows
exactly this text (by hash), so no other script can run there."""


class StatusReader:
    """Reads the view's inputs through the ports; one instance serves many requests."""

    def __init__(
        self,
        *,
        store: Store,
        work_items: WorkItemStore,
        runners: RunnerRegistry,
        clock: Clock,
        lost_after: timedelta,
        command_args: Sequence[str] = (),
        poll_cursors: PollCursors | None = None,
    ) -> None:
        """``command_args`` follow every replay command the view shows (``--data DIR``);
        ``poll_cursors`` (when the poll ingress is configured) say how far behind it is."""
        self._poll_cursors = poll_cursors
        self._store = store
        self._items = work_items
        self._runners = runners
        self._clock = clock
        self._lost_after = lost_after
        self._command_args = tuple(command_args)

    def read(self, deliveries: int = RECENT_DELIVERIES) -> StatusView:
        """The view as of now, with the last ``deliveries`` deliveries. Raises ``Transient``
        when a store cannot be read."""
        now = self._clock.now()
        failed = self._items.list_dispatches(statuses=("failed",), limit=FAILED_DISPATCHES_READ)
        # Interrupted and not sent again yet: what waits for an operator's decision.
        interrupted = [
            d
            for d in failed
            if is_interrupted(d) and self._items.get_dispatch(resend_id(d.dispatch_id)) is None
        ][-INTERRUPTED_SHOWN:]
        runners = self._runners.list_runners()
        inputs = StatusInputs(
            runners=runners,
            work_items=self._items.list_work_items(limit=WORK_ITEMS),
            open_dispatches=self._items.list_dispatches(
                statuses=DISPATCH_OPEN, limit=OPEN_DISPATCHES
            ),
            heads=leasable_heads(self._items, now=now),
            deliveries=self._store.list_deliveries(limit=deliveries),
            dead_letters=self._store.list_deliveries(outcome="failed", limit=DEAD_LETTERS),
            failed_dispatches=list(reversed(interrupted)),
            command_args=self._command_args,
            holding={r.runner_id: self._items.held_sessions(r.runner_id) for r in runners},
            poll_cursors=self._poll_cursors.list_poll_cursors() if self._poll_cursors else (),
        )
        return build_status(inputs, now=now, lost_after=self._lost_after)

    def delivery(self, delivery_id: str) -> DeliveryPage | None:
        """The page of one delivery and its events; None when the ledger has no such one.
        Raises ``Transient`` when the store cannot be read."""
        record = self._store.get_delivery(delivery_id)
        if record is None:
            return None
        events = self._store.list_events(delivery_id=delivery_id, limit=DELIVERY_EVENTS)
        return build_delivery_page(record, events, now=self._clock.now())


def ago(moment: datetime | None, now: datetime) -> str:
    """``moment`` relative to ``now``: ``12s ago``, ``5m ago``, ``3h ago``, ``2d ago``; ``-``
    for None."""
    if moment is None:
        return "-"
    seconds = int((now - moment).total_seconds())
    if seconds < 0:
        return "in the future"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


@cache
def _page(name: str) -> Template:
    environment = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    environment.filters["dash"] = lambda value: "-" if value in (None, "", [], {}) else value
    return environment.from_string(bundled_template(name))


def render_html(view: StatusView) -> str:
    """The status page of ``view``: every value escaped, reloading every few seconds."""
    return _page(STATUS_TEMPLATE).render(
        view=view,
        folds=fold_deliveries(view.deliveries),
        refresh=REFRESH_SECONDS,
        ago=lambda moment: ago(moment, view.generated_at),
        script=Markup(COPY_SCRIPT),  # noqa: S704 - our own constant, no value of a request
    )


def render_delivery_html(page: DeliveryPage) -> str:
    """The page of one delivery and its events, every value escaped."""
    return _page(DELIVERY_TEMPLATE).render(
        page=page, ago=lambda moment: ago(moment, page.generated_at)
    )


def render_text(view: StatusView) -> str:
    """``view`` as aligned plain-text tables, one section each, for a terminal."""
    now = view.generated_at
    t = view.totals
    sections = [
        f"looprelay status at {now.isoformat(timespec='seconds')}: "
        f"{t.runners_live}/{t.runners} runners live, {t.sessions_live} sessions live, "
        f"{t.dispatches_open} dispatches open ({t.dispatches_waiting} waiting), "
        f"{t.dead_letters} dead letters, {t.interrupted} interrupted",
        _section(
            "RUNNERS",
            ("ID", "NAME", "STATE", "HOST", "USE", "LAST SEEN", "VERSION"),
            [
                (
                    r.runner_id,
                    r.name,
                    r.state,
                    r.hostname,
                    f"{r.sessions}/{r.capacity}",
                    ago(r.last_seen_at, now),
                    r.version,
                )
                for r in view.runners
            ],
        ),
        _section(
            "SESSIONS",
            ("WORK ITEM", "ENDPOINT", "SESSION", "RUNNER", "STATE", "ACTIVITY", "ATTACH"),
            [
                (
                    s.work_item,
                    s.endpoint,
                    s.session,
                    s.runner or s.runner_id,
                    s.state,
                    s.activity,
                    s.attach,
                )
                for s in view.sessions
            ],
        ),
        _section(
            "OPEN DISPATCHES",
            ("DISPATCH", "WORK ITEM", "SEQ", "KIND", "STATUS", "RUNNER", "WAITING"),
            [
                (d.dispatch_id, d.work_item, str(d.seq), d.kind, d.status, d.runner, d.waiting)
                for d in view.dispatches
            ],
        ),
        _section(
            "RECENT DELIVERIES",
            ("RECEIVED", "DELIVERY", "EVENT", "OUTCOME", "DETAIL"),
            [
                (
                    ago(d.received_at, now),
                    d.delivery_id,
                    f"{d.event}.{d.action}" if d.action else d.event,
                    d.outcome,
                    d.detail,
                )
                for d in view.deliveries
            ],
        ),
        _section(
            "TO REPLAY",
            ("KIND", "ID", "SUBJECT", "WHEN", "COMMAND"),
            [(r.kind, r.id, r.subject, ago(r.at, now), r.command) for r in view.replays],
        ),
    ]
    if view.polling:
        sections.append(
            _section(
                "POLLING",
                ("REPOSITORY", "LAST POLLED", "BACKING OFF", "ERROR"),
                [
                    (
                        p.repository,
                        ago(p.polled_at, now),
                        f"until {p.retry_at.isoformat(timespec='seconds')}" if p.retry_at else "",
                        p.error,
                    )
                    for p in view.polling
                ],
            )
        )
    return "\n\n".join(sections) + "\n"


def _section(title: str, header: Sequence[str], rows: Sequence[Sequence[str | None]]) -> str:
    if not rows:
        return f"{title}: none"
    cells = [list(header), *([_printable(value) for value in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join([title, *lines])


def _printable(value: str | None) -> str:
    """``value``, ``-`` when empty; a control character (an escape sequence a hostile title
    could carry to the terminal) shown as ``?``."""
    if not value:
        return "-"
    return "".join(c if c.isprintable() else "?" for c in value)
