"""``decide``: one delivery and its work item's state in, what to write and say out.

Each case projects a real GitHub payload (``tests/fixtures/github``) as ingress does, loads
the situation the router would hand over, and reads the decision as the worker acts on it:
the ledger outcome and detail, the saved work item, the dispatches, the comments to post.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from looprelay.config.templates import (
    CHECKLIST_COMMENT,
    CONFIRMATION_COMMENT,
    EVENT_PROMPT,
    SPAWN_PROMPT,
    bundled_template,
)
from looprelay.core.answers import HELD, PAUSED, PAUSED_FULL
from looprelay.core.checklist import Phase, parse_checklist, render_checklist
from looprelay.core.control import Keywords
from looprelay.core.decide import USER_ID_MISMATCH, decide
from looprelay.core.decision import Decision, Situation
from looprelay.core.envelope import Envelope, project_envelope
from looprelay.core.interaction import ModeResolution
from looprelay.core.markers import mark
from looprelay.core.model import CommandLog, GraphRecord, SessionRecord, WorkItemRecord
from looprelay.core.plan import MAX_HELD_EVENTS, PausedEvents, RoutingPolicy, Templates
from looprelay.core.policy import AuthorizedUsers, CloseEndsSession, UserPin
from looprelay.core.prsessions import REASON_NO_SEPARATE_CHECKOUT, tmux_session_name
from looprelay.core.workitems import parse_ref, work_items
from tests.samples import AUTO_LABEL, payload

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SEED = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
REF = "github:codertocat/hello-world#1"
PR_REF = "github:codertocat/hello-world#2"
REPOSITORY = "Codertocat/Hello-World"
CODERTOCAT_ID = 21031067
"""The user id the fixtures' author, Codertocat, carries."""
BOT = "looprelay[bot]"
PHASES = (
    Phase("design", "Design"),
    Phase("tasks-breakdown", "Tasks breakdown"),
    Phase("design-critic-review", "Design critic review", opt_in=True),
)

POLICY = RoutingPolicy(
    users=AuthorizedUsers.from_config([UserPin("codertocat", CODERTOCAT_ID)]),
    bot_logins=frozenset({BOT}),
    keywords=Keywords.from_config(),
    auto_execute_label=AUTO_LABEL,
    require_start=True,
    session_per_pr="cross-repository",
    interaction=ModeResolution("work-item"),
    harness="claude",
    runner_kind="tmux",
    phases=PHASES,
)
TEMPLATES = Templates(
    event_prompt=bundled_template(EVENT_PROMPT),
    spawn_prompt=bundled_template(SPAWN_PROMPT),
    checklist_comment=bundled_template(CHECKLIST_COMMENT),
    confirmation_comment=bundled_template(CONFIRMATION_COMMENT),
    boundary="b0undary0123456789abcdef",
)

Edit = Callable[[dict[str, Any]], None]


def _envelope(name: str, edit: Edit | None = None, *, delivery: str = "d-1") -> Envelope:
    """The fixture ``name`` (``event.action``) as ingress projects it, after ``edit``."""
    data = payload(name)
    if edit is not None:
        edit(data)
    return project_envelope(
        event=name.partition(".")[0], delivery_id=delivery, payload=data, max_text_chars=65536
    )


def _comment(body: str, *, action: str = "created", **changes: Any) -> Envelope:
    """Codertocat (authorized) comments ``body`` on issue #1."""

    def edit(data: dict[str, Any]) -> None:
        data["action"] = action
        data["comment"]["body"] = body
        data["comment"]["user"].update(changes)

    return _envelope("issue_comment.created", edit)


def _session(endpoint: str = REF, *, status: str = "live") -> SessionRecord:
    return SessionRecord(
        endpoint=endpoint,
        session_name=tmux_session_name(endpoint),
        session_id="9b2c7c55-0c8e-4c47-8a39-5d0a2f3d1e77",
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status=status,
        runner_id="runner-a",
    )


def _item(control: str, *sessions: SessionRecord, **changes: Any) -> WorkItemRecord:
    item = WorkItemRecord(
        ref=REF,
        repository=REPOSITORY.lower(),
        number=1,
        control=control,
        sessions={s.endpoint: s for s in sessions},
        next_seq=3,
        version=4,
    )
    return item.model_copy(update=changes)


