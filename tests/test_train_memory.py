"""Host memory freed by a training step goes back to the OS (glibc keeps it otherwise)."""

from __future__ import annotations

import subprocess
import sys

CHILD = r"""
from fincheck.train.host_memory import release_freed_memory


def status_mib():  # /proc/self/status fields in MiB
    fields = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if value.strip().endswith("kB"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


assert release_freed_memory(), "glibc's malloc_trim was not found"
blocks = [bytearray(4096) for _ in range(60_000)]  # ~240 MiB of small heap blocks
pin = bytearray(4096)  # a live block above them: the heap's top cannot shrink past it
before_free = status_mib()["VmRSS"]
del blocks  # freed, but glibc keeps the pages in its heap
kept = status_mib()["VmRSS"]
release_freed_memory()  # what the callback does at the end of each step
released = status_mib()["VmRSS"]
print(before_free, kept, released)
"""


def test_the_memory_a_step_frees_is_given_back():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    before_free, kept, released = map(float, out.stdout.split())
    assert kept > before_free - 40  # without a trim, freeing gives little back
    assert released < kept - 150  # the trim returns most of the ~240 MiB still held
