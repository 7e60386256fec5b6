"""FINAL scoring: description lists, judge matchings, micro P/R/F1 and the binarized BAcc.

The protocol (the FINAL paper, §4.2 and appendix C): a judge maps every predicted description
(lettered A, B, C, ...) to the gold description it matches, or to null. True positives are the
*distinct gold items* matched, so a prediction repeated five times counts once while its
repeats still count as predictions (and lower precision). Precision = sum TP / sum #predicted,
recall = sum TP / sum #gold, over the corpus (micro); F1 from those two. When either list is
empty no judge is needed: TP = 0.

Binarized: an example is flagged when it has at least one description. The paper's Fig. 4
reports its precision, recall and F1 with "inconsistent" as the positive class; fincheck adds
the balanced accuracy of flagged vs gold-inconsistent (its own figure, not in the paper: it
does not reward flagging everything).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fincheck.bootstrap import bootstrap_cis, ci95_lists
from fincheck.classification import (
    balanced_accuracy,
    confusion_matrix,
    harmonic_mean,
    precision_recall,
)

# "A. text", "A) text", "(A) text", "- A. text", "**A.** text", "1. text", "- text"; a marker
# alone on its line ("A.") opens an item whose text follows (the paper's few-shot layout).
_ITEM = re.compile(
    r"^\s*(?:[-*•]\s*)?(?:\*\*)?\(?(?:[A-Z]{1,2}|\d{1,3})[.):](?:\*\*)?(?:\s+(?P<lettered>.+))?$"
    r"|^\s*[-*•]\s+(?P<bullet>.+)$"
)
# The CoT prompts ask for the answer under "Final Output:" (FINAL paper, appendix B.1 / E.2.3).
_FINAL_OUTPUT = re.compile(r"final\s+output\s*:?", re.IGNORECASE)
_DESCRIPTION_LABEL = re.compile(r"^\s*(?:\*\*)?description(?:\*\*)?\s*:\s*", re.IGNORECASE)
# An answer that says there is nothing to report: "None", "None.", "No inconsistencies",
# "There are no factual inconsistencies in the summary.", "The summary is consistent ...": one
# short sentence, with no "but"/"except" that would go on to report something.
_NOTHING = re.compile(
    r"^(?:(?:none|n/a|nothing)(?:\s+(?:found|identified|detected|noted))?\W*$"
    r"|no (?:factual )?(?:inconsistenc|errors?\b|issues?\b|problems?\b|hallucinat)"
    r"|there (?:are|is|were|was) no (?:factual )?(?:inconsistenc|errors?\b|issues?\b|"
    r"problems?\b|hallucinat|unsupported)"
    r"|(?:the )?summary is (?:fully |entirely |completely )?(?:factually )?"
    r"(?:consistent|supported|accurate|faithful)\b)",
    re.IGNORECASE,
)
_GOES_ON = re.compile(r"\b(?:but|except|however|although|though)\b|\n", re.IGNORECASE)
# A label that introduces the answer: "Inconsistencies:" (the layout the few-shot prompts
# teach: "Inconsistencies:\nNone"), "Factual inconsistencies found:", "Answer:".
_ANSWER_LABEL = re.compile(
    r"^\s*(?:\*\*)?(?:(?:factual\s+)?inconsistenc(?:y|ies)(?:\s+found)?|answer)(?:\*\*)?\s*:"
    r"(?:\*\*)?\s*",
    re.IGNORECASE,
)
_DECORATION = "*#\"'`\u201c\u201d \n"


def has_final_output(text: str) -> bool:
    """Whether a reasoning answer reached its "Final Output:" (what the CoT prompts ask for)."""
    return bool(_FINAL_OUTPUT.search(text or ""))


def says_nothing(text: str) -> bool:
    """Whether an answer (or one of its lines or items) says there is nothing to report:
    "None", "None found.", '"None"', "**None**", "There are no inconsistencies." (one short
    sentence with no "but"/"except" going on to report something)."""
    plain = text.strip(_DECORATION).strip()
    return not plain or bool(_NOTHING.match(plain) and not _GOES_ON.search(plain))


BINARY_METRICS = ("binary_precision", "binary_recall", "binary_f1", "binary_bacc")


@dataclass(frozen=True)
class ParsedDescriptions:
    items: list[str]
    structured: bool  # a None-like answer or marked items; False: free prose, read as one item


def read_descriptions(text: str) -> ParsedDescriptions:
    """A model's answer -> its descriptions ([] when it reports nothing), and whether it was in
    a format the prompts ask for.

    - A chain of thought: only what follows the last "Final Output:" counts (its numbered
      reasoning steps are not descriptions).
    - Nothing to report: "None" in every layout seen ("None found.", '"None"', "Inconsistencies:
      None", "A. None", "- None", a sentence then "None" on its own line), and answers that say
      so in words ("There are no factual inconsistencies in the summary.", "No errors found.",
      "The summary is consistent"). A description that merely contains the word ("None of the
      figures match") stays a description.
    - Items: lettered ("A. ..."), parenthesised, numbered and bulleted lines; a marker alone on
      its line opens an item whose text follows, a "Description:" label is dropped; a line
      without a marker continues the item before it; a preamble before the first marker
      ("Here are the issues:") is dropped.
    - Free prose with no marker: one description (the model flagged something in its own
      format), counted as not structured.
    """
    text = _FINAL_OUTPUT.split((text or "").strip())[-1].strip()
    text = _ANSWER_LABEL.sub("", text, count=1).strip()
    if says_nothing(text):
        return ParsedDescriptions([], True)
    items: list[str] = []
    loose: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        match = _ITEM.match(line)
        if match:
            items.append((match.group("lettered") or match.group("bullet") or "").strip())
        elif items:
            items[-1] = f"{items[-1]} {line.strip()}".strip()
        else:
            loose.append(line.strip())
    items = [_DESCRIPTION_LABEL.sub("", item).strip() for item in items]
    marked = bool(items)
    items = [item for item in items if not says_nothing(item)]  # "A. None", "- None"
    if items or marked:
        return ParsedDescriptions(items, True)
    if loose and (says_nothing(loose[0]) or says_nothing(loose[-1])):
        return ParsedDescriptions([], True)  # "None" leads or concludes the answer
    return ParsedDescriptions([" ".join(loose)] if loose else [], False)


def parse_descriptions(text: str) -> list[str]:
    """The descriptions of an answer (see `read_descriptions`)."""
    return read_descriptions(text).items


def true_positives(matching: Mapping[str, str | None]) -> int:
    """Number of distinct gold letters that some prediction was matched to."""
    return len({gold for gold in matching.values() if gold is not None})


@dataclass(frozen=True)
class FinalItem:
    """One FINAL example after judging: its numbers of predicted and gold descriptions and the
    true positives, None when unknown (`judge_failed`: the judge was asked and failed; else no
    judge was configured)."""

    n_pred: int
    n_gold: int
    tp: int | None
    judge_failed: bool = False

    @property
    def tp_known(self) -> bool:
        return self.tp is not None


def final_figures(items: Sequence[FinalItem], judge_failures: str = "miss") -> dict[str, float]:
    """Micro P/R/F1, and over all items the binarized P/R/F1 (the paper's Fig. 4) and BAcc.

    judge_failures="miss" (the headline, as the paper, which excludes nothing): an example the
    judge failed on counts its descriptions with no true positive. "exclude": it is left out
    of P and R (a second figure, beside it). Examples without a judge are always left out.
    """
    counted = [it for it in items if it.tp_known or (it.judge_failed and judge_failures == "miss")]
    tp = sum(it.tp or 0 for it in counted)
    n_pred = sum(it.n_pred for it in counted)
    n_gold = sum(it.n_gold for it in counted)
    precision = tp / n_pred if n_pred else math.nan
    recall = tp / n_gold if n_gold else math.nan
    gold_flagged = [it.n_gold > 0 for it in items]  # inconsistent: the positive class
    flagged = [it.n_pred > 0 for it in items]
    binary_precision, binary_recall = precision_recall(gold_flagged, flagged)
    return {
        "precision": precision,
        "recall": recall,
        "f1": harmonic_mean(precision, recall),
        "binary_precision": binary_precision,
        "binary_recall": binary_recall,
        "binary_f1": harmonic_mean(binary_precision, binary_recall),
        "binary_bacc": balanced_accuracy(gold_flagged, flagged),
    }


def score_final(items: Sequence[FinalItem], n_resamples: int = 1000, seed: int = 0) -> dict:
    """Headline figures (judge failures counted as misses), the variant that excludes them,
    counts named for what they count, and bootstrap CIs (resampling examples)."""
    figures = final_figures(items)
    excluded = final_figures(items, judge_failures="exclude")
    flagged_gold = [it.n_gold > 0 for it in items]
    flagged_pred = [it.n_pred > 0 for it in items]
    counted = [it for it in items if it.tp_known or it.judge_failed]
    return {
        **figures,
        "excluding_judge_failures": {k: excluded[k] for k in ("precision", "recall", "f1")},
        "n": len(items),
        "n_tp_known": sum(it.tp_known for it in items),  # judged, or needing no judge
        "n_judge_failed": sum(it.judge_failed for it in items),  # counted as misses above
        "n_without_judge": sum(not it.tp_known and not it.judge_failed for it in items),
        "true_positives": sum(it.tp or 0 for it in counted),
        "predicted_descriptions": sum(it.n_pred for it in counted),  # the precision's divisor
        "gold_descriptions": sum(it.n_gold for it in counted),  # the recall's divisor
        "binary_confusion": {
            "labels": ["consistent", "inconsistent"],
            "counts": confusion_matrix(flagged_gold, flagged_pred, [False, True]),
        },
        "ci95": ci95_lists(
            bootstrap_cis(
                lambda idx: final_figures([items[i] for i in idx]),
                len(items),
                ("f1", "precision", "recall", *BINARY_METRICS),
                n_resamples,
                seed=seed,
            )
        ),
    }
