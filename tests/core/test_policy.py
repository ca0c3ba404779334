"""Loop prevention, the App's own bot, authorized actors, and which words are the author's."""

from __future__ import annotations

import time
from typing import Any

import pytest

from looprelay.core.envelope import Actor, Envelope, project_envelope
from looprelay.core.policy import (
    HIDDEN,
    Authorization,
    AuthorizedUsers,
    CloseEndsSession,
    DropReason,
    Listing,
    UserPin,
    authorize,
    drop_reason,
    event_actor,
    pin_to_record,
    strip_quotes_and_code,
)
from tests.samples import payload

CODERTOCAT_ID = 21031067
OURS = "<!-- looprelay:v1 kind=checklist id=d-1 -->"


def _envelope(name: str, edit: dict[str, Any] | None = None) -> Envelope:
    """Project fixture ``name``; ``edit`` maps dotted paths to replacement values."""
    body = payload(name)
    for path, value in (edit or {}).items():
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node[key]
        node[last] = value
    return project_envelope(
        event=name.partition(".")[0], delivery_id="d-1", payload=body, max_text_chars=65536
    )


def _user(login: str, user_id: int = 1) -> dict[str, Any]:
    return {"login": login, "id": user_id, "type": "User"}


class TestDropReason:
    def test_a_marked_comment_is_dropped(self) -> None:
        envelope = _envelope("issue_comment.created", {"comment.body": f"Checklist\n{OURS}"})
        assert drop_reason(envelope, bot_logins={"looprelay[bot]"}) is DropReason.SELF_MARKED

    def test_a_third_partys_comment_carrying_the_marker_is_still_dropped(self) -> None:
        envelope = _envelope(
            "issue_comment.created",
            {"comment.body": f"the-loop execute\n{OURS}", "comment.user": _user("mallory")},
        )
        assert drop_reason(envelope, bot_logins=()) is DropReason.SELF_MARKED

    def test_a_marked_review_body_is_dropped(self) -> None:
        envelope = _envelope("pull_request_review.submitted", {"review.body": OURS})
        assert drop_reason(envelope, bot_logins=()) is DropReason.SELF_MARKED

    def test_a_session_comment_longer_than_the_cap_is_still_dropped(self) -> None:
        """The session ends its comments with the marker; a cap shorter than the comment cuts
        that end off the envelope's body, and the comment still counts as the session's own."""
        body = "x" * 5_000 + "\n\n<!-- looprelay:agent-comment -->"
        data = payload("issue_comment.created")
        data["comment"]["body"] = body
        envelope = project_envelope(
            event="issue_comment", delivery_id="d-1", payload=data, max_text_chars=1_000
        )

        assert envelope.comment is not None
        assert "looprelay" not in envelope.comment.body
        assert "comment.body" in envelope.truncated
        assert drop_reason(envelope, bot_logins=()) is DropReason.SELF_MARKED

    def test_a_marked_pr_description_is_not_a_reason(self) -> None:
        envelope = _envelope("pull_request.opened", {"pull_request.body": OURS})
        assert drop_reason(envelope, bot_logins=()) is None

    @pytest.mark.parametrize("configured", ["looprelay[bot]", "LoopRelay[BOT]", "looprelay"])
    def test_the_apps_bot_as_sender_is_dropped(self, configured: str) -> None:
        envelope = _envelope("issues.labeled", {"sender": _user("looprelay[bot]")})
        assert drop_reason(envelope, bot_logins={configured}) is DropReason.OWN_BOT

    def test_a_single_configured_login_is_one_login_not_its_letters(self) -> None:
        envelope = _envelope("issues.labeled", {"sender": _user("looprelay[bot]")})
        assert drop_reason(envelope, bot_logins="looprelay") is DropReason.OWN_BOT
        assert drop_reason(_envelope("issues.labeled"), bot_logins="looprelay") is None

    def test_a_human_editing_the_bots_comment_is_dropped(self) -> None:
        envelope = _envelope("issue_comment.edited", {"comment.user": _user("LoopRelay[bot]")})
        assert drop_reason(envelope, bot_logins={"looprelay[bot]"}) is DropReason.OWN_BOT

    @pytest.mark.parametrize(
        ("sender", "configured"),
        [
            ("dependabot[bot]", {"looprelay[bot]"}),
            ("looprelay", {"looprelay[bot]"}),
            ("Codertocat", set()),
            ("Codertocat", {" "}),
        ],
    )
    def test_anyone_else_goes_on(self, sender: str, configured: set[str]) -> None:
        envelope = _envelope("issue_comment.created", {"sender": _user(sender)})
        assert drop_reason(envelope, bot_logins=configured) is None


