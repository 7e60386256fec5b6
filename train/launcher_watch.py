"""Ranks stop with their launcher.

`kill <pid of deepspeed>` ends DeepSpeed's runner at once (it forwards no SIGTERM on a single
node), leaving its per-node `deepspeed.launcher.launch` and every rank training on as orphans
that nobody will collect. Each rank therefore watches the launcher processes above it (the
`deepspeed` runner and its `launch` child, `torchrun`, `accelerate launch`) and, when one is
gone, stops as on SIGTERM: the step finishes, a checkpoint is saved, the rank exits 143.
A process is identified by pid and start time, so a recycled pid is not mistaken for it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LAUNCHER_MARKS = (
    "deepspeed",
    "torchrun",
    "torch.distributed.run",
    "torch.distributed.launch",
    "accelerate",
)


@dataclass(frozen=True)
class Process:
    pid: int
    start_time: str  # field 22 of /proc/<pid>/stat: fixed for the life of the process
    command: str

    def alive(self) -> bool:
        found = _stat(self.pid)
        return found is not None and found[1] == self.start_time


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, start time) of `pid`, or None when it does not exist (Linux /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), fields[19]


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def launcher_ancestors(pid: int | None = None, depth: int = 4) -> list[Process]:
    """The launcher processes among the nearest `depth` ancestors of `pid` (default: this one)."""
    found = []
    current = pid or os.getpid()
    for _ in range(depth):
        stat = _stat(current)
        if stat is None or stat[0] <= 1:
            break
        parent = stat[0]
        parent_stat = _stat(parent)
        command = _command(parent)
        if parent_stat is None:
            break
        if any(mark in command for mark in LAUNCHER_MARKS):
            found.append(Process(parent, parent_stat[1], command))
        current = parent
    return found


def watch_launchers(on_gone: Callable[[Process], None], interval_s: float = 2.0) -> bool:
    """Call `on_gone(process)` once, from a daemon thread, when a launcher above this process
    exits. Returns False (and watches nothing) when no launcher is found."""
    watched = launcher_ancestors()
    if not watched:
        return False
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            for process in watched:
                if not process.alive():
                    on_gone(process)
                    return

    threading.Thread(target=loop, name="fincheck-launcher-watch", daemon=True).start()
    return True
