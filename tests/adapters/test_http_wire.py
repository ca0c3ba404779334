"""Request heads parsed out of a buffer: the fast path agrees with the line-by-line reference,
an incomplete head waits for its bytes, and framing the server does not speak is refused."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from looprelay.adapters.http_wire import (
    MAX_HEADERS,
    MAX_LINE_BYTES,
    METHODS,
    BadRequest,
    Head,
    _take_head_by_lines,
    take_head,
)
from tests.fuzz.budget import examples

Outcome = tuple[Head | int | None, bytes]
"""What parsing did: the head, the refusal's status, or None; and the bytes left behind."""

_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
# Bytes a sloppy or hostile client puts in a head: a lone CR or LF, NUL, DEL, tab, vertical
# tab, NEL and Latin-1 (all decoded as latin-1, so each is one byte on the wire).
_ODD = st.sampled_from(["\r", "\n", "\x00", "\x7f", "\t", "\x0b", "\x85", "\xe9", "\xff", ":"])
_TEXT = st.text(st.one_of(_PRINTABLE, _PRINTABLE, _ODD), max_size=16)
# Odd bytes that still leave a header line well formed (no LF: that would end the line).
_VALUE_TEXT = st.text(st.one_of(_PRINTABLE, _ODD.filter(lambda c: c != "\n")), max_size=16)
_TOKEN = st.text(st.sampled_from("abcXYZ019-_!#$%&'*+.^`|~"), min_size=1, max_size=10)
_WELL_FORMED = {
    "method": st.sampled_from(sorted(METHODS)),
    "target": st.sampled_from(["/", "/echo/a?x=1", "*", "/%00"]),
    "version": st.sampled_from(["HTTP/1.1", "HTTP/1.0"]),
    "name": st.sampled_from(["Host", "Content-Length", "Connection", "Expect"]) | _TOKEN,
    "colon": st.sampled_from([":", ": ", ":  "]),
    "value": st.sampled_from(["0", "5", " 12 ", "close", "keep-alive", "100-continue"])
    | _VALUE_TEXT,
    "terminator": st.just("blank line"),
}
_SLOPPY = {
    "method": st.sampled_from(["BREW", "get", ""]) | _TEXT,
    "target": st.sampled_from(["", "/ /"]) | _TEXT,
    "version": st.sampled_from(["HTTP/2.0", "http/1.1", "HTTP/1.1 ", ""]) | _TEXT,
    "name": st.sampled_from(["Transfer-Encoding", " X-Lead", "X-Tail ", ""])
    | st.text(_PRINTABLE, max_size=10),
    "colon": st.sampled_from([":", ": ", ""]),
    "value": st.sampled_from(["-1", "+5", "\u00b2", "5, 5", ""]) | _TEXT,
    "terminator": st.sampled_from(["blank line", "none", "lone CR"]),
}
# Around the limit (one header more, exactly as many, one fewer; the request line is not
# counted) or a few. Hypothesis draws the first choices most, so the limit comes first.
_HEADER_COUNTS = st.sampled_from([MAX_HEADERS + 1, MAX_HEADERS, MAX_HEADERS - 1, 0, 1, 3])
_TRAILERS = st.one_of(
    st.binary(max_size=24),
    st.sampled_from([b"GET / HTTP/1.1\r\n\r\n", b"\r\n\r\n", b"\n\n", b"\r\n", b"\r"]),
)