class TestStripQuotesAndCode:
    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ("plain text", "plain text"),
            ("a `code` b", f"a {HIDDEN} b"),
            ("a ``x ` y`` b", f"a {HIDDEN} b"),
            ("a `unclosed b", "a `unclosed b"),
            ("```\ncode\n```\nafter", f"{HIDDEN}\n{HIDDEN}\n{HIDDEN}\nafter"),
            (
                "~~~~\n~~~\n````\nin\n~~~~\nout",
                f"{HIDDEN}\n{HIDDEN}\n{HIDDEN}\n{HIDDEN}\n{HIDDEN}\nout",
            ),
            ("```\nunclosed\nrest", f"{HIDDEN}\n{HIDDEN}\n{HIDDEN}"),
            ("  - step\n    ```\n    x\n    ```", f"  - step\n{HIDDEN}\n{HIDDEN}\n{HIDDEN}"),
            ("```py`x\ny", "```py`x\ny"),
            ("> quoted\nmine", f"{HIDDEN}\nmine"),
            ("  > quoted\n- > listed quote\n1. > numbered", f"{HIDDEN}\n{HIDDEN}\n{HIDDEN}"),
            ("a\r\nb\rc", "a\nb\nc"),
            ("x `a\n\nb` y", "x `a\n\nb` y"),
        ],
    )
    def test_hides_code_and_quotes(self, body: str, expected: str) -> None:
        assert strip_quotes_and_code(body) == expected

    @pytest.mark.parametrize(
        "body",
        ["`" * 200_000, "```\n" * 50_000, "> " * 100_000, "`a" * 100_000, "x" * 200_000],
    )
    def test_a_200000_character_body_stays_fast(self, body: str) -> None:
        started = time.perf_counter()
        strip_quotes_and_code(body)
        assert time.perf_counter() - started < 1.0


class TestAuthorizedUsers:
    @pytest.mark.parametrize(
        ("entries", "logins", "ids"),
        [
            ([], set(), set()),
            (["Octocat", " hubot "], {"octocat", "hubot"}, set()),
            ([CODERTOCAT_ID, "583231"], set(), {CODERTOCAT_ID, 583231}),
            (["renovate[bot]"], {"renovate[bot]"}, set()),
        ],
    )
    def test_reads_logins_and_ids(
        self, entries: list[Any], logins: set[str], ids: set[int]
    ) -> None:
        users = AuthorizedUsers.from_config(entries)
        assert (set(users.logins), set(users.ids)) == (logins, ids)

    @pytest.mark.parametrize(
        "entry",
        [True, False, 0, -3, "0", "@octocat", "octo cat", "", "\u0661\u0662\u0663", "-lead", 1.5],
    )
    def test_an_entry_that_is_neither_login_nor_id_raises(self, entry: Any) -> None:
        with pytest.raises(ValueError, match=r"routing\.authorizedUsers entry"):
            AuthorizedUsers.from_config([entry])

    def test_a_bare_string_is_refused_rather_than_read_letter_by_letter(self) -> None:
        with pytest.raises(ValueError, match="must be a list"):
            AuthorizedUsers.from_config("octocat")

    @pytest.mark.parametrize(
        ("actor", "expected"),
        [
            (Actor(login="OCTOCAT", id=9), True),
            (Actor(login="renamed", id=583231), True),
            (Actor(login="mallory", id=7), False),
            (Actor(login="\u043ectocat", id=7), False),  # Cyrillic o
            (Actor(login="\u212aate", id=7), False),  # Kelvin sign lower()s to "k"
            (Actor(login="kate"), True),
            (None, False),
        ],
    )
    def test_allows_by_login_or_id(self, actor: Actor | None, expected: bool) -> None:
        users = AuthorizedUsers.from_config(["octocat", "kate", 583231])
        assert users.allows(actor) is expected

    def test_a_pinned_entry_lists_its_id_and_pins_its_login(self) -> None:
        users = AuthorizedUsers.from_config(
            [UserPin(" Octocat ", 583231), "kate", UserPin("octocat", 583231), 42]
        )
        assert (set(users.logins), set(users.ids)) == ({"kate"}, {583231, 42})
        assert dict(users.pins) == {"octocat": 583231}

    @pytest.mark.parametrize(
        "pin",
        [
            UserPin("@octocat", 583231),
            UserPin("octocat", 0),
            UserPin("octocat", True),
            UserPin("", 583231),
        ],
    )
    def test_a_pinned_entry_needs_a_login_and_a_positive_id(self, pin: UserPin) -> None:
        with pytest.raises(ValueError, match=r"needs a GitHub login .* and a positive user id"):
            AuthorizedUsers.from_config([pin])

    def test_a_login_pinned_to_two_ids_raises(self) -> None:
        with pytest.raises(ValueError, match="pins octocat to two user ids, 1 and 2"):
            AuthorizedUsers.from_config([UserPin("octocat", 1), UserPin("OCTOCAT", 2)])

    @pytest.mark.parametrize(
        ("actor", "pinned", "expected"),
        [
            # Pinned by the config: the login counts only with its id.
            (Actor(login="octocat", id=583231), {}, Listing.LISTED),
            (Actor(login="OctoCat", id=666), {}, Listing.ID_MISMATCH),
            (Actor(login="octocat"), {}, Listing.ID_MISMATCH),
            (Actor(login="renamed", id=583231), {}, Listing.LISTED),
            # The config's pin wins over a first-sight pin of the same login.
            (Actor(login="octocat", id=583231), {"octocat": 666}, Listing.LISTED),
            # Listed alone: by login until pinned, then only with the pinned id.
            (Actor(login="kate", id=7), {}, Listing.LISTED),
            (Actor(login="Kate", id=7), {"kate": 7}, Listing.LISTED),
            (Actor(login="kate", id=8), {"kate": 7}, Listing.ID_MISMATCH),
            (Actor(login="kate"), {"kate": 7}, Listing.ID_MISMATCH),
            # A pin of a login that is not listed lists nobody.
            (Actor(login="mallory", id=9), {"mallory": 9}, Listing.UNLISTED),
            (Actor(login="\u212aate", id=7), {"kate": 7}, Listing.UNLISTED),
            (None, {}, Listing.UNLISTED),
        ],
    )
    def test_listing_holds_each_login_to_its_pin(
        self, actor: Actor | None, pinned: dict[str, int], expected: Listing
    ) -> None:
        users = AuthorizedUsers.from_config([UserPin("octocat", 583231), "kate"])
        assert users.listing(actor, pinned=pinned) is expected


