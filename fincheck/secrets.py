"""Secrets in a recipe or a run's records, found by their place and never echoed.

A recipe is copied into recipe.yaml, every checkpoint's training_args.bin, the wandb config and
a published model's card: training refuses one that holds a secret, and publish refuses a run
whose recorded recipe does (a run trained before that check, a recipe.yaml edited by hand).
"""

from __future__ import annotations

import re
from typing import Any

# A key named like a secret, anywhere in the recipe (`hub_token`, `model_init_kwargs: {token:
# ...}`), or a value shaped like a hub or API key: refused, named by its place, never echoed.
SECRET_KEY = re.compile(
    r"(?:^|_)(?:token|secret|password|passwd|api_?key|credentials?)$", re.IGNORECASE
)
SECRET_VALUE = re.compile(r"^(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,})$")
# Keys whose names match SECRET_KEY but hold no secret (token counts, special tokens).
NOT_SECRET_KEYS = frozenset({"pad_token", "eos_token", "bos_token", "unk_token", "sep_token",
                             "cls_token", "mask_token"})  # fmt: skip


def secret_places(value: Any, where: str = "") -> list[str]:
    """The places (`model_init_kwargs.token`) in a recipe that hold a secret."""
    if isinstance(value, dict):
        found = []
        for key, inner in value.items():
            place = f"{where}.{key}" if where else str(key)
            named = SECRET_KEY.search(str(key)) and str(key) not in NOT_SECRET_KEYS
            if (
                named
                and inner not in (None, "", False, [], {})
                and not isinstance(inner, (int, float))
            ):
                found.append(place)
            else:
                found += secret_places(inner, place)
        return found
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in secret_places(v, f"{where}[{i}]")]
    return [where] if isinstance(value, str) and SECRET_VALUE.match(value.strip()) else []
