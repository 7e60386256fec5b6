"""The papers' published figures (SPEC.md, checked against the papers' tables), shown beside ours.

Comparability caveats, printed in the report: FINAL numbers are on the FINAL test set (1,265)
with a GPT-4o judge, while without the FINAL release we evaluate on DeFacto-derived silver
descriptions; FHSumBench numbers are on all 1,336 samples, while a grouped train/test split
evaluates on a subset; QASem numbers are on its test split, like ours.
"""

from __future__ import annotations

# FINAL, Table 4 of the FINAL paper: F1 on the 1,265 test examples.
FINAL_F1: dict[str, float | str] = {
    "Claude-3.5-Sonnet, CoT": 0.67,
    "GPT-4o, CoT": 0.59,
    "Llama-3.1-405B, CoT": 0.56,
    "FactScore-style pipeline": "0.42-0.62",
}

# QASem paper, Table 4 (test split): (BAcc, AUC) in percent per subset; None = not reported.
QASEM: dict[str, dict[str, tuple[float, float | None]]] = {
    "GPT-4o": {"cliff": (75.7, None), "factscore": (82.4, None), "verifiability": (79.2, None)},
    "MiniCheck-770M": {
        "cliff": (70.4, 80.8),
        "factscore": (78.0, 87.3),
        "verifiability": (76.3, 83.4),
    },
    "Gemma-2-9B": {"cliff": (70.0, 82.5), "factscore": (78.0, 88.1), "verifiability": (77.1, 87.1)},
    "Llama-3.1-8B": {
        "cliff": (65.8, 79.0),
        "factscore": (76.5, 89.4),
        "verifiability": (68.5, 83.7),
    },
}

# FHSumBench paper, Tables 1-2 (all 1,336 samples): macro P / R / F; None = not quoted in SPEC.
FHSUMBENCH: dict[str, tuple[float | None, float | None, float]] = {
    "GPT-4o vanilla": (0.458, 0.465, 0.461),
    "Qwen2.5-7B vanilla": (None, None, 0.465),
    "GPT-4o reflection retrieval (best)": (None, None, 0.501),
    "Random": (0.3185, 0.3184, 0.3185),
}