def _situation(envelope: Envelope, item: WorkItemRecord | None, **changes: Any) -> Situation:
    """What the router loads: the refs the event names, the work item among them (a pull
    request's linked issue once recorded) and its record."""
    recorded = {parse_ref(item.ref)} if item is not None and item.ref != PR_REF else set()
    names = work_items(envelope, recorded=recorded)
    target = parse_ref(item.ref) if item is not None else (names.refs or (None,))[0]
    situation = Situation(
        envelope=envelope,
        names=names,
        target=target,
        work_item=item,
        now=NOW,
        session_seed=SEED,
    )
    return replace(situation, **changes)


def _decide(situation: Situation, policy: RoutingPolicy = POLICY) -> Decision:
    return decide(situation, policy, TEMPLATES)


def _note_names(decision: Decision) -> list[str]:
    return [note.name for note in decision.notes]


class TestAnAuthorizedComment:
    def test_a_start_on_an_armed_item_spawns_its_session_with_the_comment_as_first_prompt(
        self,
    ) -> None:
        decision = _decide(
            _situation(_comment("the-loop start, please fix the typo"), _item("armed"))
        )

        assert decision.outcome == "dispatched"
        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.endpoint, spawn.seq) == ("spawn", REF, 3)
        assert "please fix the typo" in spawn.prompt
        assert decision.work_item is not None
        assert decision.work_item.control == "started"
        assert decision.work_item.sessions[REF].status == "pending"
        assert decision.work_item.next_seq == 4

    def test_an_ordinary_comment_goes_into_the_live_session_in_order(self) -> None:
        situation = _situation(_comment("Looks good, carry on."), _item("started", _session()))

        decision = _decide(situation)

        assert decision.outcome == "dispatched"
        assert decision.detail == f"deliver {REF}"
        (deliver,) = decision.dispatches
        assert (deliver.kind, deliver.seq, deliver.session_name) == (
            "deliver",
            3,
            tmux_session_name(REF),
        )
        assert "Looks good, carry on." in deliver.prompt
        assert "dispatch.queued" in _note_names(decision)

    def test_an_ordinary_comment_on_an_item_not_started_waits_for_the_start(self) -> None:
        decision = _decide(_situation(_comment("Any news?"), _item("armed")))

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "not-started",
            (),
        )

    def test_a_comment_on_a_paused_session_is_held_and_answered_so(self) -> None:
        situation = _situation(_comment("One more thing"), _item("paused", _session()))

        decision = _decide(situation)

        assert (decision.outcome, decision.detail) == ("dispatched", f"held deliver {REF}")
        [held] = decision.dispatches
        assert (held.kind, held.status, held.seq) == ("deliver", "held", 3)
        assert [(c.kind, c.body) for c in decision.comments] == [("answer", HELD)]
        assert "dispatch.held" in _note_names(decision)

    def test_with_paused_events_drop_a_comment_on_a_paused_session_is_dropped(self) -> None:
        situation = _situation(_comment("One more thing"), _item("paused", _session()))
        policy = replace(POLICY, paused_events=PausedEvents.DROP)

        decision = _decide(situation, policy)

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "session-paused",
            (),
        )
        assert [c.body for c in decision.comments] == [PAUSED]

    def test_a_resume_offers_what_was_held_in_order_before_itself(self) -> None:
        held = tuple(
            _decide(
                _situation(_comment(text), _item("paused", _session(), next_seq=seq))
            ).dispatches[0]
            for seq, text in ((3, "first"), (4, "second"))
        )
        item = _item("paused", _session(), next_seq=5)

        decision = _decide(_situation(_comment("the-loop resume"), item, held=held))

        line = [(d.kind, d.seq, d.status) for d in decision.dispatches]
        assert line == [
            ("deliver", 3, "pending"),
            ("deliver", 4, "pending"),
            ("resume", 5, "pending"),
        ]
        assert decision.work_item is not None and decision.work_item.control == "started"

    def test_a_stop_while_paused_drops_what_was_held(self) -> None:
        paused = _item("paused", _session())
        held = _decide(_situation(_comment("first"), paused)).dispatches
        item = _item("paused", _session(), next_seq=4)

        decision = _decide(_situation(_comment("the-loop stop"), item, held=held))

        dropped, terminate = decision.dispatches
        assert (dropped.status, dropped.result, dropped.seq) == ("failed", "dropped", 3)
        assert (terminate.kind, terminate.status) == ("terminate", "pending")
        assert "dispatch.dropped" in _note_names(decision)

    def test_past_the_held_bound_a_paused_comment_is_dropped_and_answered(self) -> None:
        one = _decide(_situation(_comment("first"), _item("paused", _session()))).dispatches[0]
        held = tuple(
            one.model_copy(update={"dispatch_id": f"h{n}", "seq": n})
            for n in range(MAX_HELD_EVENTS)
        )
        situation = _situation(
            _comment("one too many"), _item("paused", _session(), next_seq=99), held=held
        )

        decision = _decide(situation)

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "session-paused-full",
            (),
        )
        assert [c.body for c in decision.comments] == [PAUSED_FULL]

    def test_the_label_arms_the_item_and_waits_for_a_start(self) -> None:
        def label(data: dict[str, Any]) -> None:
            data["label"]["name"] = AUTO_LABEL

        decision = _decide(_situation(_envelope("issues.labeled", label), None))

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "awaiting-start",
            (),
        )
        assert decision.work_item is not None
        assert (decision.work_item.ref, decision.work_item.control) == (REF, "armed")

    def test_without_require_start_the_label_starts_the_session(self) -> None:
        def label(data: dict[str, Any]) -> None:
            data["label"]["name"] = AUTO_LABEL

        policy = replace(POLICY, require_start=False)

        decision = _decide(_situation(_envelope("issues.labeled", label), None), policy)

        assert decision.outcome == "dispatched"
        assert [d.kind for d in decision.dispatches] == ["spawn"]

    def test_an_event_naming_no_work_item_is_ignored(self) -> None:
        decision = _decide(_situation(_envelope("push"), None))

        assert (decision.outcome, decision.detail, decision.work_item) == (
            "ignored",
            "no-work-item",
            None,
        )