class TestPinToRecord:
    @pytest.mark.parametrize(
        ("name", "edit", "expected"),
        [
            (
                "issue_comment.created",
                {"comment.user": _user("Kate", 7)},
                UserPin("kate", 7),
            ),
            ("issues.opened", {"sender": _user("KATE", 7)}, UserPin("kate", 7)),
            ("issue_comment.created", {"comment.user": _user("octocat", 583231)}, None),
            ("issue_comment.created", {"comment.user": _user("mallory", 9)}, None),
            ("issue_comment.created", {"comment.user": {"login": "kate"}}, None),
            ("issue_comment.created", {"comment.user": None}, None),
            ("check_run.completed", {"sender": _user("kate", 7)}, None),
        ],
        ids=["comment", "sender", "pinned-by-config", "unlisted", "no-id", "no-author", "ci"],
    )
    def test_only_a_login_listed_alone_is_pinned_from_an_event(
        self, name: str, edit: dict[str, Any], expected: UserPin | None
    ) -> None:
        users = AuthorizedUsers.from_config([UserPin("octocat", 583231), "kate"])
        assert pin_to_record(_envelope(name, edit), users=users) == expected


class TestEventActor:
    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            ("issue_comment.created", "comment-author"),
            ("pull_request_review_comment.created", "comment-author"),
            ("pull_request_review.submitted", "review-author"),
            ("issues.opened", "sender"),
            ("pull_request.opened", "sender"),
            ("installation.created", "sender"),
            ("check_run.completed", None),
        ],
    )
    def test_picks_the_author_or_the_sender(self, name: str, expected: str | None) -> None:
        edit = {
            "sender": _user("sender"),
            "comment.user": _user("comment-author"),
            "review.user": _user("review-author"),
        }
        body_keys = payload(name).keys()
        envelope = _envelope(name, {k: v for k, v in edit.items() if k.split(".")[0] in body_keys})
        actor = event_actor(envelope)
        assert (actor.login if actor else None) == expected

    def test_a_comment_without_an_author_has_no_actor(self) -> None:
        assert event_actor(_envelope("issue_comment.created", {"comment.user": None})) is None


