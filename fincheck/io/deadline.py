"""One deadline per logical network call: the caller's, covering every attempt, re-ask and
backoff, for an LLM endpoint's call as for a hub upload. A call past it is abandoned, never
waited for: it runs in a daemon thread, which never holds up the command's exit (Ctrl-C
included)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

_CALL = threading.local()  # the end of the call this thread runs for `within_deadline`


class CallDeadline(Exception):
    """A call that had not answered when its deadline passed (it goes on, unwaited for)."""


def within_deadline(call: Callable[[], Any], seconds: float) -> Any:
    """`call()` in a daemon thread, waited for at most `seconds`: past them `CallDeadline`, and
    the thread is left to finish on its own."""
    if seconds <= 0:
        raise CallDeadline(seconds)
    box: dict[str, Any] = {}
    end = time.monotonic() + seconds

    def run() -> None:
        _CALL.end = end
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


def past_deadline() -> bool:
    """Whether this thread runs a call abandoned at its deadline: a retry the library behind it
    would still make is not sent (the HTTP clients' request hooks ask), so nothing more reaches
    a misbehaving server, and the thread ends."""
    end = getattr(_CALL, "end", None)
    return end is not None and time.monotonic() >= end
