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
    """`call()` in a daemon thread, waited for at most `seconds` (and never past the deadline of
    the call this thread runs for): past them `CallDeadline`, and the thread is left to finish
    on its own."""
    if seconds <= 0:
        raise CallDeadline(seconds)
    return abandoned_when(call, lambda: None, time.monotonic() + seconds)


def abandoned_when(
    call: Callable[[], Any], give_up: Callable[[], str | None], end: float | None = None
) -> Any:
    """`call()` in a daemon thread, waited for until it returns, its end (`time.monotonic()`)
    passes, or `give_up()` (asked every tenth of a second) says why it is abandoned: then
    `CallDeadline`. The thread runs under the earlier of `end` and this thread's own deadline."""
    outer = getattr(_CALL, "end", None)
    end = outer if end is None else end if outer is None else min(end, outer)
    box: dict[str, Any] = {}

    def run() -> None:
        _CALL.end = end
        try:
            box["result"] = call()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while True:
        left = 0.1 if end is None else min(0.1, end - time.monotonic())
        thread.join(max(left, 0))
        if not thread.is_alive():
            break
        if end is not None and time.monotonic() >= end:
            raise CallDeadline(end)
        if why := give_up():
            raise CallDeadline(why)
    if "error" in box:
        raise box["error"]
    return box["result"]


def past_deadline() -> bool:
    """Whether this thread runs a call abandoned at its deadline: a retry the library behind it
    would still make is not sent (the HTTP clients' request hooks ask), so nothing more reaches
    a misbehaving server, and the thread ends."""
    end = getattr(_CALL, "end", None)
    return end is not None and time.monotonic() >= end