def _labelled_comment(body: str, *labels: str) -> Envelope:
    """Codertocat comments ``body`` on issue #1, which carries ``labels``."""

    def edit(data: dict[str, Any]) -> None:
        data["comment"]["body"] = body
        data["issue"]["labels"] = [{"name": name} for name in labels]

    return _envelope("issue_comment.created", edit)


CODEX_LABELS = replace(
    POLICY, harness_labels=(("agent: codex", "codex"), ("agent: gemini", "gemini"))
)


class TestHarnessLabels:
    def test_a_start_on_an_issue_with_a_harness_label_spawns_that_harness(self) -> None:
        start = _labelled_comment("the-loop start", "bug", "agent: codex")

        decision = _decide(_situation(start, _item("armed")), CODEX_LABELS)

        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.harness) == ("spawn", "codex")
        assert decision.work_item is not None
        assert decision.work_item.sessions[REF].harness == "codex"

    def test_the_first_listed_label_wins_and_without_one_the_configured_harness_runs(
        self,
    ) -> None:
        both = _labelled_comment("the-loop start", "agent: gemini", "agent: codex")
        plain = _labelled_comment("the-loop start", "bug")

        [both_spawn] = _decide(_situation(both, _item("armed")), CODEX_LABELS).dispatches
        [plain_spawn] = _decide(_situation(plain, _item("armed")), CODEX_LABELS).dispatches

        assert (both_spawn.harness, plain_spawn.harness) == ("codex", "claude")

    def test_a_resumed_session_keeps_its_harness_whatever_the_labels_say_now(self) -> None:
        comment = _labelled_comment("Carry on.", "agent: codex")
        gemini = _session(status="exited").model_copy(update={"harness": "gemini"})

        decision = _decide(_situation(comment, _item("started", gemini)), CODEX_LABELS)

        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.resume, spawn.harness) == ("spawn", True, "gemini")
        assert decision.work_item is not None
        assert decision.work_item.sessions[REF].harness == "gemini"


