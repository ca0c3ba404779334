"""`looprelay` with one fault hook, for the runner fault suite: ``python -m tests.faults.agent_boot
runner run ...``.

With ``LOOPRELAY_FAULT_EXIT_ON_REPORT=k`` the agent's report step ends the process with
``os._exit(137)`` (what a SIGKILL looks like to the parent) on its k-th call: after the dispatch
was applied and its result recorded in the local ledger, before the server heard of it. The
production code stays free of fault hooks; only this wrapper patches it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from looprelay.agent.run import Agent

EXIT_ON_REPORT = "LOOPRELAY_FAULT_EXIT_ON_REPORT"


def _crash_on_report(k: int) -> None:
    original = Agent._report
    lock, calls = threading.Lock(), [0]

    def report(self: Agent, *args: Any, **kwargs: Any) -> None:
        with lock:
            calls[0] += 1
            crash = calls[0] == k
        if crash:
            os._exit(137)
        original(self, *args, **kwargs)

    Agent._report = report  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get(EXIT_ON_REPORT):
        _crash_on_report(int(os.environ[EXIT_ON_REPORT]))
    from looprelay.cli.root import main

    main()