@st.composite
def raw_heads(draw: st.DrawFn) -> bytes:
    """A request head, well-formed or not, maybe incomplete, with whatever follows it.

    Half the heads are clean, so many get through the fast path; a quarter have one sloppy
    part, and a quarter many.
    """
    style = draw(st.sampled_from(["\r\n", "\r\n", "\n", "mixed"]))
    mode = draw(st.sampled_from(["clean", "clean", "one fault", "sloppy"]))
    faulty = [draw(st.sampled_from(sorted(_SLOPPY)))] if mode == "one fault" else []

    def part(name: str) -> str:
        if name in faulty:
            faulty.clear()
            sloppy = True
        else:
            sloppy = mode == "sloppy" and draw(st.booleans())
        return draw((_SLOPPY if sloppy else _WELL_FORMED)[name])

    def ending(*, last: bool = False) -> str:
        # A mixed head ends in CRLF CRLF, so the fast path finds an end with a bare LF before it.
        if style == "mixed":
            return "\r\n" if last else draw(st.sampled_from(["\r\n", "\n"]))
        return style

    blanks = draw(st.sampled_from(["", "", "\r\n", "\n\r\n"]))
    method, target, version = part("method"), part("target"), part("version")
    pool = [part("name") + part("colon") + part("value") for _ in range(draw(st.integers(1, 3)))]
    lines = [pool[n % len(pool)] for n in range(draw(_HEADER_COUNTS))]
    endings = [ending(last=n == len(lines)) for n in range(len(lines) + 1)]
    # Now and then one line is padded to one byte short of the limit, exactly it, or one over.
    long_at = draw(st.none() | st.integers(0, len(lines)))
    request_line = f"{method} {target} {version}"
    if long_at is not None:
        delta = draw(st.sampled_from([-1, 0, 1]))
        current = request_line if long_at == 0 else lines[long_at - 1]
        padding = "a" * max(0, MAX_LINE_BYTES + delta - len(current) - len(endings[long_at]))
        if long_at == 0:
            request_line = f"{method} {target}{padding} {version}"
        else:
            lines[long_at - 1] += padding
    text = blanks + "".join(
        line + end for line, end in zip([request_line, *lines], endings, strict=True)
    )
    text += {"blank line": ending(last=True), "none": "", "lone CR": "\r"}[part("terminator")]
    return text.encode("latin-1") + draw(_TRAILERS)


def _outcome(parse: Callable[[bytearray], Head | None], data: bytes) -> Outcome:
    buffer = bytearray(data)
    result: Head | int | None
    try:
        result = parse(buffer)
    except BadRequest as refused:
        result = refused.status
    return result, bytes(buffer)


class TestFastPath:
    @examples(2.0)
    @given(data=raw_heads())
    def test_take_head_does_exactly_what_the_line_by_line_reference_does(self, data: bytes) -> None:
        assert _outcome(take_head, data) == _outcome(_take_head_by_lines, data)

    @pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
    @pytest.mark.parametrize(
        ("length", "status"),
        [(MAX_LINE_BYTES, None), (MAX_LINE_BYTES + 1, 431)],
        ids=["at-limit", "over-limit"],
    )
    def test_a_header_line_of_the_longest_length_is_taken_and_one_byte_more_is_431(
        self, ending: str, length: int, status: int | None
    ) -> None:
        name = "X-Long: "
        line = name + "v" * (length - len(name) - len(ending))
        data = f"GET / HTTP/1.1{ending}{line}{ending}{ending}".encode()
        result, rest = _outcome(take_head, data)
        if status is None:
            assert isinstance(result, Head)
            assert (len(result.headers["x-long"]), rest) == (len(line) - len(name), b"")
        else:
            assert result == status

    @pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
    @pytest.mark.parametrize(
        ("count", "status"),
        [(MAX_HEADERS, None), (MAX_HEADERS + 1, 431)],
        ids=["at-limit", "over-limit"],
    )
    def test_the_most_header_lines_are_taken_and_one_more_is_431(
        self, ending: str, count: int, status: int | None
    ) -> None:
        headers = "".join(f"X-{n}: {n}{ending}" for n in range(count))
        result, _ = _outcome(take_head, f"GET / HTTP/1.1{ending}{headers}{ending}".encode())
        if status is None:
            assert isinstance(result, Head)
            assert len(result.headers) == count
        else:
            assert result == status


# A head split anywhere: leading blank lines (CRLF and bare LF), LF or CRLF lines, and a body.
_BLANKS = (b"\r\n", b"\n", b"\r\n")
_HEADS = {
    "crlf": b"POST /echo/a?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n",
    "lf": b"POST /echo/a?x=1 HTTP/1.1\nHost: x\nContent-Length: 4\n\n",
    "mixed": b"POST /echo/a?x=1 HTTP/1.1\r\nHost: x\nContent-Length: 4\r\n\n",
}
_BODY = b"body"


