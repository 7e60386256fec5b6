"""A rank notices when the launcher above it is gone (`kill` of the deepspeed runner)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import os, sys, time
from fincheck.train.launcher_watch import launcher_ancestors, watch_launchers
marker = sys.argv[1]
found = launcher_ancestors()
open(marker + ".found", "w").write("\\n".join(p.command for p in found))

def gone(p):
    open(marker, "w").write(str(p.pid))
    os._exit(0)  # what the real callback does: the rank stops with its launcher

watch_launchers(gone, interval_s=0.2)
time.sleep(20)
"""


def test_a_rank_sees_its_launcher_die(tmp_path: Path):
    child = tmp_path / "rank.py"
    child.write_text(CHILD)
    marker = tmp_path / "gone"
    # A parent whose command line names a launcher, as `deepspeed` or `torchrun` do; the
    # trailing `; :` keeps bash from exec-ing the child in its place.
    launcher = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} {child} {marker}; :", "torchrun-like"]
    )
    deadline = time.monotonic() + 30
    while not Path(f"{marker}.found").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "torchrun-like" in Path(f"{marker}.found").read_text()
    assert not marker.exists()  # the launcher is alive: nothing to do
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.read_text() == str(launcher.pid)


def test_no_launcher_above_a_plain_process_means_no_watch():
    script = "from fincheck.train.launcher_watch import launcher_ancestors as a; print(len(a()))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "0"
