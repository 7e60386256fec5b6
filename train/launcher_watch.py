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
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    command: str
    handle: Any  # a psutil.Process: it knows its start time, so a recycled pid is not taken for it


def launcher_ancestors(depth: int = 4) -> list[Process]:
    """The launcher processes among the nearest `depth` ancestors of this process."""
    import psutil

    try:
        parents = psutil.Process().parents()[:depth]
    except psutil.Error:
        return []
    found = []
    for parent in parents:
        if parent.pid <= 1:
            break
        try:
            command = " ".join(parent.cmdline())
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
        if any(mark in command for mark in LAUNCHER_MARKS):
            found.append(Process(parent.pid, command, parent))
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
                if not process.handle.is_running():
                    on_gone(process)
                    return

    threading.Thread(target=loop, name="fincheck-launcher-watch", daemon=True).start()
    return True
