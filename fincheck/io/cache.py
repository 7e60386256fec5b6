"""Where fincheck keeps what it fetches (models, benchmark files, built tools): one root,
chosen by the environment."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "FINCHECK_CACHE_DIR"


def cache_root() -> Path:
    """$FINCHECK_CACHE_DIR, else $XDG_CACHE_HOME/fincheck, else ~/.cache/fincheck."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fincheck"
