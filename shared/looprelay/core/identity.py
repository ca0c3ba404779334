"""One agent per runner identity: telling a restart from a second agent on the same credentials.

Scenario: agent P serves runner R and names itself ``p`` on every heartbeat. Someone copies R's
credentials to another machine (or starts a second agent with another ``--state``) and that
agent Q heartbeats as ``q``: P is live, so Q is refused and told why. P is SIGKILLed and
restarted on its state directory: the new process Q' reads ``p`` from the directory (which P
held locked, so P is gone) and heartbeats as ``q'`` replacing ``p``: accepted at once. An agent
whose predecessor died elsewhere (its state directory lost) is accepted once that one has been
silent past ``lostAfterSeconds``. Agents that name no id are accepted as before.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from looprelay.core.model import RunnerRecord
from looprelay.core.scheduling import is_live


def second_agent(
    runner: RunnerRecord, *, agent_id: str, replaces: str, now: datetime, lost_after: timedelta
) -> bool:
    """Whether the agent ``agent_id`` (which took over from ``replaces``, or "") is a second
    live agent on ``runner``'s credentials: another agent is on record and still live, and
    this one did not take over its state directory. Never raises."""
    serving = runner.agent_id
    if not agent_id or not serving or serving in (agent_id, replaces):
        return False
    return is_live(runner, now=now, lost_after=lost_after)


def second_agent_message(runner: RunnerRecord, *, lost_after: timedelta) -> str:
    """What a refused second agent is told: who serves the runner, and the fix."""
    return (
        f"runner {runner.name} is served by another live agent (id {runner.agent_id}, last "
        f"heard at {runner.last_seen_at}); one agent per runner: stop that one (this one is "
        f"accepted at once if started on its state directory, or once it has been silent "
        f"{int(lost_after.total_seconds())} s), or give this machine a runner of its own "
        "with `looprelay runner register`"
    )
