"""The runner machine's own harness flags: parsed, validated, never built into a shell string.

An operator passes ``--harness-arg claude=--model=opus`` (repeatable, one argv element each, in
order). The server has no say: a dispatch carries no flags, so a compromised or misconfigured
server cannot make a harness skip its permission prompts. Flags the agent itself owns (session
ids, headless mode, output format) are refused, because a second copy would fight the agent's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from looprelay.agent import harnesses
from looprelay.errors import ConfigError

MAX_ARG_CHARS = 4_096

HarnessArgs = Mapping[str, tuple[str, ...]]


def parse_harness_args(values: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """Parse ``HARNESS=ARG`` values into each harness's extra argv, in the order given.

    Raises ``ConfigError`` naming the value for: no ``=``, an unknown harness, an empty or
    oversized argument, a control character, a first argument that is not a flag (it would
    be read as the prompt), a flag the agent owns for that harness, or one the harness would
    exit on (Claude: an unknown ``--permission-mode``).
    """
    parsed: dict[str, list[str]] = {}
    for value in values:
        name, sep, arg = value.partition("=")
        if not sep or name not in harnesses.REGISTRY:
            raise ConfigError(
                f"--harness-arg {value[:80]!r} must read HARNESS=ARG with HARNESS one of "
                f"{', '.join(harnesses.NAMES)} (for example claude=--model=opus)"
            )
        _check_arg(name, arg, first=name not in parsed)
        parsed.setdefault(name, []).append(arg)
    for name, args in parsed.items():
        harnesses.get(name).check_args(args)
    return {name: tuple(args) for name, args in parsed.items()}


def _check_arg(harness: str, arg: str, *, first: bool) -> None:
    if not arg or len(arg) > MAX_ARG_CHARS:
        raise ConfigError(f"--harness-arg for {harness}: an argument must be 1-4096 characters")
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in arg):
        raise ConfigError(f"--harness-arg for {harness}: {arg[:80]!r} holds a control character")
    if first and not arg.startswith("-"):
        raise ConfigError(
            f"--harness-arg for {harness}: {arg[:80]!r} is not a flag; the first argument "
            "must start with '-' (a bare word would be read as the prompt)"
        )
    flag = arg.partition("=")[0]
    if flag in harnesses.get(harness).owned_flags:
        raise ConfigError(
            f"--harness-arg for {harness}: {flag} is set by the runner agent itself; drop it"
        )
