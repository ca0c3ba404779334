"""The phase-selection gate: the checklist comment, and freezing the selection."""

from __future__ import annotations

from looprelay.core.checklist import freeze_selection, render_checklist
from looprelay.core.control import Command
from looprelay.core.decision import CommentPost, Note, Situation
from looprelay.core.model import GraphRecord
from looprelay.core.plan import Plan
from looprelay.core.policy import event_actor
from looprelay.core.render import render_comment


def checklist_body(plan: Plan) -> str:
    rows = render_checklist(
        phases=plan.policy.phases,
        default_session_per_pr=plan.policy.session_per_pr,
        execute_keyword=execute_keyword(plan),
    )
    return render_comment(
        plan.templates.checklist_comment,
        {"work_item": plan.item.ref, "execute_keyword": execute_keyword(plan), "checklist": rows},
    )


def execute_keyword(plan: Plan) -> str:
    return dict(plan.policy.keywords.by_command).get(Command.EXECUTE, "the-loop execute")


def freeze_graph(
    plan: Plan, situation: Situation, comments: list[CommentPost], notes: list[Note]
) -> None:
    comment = situation.envelope.comment
    actor = event_actor(situation.envelope)
    selection = freeze_selection(
        reply_body=comment.body if comment else "",
        recorded_body=situation.recorded_checklist_body,
        phases=plan.policy.phases,
        default_session_per_pr=plan.policy.session_per_pr,
        actor=actor.login if actor else "unknown",
        at=situation.now,
    )
    graph = GraphRecord(
        phases_selected=list(selection.phases_selected),
        phases_skipped=list(selection.phases_skipped),
        surface=selection.surface,
        session_per_pr=selection.session_per_pr,
        actor=selection.actor,
        at=selection.at,
        source=str(selection.source),
        notes=list(selection.notes),
    )
    plan.item = plan.item.model_copy(update={"graph": graph})
    plan.froze = True
    notes.append(Note("graph.frozen", graph.model_dump(mode="json")))
    source = {"reply": "reply", "recorded-comment": "checklist comment"}.get(
        graph.source, "defaults"
    )
    comments.append(
        CommentPost(
            "confirmation",
            render_comment(
                plan.templates.confirmation_comment, graph.model_dump() | {"source": source}
            ),
        )
    )