class TestAnOutsider:
    def test_is_refused_with_the_reason_and_nothing_changes(self) -> None:
        envelope = _comment("the-loop stop", login="mallory", id=9_000_001)

        decision = _decide(_situation(envelope, _item("started", _session())))

        assert decision.outcome == "refused:unauthorized-actor"
        assert decision.detail == "actor not in routing.authorizedUsers"
        assert (decision.work_item, decision.dispatches, decision.comments) == (None, (), ())
        (note,) = decision.notes
        assert note.data == {"reason": "unauthorized-actor", "actor": "mallory"}

    def test_a_listed_login_carrying_another_user_id_is_refused_with_both_ids(self) -> None:
        envelope = _comment("the-loop start", id=9_000_001)  # login Codertocat, taken over

        decision = _decide(_situation(envelope, _item("armed")))

        assert decision.outcome == USER_ID_MISMATCH
        assert str(CODERTOCAT_ID) in decision.detail and "9000001" in decision.detail
        assert (decision.work_item, decision.dispatches) == (None, ())

    def test_a_login_listed_alone_is_held_to_its_first_sight_pin(self) -> None:
        policy = replace(POLICY, users=AuthorizedUsers.from_config(["codertocat"]))
        envelope = _comment("the-loop start", id=9_000_001)

        pinned = _situation(envelope, _item("armed"), pinned_ids={"codertocat": CODERTOCAT_ID})
        not_pinned = _situation(envelope, _item("armed"))

        assert _decide(pinned, policy).outcome == USER_ID_MISMATCH
        assert _decide(not_pinned, policy).outcome == "dispatched"

    def test_closing_the_issue_does_not_end_the_session_by_default(self) -> None:
        def outsider_closes(data: dict[str, Any]) -> None:
            data["action"] = "closed"
            data["sender"].update(login="drive-by", id=9_000_002)

        envelope = _envelope("issues.opened", outsider_closes)

        decision = _decide(_situation(envelope, _item("started", _session())))

        assert decision.outcome == "refused:unauthorized-actor"
        assert "closeEndsSession is authorized" in decision.detail
        assert decision.dispatches == ()

    def test_with_close_ends_session_anyone_the_close_ends_it_but_cleans_nothing(self) -> None:
        def outsider_closes(data: dict[str, Any]) -> None:
            data["action"] = "closed"
            data["sender"].update(login="drive-by", id=9_000_002)

        policy = replace(POLICY, close_ends_session=CloseEndsSession.ANYONE)
        envelope = _envelope("issues.opened", outsider_closes)

        decision = _decide(_situation(envelope, _item("started", _session())), policy)

        assert [d.kind for d in decision.dispatches] == ["terminate"]
        assert decision.work_item is not None
        assert decision.work_item.control == "idle"
        assert decision.work_item.sessions[REF].status == "terminated"
        assert "cleanup.deferred" in _note_names(decision)


class TestAControlKeyword:
    def test_stop_terminates_the_session_and_logs_who_asked(self) -> None:
        situation = _situation(_comment("the-loop stop"), _item("started", _session()))

        decision = _decide(situation)

        assert [d.kind for d in decision.dispatches] == ["terminate"]
        assert decision.work_item is not None
        assert decision.work_item.control == "stopped"
        (log,) = decision.work_item.commands
        assert (log.command, log.actor, log.delivery_id) == ("stop", "Codertocat", "d-1")
        assert log.effect == f"dispatched:terminate {REF}"
        assert "control.command" in _note_names(decision)

    def test_a_command_with_nothing_to_act_on_says_so_and_sends_nothing(self) -> None:
        decision = _decide(_situation(_comment("the-loop resume"), _item("started", _session())))

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "nothing-to-resume",
            (),
        )
        assert decision.work_item is not None
        assert [log.command for log in decision.work_item.commands] == ["resume"]

    def test_two_commands_in_one_comment_are_refused_as_ambiguous(self) -> None:
        situation = _situation(
            _comment("the-loop stop\n\nthe-loop start"), _item("started", _session())
        )

        decision = _decide(situation)

        assert decision.outcome == "refused:control-ambiguous"
        assert decision.detail == "start and stop"
        assert (decision.work_item, decision.dispatches) == (None, ())

    def test_a_quoted_keyword_is_not_a_command_but_text_for_the_session(self) -> None:
        situation = _situation(
            _comment("> the-loop stop\n\nWhy did you stop?"), _item("started", _session())
        )

        decision = _decide(situation)

        assert [d.kind for d in decision.dispatches] == ["deliver"]
        assert decision.work_item is not None
        assert decision.work_item.control == "started"

    def test_an_edited_comment_runs_no_command(self) -> None:
        situation = _situation(
            _comment("the-loop stop", action="edited"), _item("started", _session())
        )

        decision = _decide(situation)

        assert (decision.outcome, decision.detail, decision.dispatches) == (
            "ignored",
            "comment-not-new",
            (),
        )

    def test_a_retried_command_reports_its_first_effect_and_changes_nothing(self) -> None:
        applied = CommandLog(
            command="stop",
            actor="Codertocat",
            at=NOW,
            delivery_id="d-1",
            effect=f"dispatched:terminate {REF}",
        )
        item = _item("stopped", _session(status="terminated"), commands=[applied])

        decision = _decide(_situation(_comment("the-loop stop"), item))

        assert (decision.outcome, decision.detail) == ("dispatched", f"terminate {REF}")
        assert (decision.work_item, decision.dispatches) == (None, ())

    def test_cleanup_ends_every_session_from_any_state(self) -> None:
        item = _item("paused", _session(), _session(PR_REF, status="terminated"))

        decision = _decide(_situation(_comment("the-loop cleanup"), item))

        assert sorted((d.kind, d.endpoint) for d in decision.dispatches) == [
            ("cleanup", REF),
            ("cleanup", PR_REF),
        ]
        assert decision.work_item is not None
        assert decision.work_item.control == "cleaned"


