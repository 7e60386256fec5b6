"""Using and sharing a trained detector: `fincheck detect`, `fincheck merge`, `fincheck publish`.

`from fincheck.serve import Detector` is resolved lazily so that importing the CLI stays light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Detector"]


def __getattr__(name: str) -> Any:
    if name == "Detector":
        from fincheck.detector import Detector

        return Detector
    raise AttributeError(name)