class TestAuthorize:
    @pytest.mark.parametrize(
        ("name", "edit", "users", "expected"),
        [
            ("issue_comment.created", {}, ["codertocat"], Authorization.ALLOWED),
            ("issue_comment.created", {}, [CODERTOCAT_ID], Authorization.ALLOWED),
            ("issue_comment.created", {}, [str(CODERTOCAT_ID)], Authorization.ALLOWED),
            ("issue_comment.created", {}, ["octocat"], Authorization.DENIED),
            ("issue_comment.created", {}, [], Authorization.DENIED),
            (
                "issue_comment.created",
                {"sender": _user("octocat"), "comment.user": _user("mallory")},
                ["octocat"],
                Authorization.DENIED,
            ),
            (
                "issue_comment.created",
                {"sender": _user("mallory"), "comment.user": _user("octocat")},
                ["octocat"],
                Authorization.ALLOWED,
            ),
            ("issue_comment.created", {"comment.user": None}, ["codertocat"], Authorization.DENIED),
            ("pull_request_review.submitted", {}, ["codertocat"], Authorization.ALLOWED),
            ("check_run.completed", {}, [], Authorization.NO_ACTOR_CI),
            ("pull_request.closed", {}, [], Authorization.DENIED),
            ("pull_request.closed", {}, ["codertocat"], Authorization.ALLOWED),
            ("issues.opened", {"action": "closed"}, ["octocat"], Authorization.DENIED),
            ("issues.opened", {"action": "closed", "sender": None}, [], Authorization.DENIED),
            ("issues.opened", {}, ["octocat"], Authorization.DENIED),
            ("issue_comment.created", {"action": "closed"}, [], Authorization.DENIED),
            ("installation.created", {}, ["codertocat"], Authorization.ALLOWED),
        ],
    )
    def test_decides_what_the_actor_may_do(
        self, name: str, edit: dict[str, Any], users: list[Any], expected: Authorization
    ) -> None:
        decision = authorize(_envelope(name, edit), users=AuthorizedUsers.from_config(users))
        assert decision is expected

    @pytest.mark.parametrize(
        ("name", "edit", "users", "mode", "expected"),
        [
            ("issues.opened", {"action": "closed"}, ["octocat"], "authorized", "denied"),
            ("issues.opened", {"action": "closed"}, ["octocat"], "anyone", "close-only"),
            ("issues.opened", {"action": "closed"}, ["codertocat"], "authorized", "allowed"),
            ("issues.opened", {"action": "closed"}, ["codertocat"], "anyone", "allowed"),
            ("issues.opened", {"action": "closed", "sender": None}, [], "anyone", "close-only"),
            ("pull_request.closed", {}, [], "authorized", "denied"),
            ("pull_request.closed", {}, [], "anyone", "close-only"),
            ("issues.opened", {}, ["octocat"], "anyone", "denied"),
            ("issues.opened", {"action": "reopened"}, ["octocat"], "anyone", "denied"),
        ],
    )
    def test_whose_close_counts_is_the_operators_choice(
        self, name: str, edit: dict[str, Any], users: list[Any], mode: str, expected: str
    ) -> None:
        """``routing.closeEndsSession``: by default only a listed person's close counts, so
        the outsider who opened an issue cannot end its session by closing it."""
        decision = authorize(
            _envelope(name, edit),
            users=AuthorizedUsers.from_config(users),
            close_ends_session=CloseEndsSession(mode),
        )
        assert decision is Authorization(expected)

    @pytest.mark.parametrize(
        ("actor", "mode", "expected"),
        [
            (_user("codertocat", CODERTOCAT_ID), "authorized", Authorization.ALLOWED),
            (_user("Codertocat", 666), "authorized", Authorization.ID_MISMATCH),
            (_user("Codertocat", 666), "anyone", Authorization.CLOSE_ONLY),
        ],
    )
    def test_a_listed_login_with_another_id_may_close_only_where_anyone_may(
        self, actor: dict[str, Any], mode: str, expected: Authorization
    ) -> None:
        envelope = _envelope("issues.opened", {"action": "closed", "sender": actor})
        users = AuthorizedUsers.from_config([UserPin("codertocat", CODERTOCAT_ID)])
        decision = authorize(envelope, users=users, close_ends_session=CloseEndsSession(mode))
        assert decision is expected

    @pytest.mark.parametrize(
        ("author", "pinned", "expected"),
        [
            (_user("Codertocat", CODERTOCAT_ID), {}, "allowed"),
            (_user("Codertocat", CODERTOCAT_ID), {"codertocat": CODERTOCAT_ID}, "allowed"),
            (_user("Codertocat", 666), {"codertocat": CODERTOCAT_ID}, "id-mismatch"),
            (_user("mallory", 666), {"codertocat": CODERTOCAT_ID}, "denied"),
        ],
    )
    def test_a_login_listed_alone_is_held_to_its_first_sight_pin(
        self, author: dict[str, Any], pinned: dict[str, int], expected: str
    ) -> None:
        envelope = _envelope("issue_comment.created", {"comment.user": author})
        decision = authorize(
            envelope, users=AuthorizedUsers.from_config(["codertocat"]), pinned=pinned
        )
        assert decision is Authorization(expected)

    @pytest.mark.parametrize(
        ("decision", "routes"),
        [
            (Authorization.ALLOWED, True),
            (Authorization.CLOSE_ONLY, True),
            (Authorization.NO_ACTOR_CI, True),
            (Authorization.DENIED, False),
            (Authorization.ID_MISMATCH, False),
        ],
    )
    def test_only_a_denied_event_stops_here(self, decision: Authorization, routes: bool) -> None:
        assert decision.routes is routes