def _pr_comment(body: str = "Maybe you should use more emoji on this line.") -> Envelope:
    """Codertocat comments on a line of PR #2 (same repository as issue #1)."""

    def edit(data: dict[str, Any]) -> None:
        data["comment"]["body"] = body

    return _envelope("pull_request_review_comment.created", edit)


class TestAPullRequestComment:
    def test_without_a_pr_session_it_goes_to_the_work_items_session(self) -> None:
        decision = _decide(_situation(_pr_comment(), _item("started", _session())))

        (deliver,) = decision.dispatches
        assert (deliver.kind, deliver.endpoint, deliver.work_item) == ("deliver", REF, REF)
        assert deliver.comment_kind == "review"
        assert decision.work_item is not None
        assert decision.work_item.pull_requests == [PR_REF]

    def test_with_pr_sessions_and_a_checkout_it_spawns_the_prs_own_session(self) -> None:
        policy = replace(POLICY, session_per_pr="always")
        situation = _situation(
            _pr_comment(), _item("started", _session()), pr_checkout_available=True
        )

        decision = _decide(situation, policy)

        (spawn,) = decision.dispatches
        assert (spawn.kind, spawn.endpoint, spawn.work_item) == ("spawn", PR_REF, REF)
        assert spawn.repository == REPOSITORY.lower()
        assert decision.work_item is not None
        assert set(decision.work_item.sessions) == {REF, PR_REF}

    def test_a_live_pr_session_receives_the_comment(self) -> None:
        policy = replace(POLICY, session_per_pr="always")
        item = _item("started", _session(), _session(PR_REF))

        decision = _decide(_situation(_pr_comment(), item, pr_checkout_available=True), policy)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("deliver", PR_REF)]

    def test_without_a_separate_checkout_the_pr_session_is_declined_with_a_note(self) -> None:
        policy = replace(POLICY, session_per_pr="always")

        decision = _decide(_situation(_pr_comment(), _item("started", _session())), policy)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("deliver", REF)]
        declined = next(n for n in decision.notes if n.name == "session.pr_session_declined")
        assert declined.data == {"pull_request": PR_REF, "reason": REASON_NO_SEPARATE_CHECKOUT}

    def test_the_work_items_frozen_answer_wins_over_the_operators_default(self) -> None:
        graph = GraphRecord(
            phases_selected=["design"],
            phases_skipped=[],
            surface="work-item",
            session_per_pr="never",
            actor="Codertocat",
            at=NOW,
            source="reply",
        )
        policy = replace(POLICY, session_per_pr="always")
        item = _item("started", _session(), graph=graph)

        decision = _decide(_situation(_pr_comment(), item, pr_checkout_available=True), policy)

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("deliver", REF)]

    def test_a_linked_pr_closing_ends_only_its_own_session(self) -> None:
        item = _item("started", _session(), _session(PR_REF))

        decision = _decide(_situation(_envelope("pull_request.closed"), item))

        assert [(d.kind, d.endpoint) for d in decision.dispatches] == [("terminate", PR_REF)]
        assert decision.work_item is not None
        assert decision.work_item.control == "started"
        assert decision.work_item.sessions[REF].status == "live"