class TestIncompleteHead:
    @examples(1.0)
    @given(
        style=st.sampled_from(sorted(_HEADS)),
        blank_count=st.integers(0, len(_BLANKS)),
        cuts=st.lists(st.integers(1, 80), min_size=1, max_size=12),
    )
    def test_a_head_in_pieces_waits_untouched_then_parses_once_its_end_arrives(
        self, style: str, blank_count: int, cuts: list[int]
    ) -> None:
        blanks = _BLANKS[:blank_count]
        stream = b"".join(blanks) + _HEADS[style] + _BODY
        head_end = len(stream) - len(_BODY)
        buffer = bytearray()
        fed = 0
        for cut in [*sorted(set(cuts)), len(stream)]:
            if cut <= fed or fed >= head_end:
                continue
            buffer += stream[fed:cut]
            fed = min(cut, len(stream))
            result = take_head(buffer)
            if fed < head_end:
                # Waiting: only the complete blank lines in front are gone.
                dropped = _complete_blank_bytes(blanks, fed)
                assert (result, bytes(buffer)) == (None, stream[dropped:fed])
            else:
                assert result == take_head(bytearray(_HEADS["crlf"]))
                assert bytes(buffer) == stream[head_end:fed]
        assert fed >= head_end

    def test_a_lone_cr_at_the_end_is_kept_until_its_lf_arrives(self) -> None:
        buffer = bytearray(b"\r\n\r")
        assert (take_head(buffer), bytes(buffer)) == (None, b"\r")
        buffer += b"\nGET / HTTP/1.1\r\n\r\n"
        head = take_head(buffer)
        assert head is not None
        assert (head.method, head.target, bytes(buffer)) == ("GET", "/", b"")


def _complete_blank_bytes(blanks: tuple[bytes, ...], fed: int) -> int:
    """How many of the first ``fed`` bytes are whole blank lines."""
    total = 0
    for blank in blanks:
        if total + len(blank) > fed:
            break
        total += len(blank)
    return total


class TestFraming:
    @pytest.mark.parametrize("ending", ["\r\n", "\n"], ids=["crlf", "lf"])
    @pytest.mark.parametrize(
        ("headers", "status"),
        [
            (["Content-Length: 4", "Content-Length: 4"], 400),
            (["Content-Length: 4", "content-length: 5"], 400),
            (["Transfer-Encoding: chunked"], 411),
            (["Content-Length: 4", "Transfer-Encoding: chunked"], 411),
            (["Transfer-Encoding: identity"], 411),
        ],
        ids=["same-length-twice", "two-lengths", "chunked", "length-and-chunked", "identity"],
    )
    def test_ambiguous_or_unsupported_framing_is_refused(
        self, ending: str, headers: list[str], status: int
    ) -> None:
        lines = ["POST /echo HTTP/1.1", "Host: x", *headers]
        data = (ending.join(lines) + ending * 2).encode() + b"body"
        with pytest.raises(BadRequest) as refused:
            take_head(bytearray(data))
        assert refused.value.status == status

    @pytest.mark.parametrize(
        ("version", "connection", "keep_alive"),
        [
            ("HTTP/1.1", None, True),
            ("HTTP/1.1", "close", False),
            ("HTTP/1.1", "Keep-Alive, Close", False),
            ("HTTP/1.0", None, False),
            ("HTTP/1.0", "keep-alive", True),
        ],
    )
    def test_keep_alive_follows_the_version_and_the_connection_header(
        self, version: str, connection: str | None, keep_alive: bool
    ) -> None:
        extra = "" if connection is None else f"Connection: {connection}\r\n"
        head = take_head(bytearray(f"GET / {version}\r\n{extra}\r\n".encode()))
        assert head is not None
        assert head.keep_alive is keep_alive
