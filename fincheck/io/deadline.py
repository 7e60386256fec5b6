"""One deadline per logical network call: the caller's, covering every attempt, re-ask and
backoff, for an LLM endpoint's call as for a hub upload. A call past it is abandoned, never
waited for: it runs in a daemon thread, which never holds up the command's exit (Ctrl-C
included)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class CallDeadline(Exception):
    """A call that had not answered when its deadline passed (it goes on, unwaited for)."""


def within_deadline(call: Callable[[], Any], seconds: float) -> Any:
    """`call()` in a daemon thread, waited for at most `seconds`: past them `CallDeadline`, and
    the thread is left to finish on its own."""
    if seconds <= 0:
        raise CallDeadline(seconds)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise CallDeadline(seconds)
    if "error" in box:
        raise box["error"]
    return box["result"]