def _checklist(ticks: dict[str, bool]) -> str:
    """The checklist looprelay posted, with rows ticked or unticked by hand."""
    body = render_checklist(
        phases=PHASES, default_session_per_pr="cross-repository", execute_keyword="the-loop execute"
    )
    lines = []
    for line in body.split("\n"):
        edited = line
        for token, ticked in ticks.items():
            if f"`{token}`" in line:
                edited = line.replace("[x]", "[ ]").replace("[ ]", "[x]" if ticked else "[ ]")
        lines.append(edited)
    return "\n".join(lines)


class TestTheChecklistGate:
    def test_the_first_start_posts_the_phase_checklist_once(self) -> None:
        first = _decide(_situation(_comment("the-loop start"), _item("armed")))
        posted_before = _item("stopped", checklist_comment_id=77)
        again = _decide(_situation(_comment("the-loop start"), posted_before))

        (checklist,) = first.comments
        assert checklist.kind == "checklist"
        rows = [row.token for row in parse_checklist(checklist.body)]
        assert {"design", "tasks-breakdown", "design-critic-review"} <= set(rows)
        assert [d.kind for d in again.dispatches] == ["spawn"]
        assert again.comments == ()

    def test_execute_freezes_the_recorded_checklist_and_confirms_it(self) -> None:
        recorded = _checklist({"tasks-breakdown": False, "design-critic-review": True})
        item = _item("started", _session(), checklist_comment_id=77)
        situation = _situation(_comment("the-loop execute"), item, recorded_checklist_body=recorded)

        decision = _decide(situation)

        assert decision.work_item is not None
        graph = decision.work_item.graph
        assert graph is not None
        assert graph.phases_selected == ["design", "design-critic-review"]
        assert graph.phases_skipped == ["tasks-breakdown"]
        assert (graph.source, graph.actor) == ("recorded-comment", "Codertocat")
        assert [c.kind for c in decision.comments] == ["confirmation"]
        (deliver,) = decision.dispatches
        assert deliver.kind == "deliver"
        assert "design-critic-review" in deliver.prompt
        assert "## Process selection: frozen by this event" in deliver.prompt
        assert "graph.frozen" in _note_names(decision)

    def test_a_second_execute_keeps_the_frozen_selection(self) -> None:
        frozen = GraphRecord(
            phases_selected=["design"],
            phases_skipped=["tasks-breakdown", "design-critic-review"],
            surface="work-item",
            session_per_pr="cross-repository",
            actor="Codertocat",
            at=NOW,
            source="reply",
        )
        item = _item("started", _session(), checklist_comment_id=77, graph=frozen)
        reply = _checklist({"tasks-breakdown": True}) + "\n\nthe-loop execute"

        decision = _decide(_situation(_comment(reply), item))

        assert decision.work_item is not None
        assert decision.work_item.graph == frozen
        assert decision.comments == ()
        assert [d.kind for d in decision.dispatches] == ["deliver"]
        assert "frozen by this event" not in decision.dispatches[0].prompt

    def test_execute_before_the_start_freezes_nothing(self) -> None:
        decision = _decide(_situation(_comment("the-loop execute"), _item("armed")))

        assert (decision.outcome, decision.detail) == ("ignored", "not-started")
        assert decision.work_item is not None
        assert decision.work_item.graph is None


class TestLoopPrevention:
    def test_a_comment_carrying_looprelays_marker_is_dropped_even_from_a_listed_user(
        self,
    ) -> None:
        body = mark("the-loop stop", kind="reply", id="dp-0123")

        decision = _decide(_situation(_comment(body), _item("started", _session())))

        assert (decision.outcome, decision.detail) == ("ignored", "dropped:self-marked")
        assert (decision.work_item, decision.dispatches) == (None, ())
        (note,) = decision.notes
        assert note.data == {"reason": "self-marked"}

    def test_the_apps_own_bot_is_dropped(self) -> None:
        envelope = _comment("Working on it.", login=BOT, id=41898282, type="Bot")

        decision = _decide(_situation(envelope, _item("started", _session())))

        assert (decision.outcome, decision.detail) == ("ignored", "dropped:own-bot")
        assert decision.dispatches == ()
