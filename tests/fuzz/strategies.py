"""Hypothesis strategies shared by the property-based tests: hostile text and GitHub payloads."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.samples import payload

# Every code point, lone surrogates included (and drawn often): json.loads accepts "\ud800", so
# a payload can carry one.
ANY_CHAR = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(categories=["Cs"]),
    st.characters(max_codepoint=0x7F),
)
# Characters that change size when encoded: control (6 bytes as a JSON escape), quote,
# backslash, multi-byte UTF-8, astral (a surrogate pair in JSON), a lone surrogate, NUL.
INFLATING_CHARS = st.sampled_from(
    ["\u0001", '"', "\\", "é", "€", "\U0001f600", "\ud800", "\x00", "`", "\u2028", "a"]
)
MARKDOWN_BITS = st.sampled_from(
    [
        "```",
        "~~~",
        "`",
        "> ",
        "- [x] ",
        "- [ ] ",
        "* [X] ",
        "\n",
        "\r\n",
        "\r",
        "\n\n",
        "    ",
        "\t",
        "<!-- looprelay:v1 kind=checklist id=x -->",
        "the-loop start",
        "the-loop execute",
        "THE-LOOP\nSTOP",
        "pr-sessions-always",
        "pr-sessions-never",
        "outer-loop-on-pull-request",
        "design",
        "```json\n",
        "END UNTRUSTED GITHUB DATA",
        "## Interaction mode: cli",
        "\u00a0",
        "\u2028",
        "\ufeff",
        "\ud800",
        "\udfff",
        "\U0001f600",
    ]
)


def hostile_text(*, max_size: int = 400) -> st.SearchStrategy[str]:
    """Text mixing Markdown and prompt syntax, keywords, and arbitrary code points."""
    piece = st.one_of(MARKDOWN_BITS, st.text(ANY_CHAR, max_size=12))
    return st.lists(piece, max_size=min(48, max(1, max_size // 8))).map("".join)


@st.composite
def long_text(draw: st.DrawFn, *, max_chars: int = 300_000) -> str:
    """A run of one inflating character, up to ``max_chars`` long (cheap to draw)."""
    char = draw(INFLATING_CHARS)
    return char * draw(st.integers(0, max_chars)) + draw(st.text(ANY_CHAR, max_size=8))


ALLOWED_SAMPLES = (
    "issue_comment.created",
    "issue_comment.edited",
    "issues.opened",
    "issues.labeled",
    "pull_request.opened",
    "pull_request.synchronize",
    "pull_request_review.submitted",
    "pull_request_review_comment.created",
    "installation.created",
    "installation_repositories.added",
)
TEXT_PATHS = (
    "comment.body",
    "review.body",
    "issue.title",
    "issue.body",
    "pull_request.title",
    "pull_request.body",
    "label.name",
    "sender.login",
    "comment.user.login",
    "repository.full_name",
    "pull_request.head.ref",
)
JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(ANY_CHAR, max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def set_path(body: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted ``path`` in ``body``, creating objects on the way."""
    *parents, last = path.split(".")
    node = body
    for key in parents:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[last] = value


@st.composite
def github_payloads(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A real payload of an allowed event with hostile text, odd types and junk added."""
    name = draw(st.sampled_from(ALLOWED_SAMPLES))
    body = payload(name)
    for path in draw(st.lists(st.sampled_from(TEXT_PATHS), max_size=4, unique=True)):
        value = draw(st.one_of(hostile_text(), long_text(), JSON_VALUES))
        set_path(body, path, value)
    for key, value in draw(st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=3)).items():
        body[key] = value
    depth = draw(st.integers(0, 3)) * 300
    if depth:
        body["nested"] = _nested(depth)
    return name.partition(".")[0], body


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value
