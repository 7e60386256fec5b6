"""Metric values on hand-computed cases, and an independent cross-check against scikit-learn."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from fincheck.metrics.bootstrap import bootstrap_ci
from fincheck.metrics.classification import (
    balanced_accuracy,
    harmonic_mean,
    macro_precision_recall,
    roc_auc,
    roc_curve,
)
from fincheck.tasks.fhsumbench.metrics import (
    FACTUAL,
    INVALID,
    NO_HALLU,
    NON_FACTUAL,
    judgement_to_label,
    lenient_judgement,
    score_fhsumbench,
)
from fincheck.tasks.final.lettering import letters
from fincheck.tasks.final.metrics import FinalItem, score_final, true_positives
from fincheck.tasks.final.reader import ParsedDescriptions, parse_descriptions, read_descriptions
from fincheck.tasks.qasem.metrics import (
    QasemItem,
    best_threshold,
    parse_yes_no,
    score_qasem,
    support_score,
)

# ---------------------------------------------------------------- binary metrics


def test_balanced_accuracy_hand_computed():
    # positives: 3, two predicted -> 2/3; negatives: 2, one predicted negative -> 1/2
    gold = [True, True, True, False, False]
    pred = [True, True, False, True, False]
    assert balanced_accuracy(gold, pred) == pytest.approx((2 / 3 + 1 / 2) / 2)


def test_balanced_accuracy_single_class_averages_present_class():
    assert balanced_accuracy([True, True], [True, False]) == 0.5
    assert math.isnan(balanced_accuracy([], []))


def test_auc_with_ties_counts_half():
    # pos scores 0.8, 0.5; neg scores 0.5, 0.2 -> pairs: (0.8>0.5)=1, (0.8>0.2)=1,
    # (0.5=0.5)=0.5, (0.5>0.2)=1 -> 3.5/4
    assert roc_auc([True, True, False, False], [0.8, 0.5, 0.5, 0.2]) == pytest.approx(0.875)
    assert roc_auc([True, False, True, False], [0.3, 0.3, 0.3, 0.3]) == 0.5
    assert math.isnan(roc_auc([True, True], [0.1, 0.9]))


def test_auc_perfect_and_inverted():
    assert roc_auc([True, False], [0.9, 0.1]) == 1.0
    assert roc_auc([True, False], [0.1, 0.9]) == 0.0


def test_roc_curve_ends_at_one():
    fpr, tpr = roc_curve([True, True, False, False], [0.8, 0.5, 0.5, 0.2])
    assert (fpr[0], tpr[0]) == (0.0, 0.0)
    assert (fpr[-1], tpr[-1]) == (1.0, 1.0)
    assert (fpr[2], tpr[2]) == (0.5, 1.0)  # the tied 0.5 step moves both at once


@pytest.mark.slow  # 2.7 s: in `make test`, kept out of the one-minute fast tier
def test_independent_cross_check_against_sklearn():
    import sklearn.metrics as sklearn

    rng = random.Random(7)
    for _ in range(20):
        n = rng.randint(5, 60)
        gold = [rng.random() < 0.4 for _ in range(n)]
        if all(gold) or not any(gold):
            gold[0] = not gold[0]
        scores = [round(rng.random(), 1) for _ in range(n)]  # rounded -> many ties
        pred = [s >= 0.5 for s in scores]
        assert roc_auc(gold, scores) == pytest.approx(sklearn.roc_auc_score(gold, scores))
        assert balanced_accuracy(gold, pred) == pytest.approx(
            sklearn.balanced_accuracy_score(gold, pred)
        )
        labels = ["a", "b", "c", "invalid"]
        g3 = [rng.choice(labels[:3]) for _ in range(n)]
        p3 = [rng.choice(labels) for _ in range(n)]
        p, r, _ = macro_precision_recall(g3, p3)
        assert p == pytest.approx(sklearn.precision_score(g3, p3, average="macro", zero_division=0))
        assert r == pytest.approx(sklearn.recall_score(g3, p3, average="macro", zero_division=0))


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    values = [0.0] * 50 + [1.0] * 50
    ci = bootstrap_ci(lambda idx: sum(values[i] for i in idx) / len(idx), 100, 500, seed=1)
    assert ci is not None and ci.low < 0.5 < ci.high
    assert ci.low > 0.35 and ci.high < 0.65  # about +-1.96 * 0.05
    again = bootstrap_ci(lambda idx: sum(values[i] for i in idx) / len(idx), 100, 500, seed=1)
    assert again == ci
    assert bootstrap_ci(lambda idx: math.nan, 10, 50) is None


def test_a_grouped_bootstrap_resamples_whole_groups_and_its_interval_is_that_of_the_groups():
    """By hand: 30 groups of 10 equal values, 15 groups of ones and 15 of zeros. Resampled by
    group, the mean is that of 30 draws: sd sqrt(0.25 / 30) = 0.091, a 95% interval about
    0.5 +- 1.96 x 0.091, width 0.358. Resampled value by value it is that of 300 draws: sd
    0.029, width 0.113, which would claim a precision the 30 groups do not hold."""
    values = [1.0 if g < 15 else 0.0 for g in range(30) for _ in range(10)]
    groups = [list(range(10 * g, 10 * g + 10)) for g in range(30)]
    drawn: list[list[int]] = []

    def mean(idx):
        drawn.append(list(idx))
        return sum(values[i] for i in idx) / len(idx)

    by_group = bootstrap_ci(mean, 300, 2000, seed=0, groups=groups)
    assert by_group.high - by_group.low == pytest.approx(0.358, abs=0.04)
    for idx in drawn:  # every resample is 30 whole groups
        assert len(idx) == 300
        assert all(idx[k : k + 10] == groups[idx[k] // 10] for k in range(0, 300, 10))
    by_value = bootstrap_ci(mean, 300, 2000, seed=0)
    assert by_value.high - by_value.low == pytest.approx(0.113, abs=0.015)
    # the floor of MIN_ITEMS_FOR_CI counts groups: 29 groups of 10 give no interval
    assert bootstrap_ci(mean, 290, 100, groups=groups[:29]) is None


# ---------------------------------------------------------------- QASem


def test_parse_yes_no():
    assert parse_yes_no("Yes") is True
    assert parse_yes_no(" **No**, the text says otherwise") is False
    assert parse_yes_no("yes.") is True
    assert parse_yes_no("Yesterday") is None
    assert parse_yes_no("Maybe") is None


def test_support_score_rules():
    assert support_score("No", 0.7, gold=False) == (0.7, False, False)  # p_yes wins over text
    assert support_score("Yes", None, gold=False) == (1.0, False, True)
    assert support_score("garbage", None, gold=True) == (0.0, True, True)  # counted wrong
    assert support_score("garbage", None, gold=False) == (1.0, True, True)


def test_score_qasem_per_subset_and_threshold():
    items = [
        QasemItem("cliff", True, 0.5),  # exactly 0.5 -> supported (>=)
        QasemItem("cliff", False, 0.49),
        QasemItem("cliff", False, 0.6),
        QasemItem("factscore", True, 0.9),
        QasemItem("factscore", False, 0.1),
    ]
    out = score_qasem(items, n_resamples=50)
    # cliff: positives 1/1 recalled, negatives 1/2 -> BAcc 0.75; AUC: 0.5>0.49, 0.5<0.6 -> 0.5
    assert out["cliff"]["bacc"] == pytest.approx(0.75)
    assert out["cliff"]["auc"] == pytest.approx(0.5)
    assert out["factscore"]["bacc"] == 1.0 and out["factscore"]["auc"] == 1.0
    assert out["overall"]["n"] == 5
    # pooled: positives {0.5, 0.9}, negatives {0.49, 0.6, 0.1}: 5 of 6 pairs ordered -> 5/6
    assert out["overall"]["auc"] == pytest.approx(5 / 6)
    assert out["mean_of_subsets"]["bacc"] == pytest.approx((0.75 + 1.0) / 2)
    assert "verifiability" not in out


def test_a_threshold_chosen_on_dev_is_scored_beside_the_papers():
    """By hand: gold Yes at 0.9, 0.8, 0.7 and No at 0.6, 0.55, 0.2. At the paper's 0.5 two of
    the three Nos are called supported: BAcc (3/3 + 1/3) / 2 = 0.667. Every Yes is above every
    No, so BAcc peaks at 1.0 between 0.6 and 0.7: the midpoint 0.65. Given 0.65 (as a dev run
    would hand it on), the figures keep BAcc 0.667 and add 1.0 beside it."""
    items = [QasemItem("cliff", True, s) for s in (0.9, 0.8, 0.7)]
    items += [QasemItem("cliff", False, s) for s in (0.6, 0.55, 0.2)]
    assert best_threshold(items) == (pytest.approx(0.65), 1.0)
    out = score_qasem(items, n_resamples=0, threshold=0.65)["overall"]
    assert out["bacc"] == pytest.approx(2 / 3) and out["bacc_at_threshold"] == 1.0
    assert out["threshold"] == 0.65 and out["best_threshold"]["threshold"] == pytest.approx(0.65)
    # a tie goes to the threshold nearest the paper's 0.5: Yes at 0.9, 0.6, 0.2 and No at 0.8,
    # 0.4, 0.1 give BAcc 2/3 at the midpoints 0.15, 0.5 and 0.85 (and at most 0.5 elsewhere)
    tied = [QasemItem("", True, s) for s in (0.9, 0.6, 0.2)]
    tied += [QasemItem("", False, s) for s in (0.8, 0.4, 0.1)]
    assert best_threshold(tied) == (pytest.approx(0.5), pytest.approx(2 / 3))
    # the one sweep finds what trying every midpoint finds, ties and repeated scores included
    rng = random.Random(3)
    for _ in range(200):
        scored = [QasemItem("", rng.random() < 0.6, round(rng.random(), 1)) for _ in range(30)]
        gold = [it.gold for it in scored]
        if all(gold) or not any(gold):
            continue
        scores = sorted({it.score for it in scored})
        midpoints = [(a + b) / 2 for a, b in itertools.pairwise(scores)]
        tried = max(balanced_accuracy(gold, [it.score >= t for it in scored]) for t in midpoints)
        threshold, bacc = best_threshold(scored)
        assert bacc == pytest.approx(tried)
        assert balanced_accuracy(gold, [it.score >= threshold for it in scored]) == pytest.approx(
            bacc
        )


# ---------------------------------------------------------------- FHSumBench


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"Faithfulness": true, "Factuality": false}', (True, False)),
        ('```json\n{"Faithfulness": false, "Factuality": false}\n```', (False, False)),
        ('Reasoning... so: {"Faithfulness": False, "Factuality": True}. Done.', (False, True)),
        ("{'faithfulness': 'true', 'factuality': 'true'}", (True, True)),  # field fallback
        ("Faithfulness: True\nFactuality: False", (True, False)),
        ('{"Faithfulness": "yes", "Factuality": true}', None),
        ("I cannot tell.", None),
        ("", None),
    ],
)
def test_lenient_judgement(text, expected):
    assert lenient_judgement(text) == expected


def test_label_mapping():
    assert judgement_to_label((True, True)) == NO_HALLU
    assert judgement_to_label((False, True)) == FACTUAL
    assert judgement_to_label((False, False)) == NON_FACTUAL
    assert judgement_to_label((True, False)) == INVALID
    assert judgement_to_label(None) == INVALID


def test_fhsumbench_invalid_is_its_own_class_in_macro_averages():
    gold = [FACTUAL, FACTUAL, NON_FACTUAL, NO_HALLU]
    pred = [FACTUAL, INVALID, NON_FACTUAL, FACTUAL]
    out = score_fhsumbench(gold, pred, [False, True, False, False], n_resamples=20)
    # labels: factual, invalid, no_hallu, non_factual
    # precision: factual 1/2, invalid 0/1, no_hallu 0 (never predicted), non_factual 1/1 -> 1.5/4
    # recall:    factual 1/2, invalid 0 (never gold), no_hallu 0/1, non_factual 1/1 -> 1.5/4
    assert out["precision"] == pytest.approx(0.375)
    assert out["recall"] == pytest.approx(0.375)
    assert out["f"] == pytest.approx(0.375)
    assert out["fh_acc"] == 0.5 and out["nfh_acc"] == 1.0 and out["noh_acc"] == 0.0
    assert out["accuracy"] == 0.5
    assert out["parse_failure_rate"] == 0.25 and out["n_invalid"] == 1
    assert out["confusion"]["counts"][0] == [1, 0, 0, 1]  # gold factual: 1 right, 1 invalid


def test_fhsumbench_f_is_harmonic_mean_not_mean_of_f1s():
    gold = [FACTUAL, FACTUAL, FACTUAL, NO_HALLU]
    pred = [FACTUAL, NO_HALLU, NO_HALLU, NO_HALLU]
    out = score_fhsumbench(gold, pred, [False] * 4, n_resamples=0)
    p = (1 / 1 + 1 / 3) / 2  # factual 1/1, no_hallu 1/3
    r = (1 / 3 + 1 / 1) / 2
    assert out["precision"] == pytest.approx(p) and out["recall"] == pytest.approx(r)
    assert out["f"] == pytest.approx(harmonic_mean(p, r))
    assert out["ci95"]["f"] is None


# ---------------------------------------------------------------- FINAL


def test_parse_descriptions_formats():
    assert parse_descriptions("None") == []
    assert parse_descriptions("  none. ") == []
    assert parse_descriptions("A. first is wrong\nB. second") == ["first is wrong", "second"]
    assert parse_descriptions("Issues:\n1) one is wrong\n- two is not\n  in the text") == [
        "one is wrong",
        "two is not in the text",
    ]
    assert parse_descriptions("**A.** bold and wrong\n(B) paren") == ["bold and wrong", "paren"]
    # prose is no list of descriptions: no prediction (FINAL's E.4), counted apart
    assert parse_descriptions("The date is wrong.") == []


COT = """Let me check the summary step by step.
1. The summary says the library opens in 2025. The text says 2027: contradicted.
2. The summary says the council approved it. The text says so: supported.
3. The summary names the mayor. Supported.

Final Output:
A. The summary says the library opens in 2025; the text says 2027."""


@pytest.mark.parametrize(
    ("output", "items", "structured"),
    [
        (COT, ["The summary says the library opens in 2025; the text says 2027."], True),
        ("Reasoning: 1. fine. 2. fine.\nFinal Output: None", [], True),
        ("Step 1. All claims hold.\n\n**Final Output:**\nNone.", [], True),
        ("There are no factual inconsistencies in the summary.", [], True),
        ("No inconsistencies found.", [], True),
        ("The summary is consistent with the text.", [], True),
        ("Final output:\nThere are no inconsistencies.", [], True),
        ("A.\nDescription: The year is wrong.\nB.\nDescription: A name is invented.",
         ["The year is wrong.", "A name is invented."], True),  # the few-shot layout
        # prose that reports something is no list: no description, counted apart (never a guess)
        ("The summary is consistent with the text, except the year.", [], False),
        ("None of it holds: the year is wrong.", [], False),
        ("1. The summary gives 2025.\n2. The text gives 2027.\nFinal Output:\n- The year is wrong.",
         ["The year is wrong."], True),
        # items that name no problem and no text compared: facts restated, counted apart
        ("1. The co-pilot was Andreas Lubitz.\n2. The plane hit the mountain.", [], False),
        # "None" in the layouts models write (the few-shot prompt teaches the first two)
        ("Inconsistencies:\nNone", [], True),
        ("Inconsistencies: None", [], True),
        ("Final Output:\nA. None", [], True),
        ("Final Output:\n- None", [], True),
        ('"None"', [], True),
        ("Final Output: None found.", [], True),
        ("**None**", [], True),
        ("The summary matches the text on every point.\nNone", [], True),
        ("None\nThe summary restates the text.", [], True),
        # ... while descriptions that merely contain the word stay descriptions
        ("Inconsistencies:\nA. None of the players scored, the summary says; the text says two.",
         ["None of the players scored, the summary says; the text says two."], True),
        ("A. None\nB. The year is wrong.", ["The year is wrong."], True),
        ("Inconsistencies: The summary gives 2025.", [], False),
        # "None" with its explanation, other labels, and prose that reports nothing
        ("None. The summary is fully supported by the text.", [], True),
        ("None - every detail is in the text.", [], True),
        ("None (all claims are supported).", [], True),
        ("None, the summary is accurate.", [], True),
        ("Final Output: None. The summary is consistent.", [], True),
        ("Inconsistencies:\nNone. The text supports it.", [], True),
        ("Final Answer: None", [], True),
        ("Output: None", [], True),
        ("I found no inconsistencies.", [], True),
        ("The summary contains no factual inconsistencies.", [], True),
        ("Nothing to report.", [], True),
        ("All claims in the summary are supported.", [], True),
        # a line that reports nothing never cancels one that reports a problem
        ("The summary is accurate in most details.\nHowever, it gives the wrong age (43 instead "
         "of 34).", [], False),
        ("There are no errors in the names.\nThe summary gives the wrong year.", [], False),
        ("A. No errors in the date; the name 'John' is invented.",
         ["No errors in the date; the name 'John' is invented."], True),
        ("None, but the year is wrong.", [], False),
        # the layouts larger models write: never a description of "nothing wrong", never a
        # confident "none" read from markers with no text
        ("There aren't any inconsistencies; everything checks out.", [], True),
        ("$\\boxed{None}$", [], True),
        ('{"inconsistencies": [], "explanation": "All supported."}', [], True),
        ("| Claim | Supported? |\n|---|---|\n| The date | Yes |\n| The name | Yes |", [], True),
        ("| Claim | Supported? |\n|---|---|\n| The date | Yes |\n| The name | No |", [], False),
        ("A.\nB.\nC.", [], False),
        ("1.\n2.", [], False),
        ("没有不一致之处。", [], False),
        ("✅ The date is correct.\n❌ The summary says 60%; the text says 52%.",
         ["The summary says 60%; the text says 52%."], True),
        ("- The year is wrong.\n  - It says 2025.\n  - The text says 2027.\n- The name is invented.",
         ["The year is wrong. It says 2025. The text says 2027.", "The name is invented."], True),
        ("A. The year is wrong. B. The name is invented.",
         ["The year is wrong.", "The name is invented."], True),
        # affirmations are no items; "final output" inside a description is no label
        ("A. The year is wrong.\nB. The date is supported by the text.", ["The year is wrong."],
         True),
        ("A. The summary gives the plant's final output: 300 MW; the text, 200 MW.\nB. The year.",
         ["The summary gives the plant's final output: 300 MW; the text, 200 MW.", "The year."],
         True),
        # a closing remark after a blank line is no part of the last item
        ("Here are the issues:\n\n1. **Age**: 43, the text says 34.\n\nOverall it is good.",
         ["Age: 43, the text says 34."], True),
        ('["The age is wrong.", "The charge is wrong."]',
         ["The age is wrong.", "The charge is wrong."], True),
        ("", [], False),  # an empty answer says nothing either way
        # an indented list is read item by item, wherever its first item's indentation went
        ("Inconsistencies:\n  A. The year is wrong.\n  B. The name is invented.",
         ["The year is wrong.", "The name is invented."], True),
        ("Answer:\n - The year is wrong.\n - The name is invented.",
         ["The year is wrong.", "The name is invented."], True),
        ("Answer: - The year is wrong.\n - The name is invented.",
         ["The year is wrong.", "The name is invented."], True),
        ("Inconsistencies: 1. The year is wrong.\n   2. The name is invented.",
         ["The year is wrong.", "The name is invented."], True),
        ("\n    A. The year is wrong.\n    B. The name is invented.\n",
         ["The year is wrong.", "The name is invented."], True),
        ("A. The year is wrong.\n   1. It says 2025.\n   2. The text, 2027.\nB. A name is invented.",
         ["The year is wrong. It says 2025. The text, 2027.", "A name is invented."], True),
        # a double negative says nothing is wrong; with a contrast or a second clause it reports
        ("A. None of the claims are unsupported.", [], True),
        ("A. Nothing wrong with the date.", [], True),
        ("There is nothing wrong with the summary.", [], True),
        ("1. No detail is made up.\n2. Not a single claim is incorrect.", [], True),
        ("None of the claims are unsupported, except the date.", [], False),
        ("A. Nothing wrong with the date; the name is invented.",
         ["Nothing wrong with the date; the name is invented."], True),
        ("Nothing in the summary is supported.", [], False),
        # an answer, then a new example the model goes on to write: the answer ends there
        ("None\n\nExample 4\nText: A fire.\nSummary: A flood.\nInconsistencies:\nA.\n"
         "Description: The summary says a flood; the text says a fire.", [], True),
        ("Example 4\nText: A fire.\nInconsistencies:\nA. The summary says a flood.",
         ["The summary says a flood."], True),  # an example first: the answer after it
        # a verdict of nothing before a list, or a JSON object that disagrees with itself
        ("None\nA. The summary says the fire was in Leeds; the text says Bradford.", [], False),
        ("No inconsistencies.\n- The year is wrong.", [], False),
        ("Answer: None\n\nExplanation:\n1. The summary says Hull; the text says Hull.", [], False),
        # an item that affirms what it compared; a title before an inline marker ("Sen. B.")
        ("A. The summary says Monday; the text says Monday. This is consistent.", [], False),
        ("A. The summary says Sen. B. Harris sponsored it; the text says Sen. C. Ortiz.", [], False),
        ("A. The summary says 2030; the text says 2035. B. It says vans; the text says cars.",
         ["The summary says 2030; the text says 2035.", "It says vans; the text says cars."], True),
        ("A. The summary says 2030; the text says 2035.\n\nOtherwise, there are no "
         "inconsistencies.", ["The summary says 2030; the text says 2035."], True),
        ('{"consistent": true, "issues": ["The year is wrong."]}', [], False),
        ('{"has_errors": "yes", "errors": []}', [], False),
        ('{"consistent": true, "issues": []}', [], True),
        ('{"inconsistencies": [], "explanation": "The summary is consistent."}', [], True),
    ],
)  # fmt: skip
def test_cot_and_nothing_to_report_answers(output, items, structured):
    """Only what follows the last "Final Output:" counts (the CoT prompts' marker, FINAL paper
    appendix B.1); its numbered reasoning is not a description, and an answer that says there is
    nothing to report is an empty list, not a flagged item."""
    assert read_descriptions(output) == ParsedDescriptions(items, structured)


def test_a_reasoning_answer_without_its_final_output_has_no_answer():
    """A chain of thought asked to answer under "Final Output:" and ending without it: its
    steps are no descriptions (counted apart), whatever they say."""
    steps = "1. The year is 2025: contradicted.\n2. The mayor: supported."
    assert read_descriptions(steps, reasoning=True) == ParsedDescriptions([], False)
    assert read_descriptions(
        f"{steps}\nFinal Output:\nA. The year is wrong.", reasoning=True
    ).items == ["The year is wrong."]


def test_letters():
    assert letters(3) == ["A", "B", "C"]
    assert letters(28)[-2:] == ["AA", "AB"]


def test_true_positives_count_distinct_gold():
    assert true_positives({"A": "C", "B": None, "C": "B"}) == 2
    assert true_positives({"A": "A", "B": "A", "C": "A"}) == 1  # repeats count once


def test_score_final_micro_and_binarized():
    items = [
        FinalItem(n_pred=3, n_gold=3, tp=2),  # the paper's example
        FinalItem(n_pred=5, n_gold=1, tp=1),  # one error found, repeated five times
        FinalItem(n_pred=0, n_gold=2, tp=0),  # missed everything (no judge call)
        FinalItem(n_pred=1, n_gold=0, tp=0),  # false alarm on a consistent summary
        FinalItem(n_pred=0, n_gold=0, tp=0),  # correct None
    ]
    out = score_final(items, n_resamples=50)
    assert out["precision"] == pytest.approx(3 / 9)
    assert out["recall"] == pytest.approx(3 / 6)
    assert out["f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # binarized: gold inconsistent {0,1,2}: flagged 0,1 -> 2/3; consistent {3,4}: 1/2 right
    assert out["binary_bacc"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert out["binary_confusion"]["counts"] == [[1, 1], [1, 2]]
    # the paper's Fig. 4 figures, positive = inconsistent: flagged {0,1,3}, of which 0,1 are
    # inconsistent -> P 2/3; inconsistent {0,1,2}, of which 0,1 flagged -> R 2/3
    assert out["binary_precision"] == pytest.approx(2 / 3)
    assert out["binary_recall"] == pytest.approx(2 / 3)
    assert out["binary_f1"] == pytest.approx(2 / 3)


def test_binarized_figures_of_flagging_everything():
    """Flagging every summary: binarized F1 2p/(1+p) for a share p of inconsistent ones (the
    paper's figure rewards it), BAcc 0.5 (fincheck's does not)."""
    items = [FinalItem(1, 1, 1)] * 3 + [FinalItem(1, 0, 0)] * 7  # p = 0.3
    out = score_final(items, n_resamples=0)
    assert out["binary_precision"] == pytest.approx(0.3) and out["binary_recall"] == 1.0
    assert out["binary_f1"] == pytest.approx(2 * 0.3 / 1.3)
    assert out["binary_bacc"] == 0.5


def test_judge_failures_count_as_misses_in_the_headline_and_apart_beside_it():
    items = [FinalItem(2, 2, 1), FinalItem(4, 4, None, judge_failed=True)]
    out = score_final(items, n_resamples=0)
    # headline: the failed example's 4 predictions and 4 gold items count, with no TP
    assert out["precision"] == 1 / 6 and out["recall"] == 1 / 6
    assert out["predicted_descriptions"] == 6 and out["gold_descriptions"] == 6
    assert out["excluding_judge_failures"]["precision"] == 0.5
    assert out["n_judge_failed"] == 1 and out["n_tp_known"] == 1 and out["n_without_judge"] == 0


def test_examples_without_a_judge_are_left_out_and_counted_as_such():
    items = [FinalItem(2, 2, 1), FinalItem(0, 3, 0), FinalItem(4, 4, None)]
    out = score_final(items, n_resamples=0)
    assert out["precision"] == 0.5 and out["recall"] == 1 / 5
    assert out["n_without_judge"] == 1 and out["n_tp_known"] == 2


def test_fhsumbench_non_factual_bacc_hand_computed():
    """Non-factual hallucination or not, balanced: an invalid answer is not 'non-factual'."""
    gold = [NON_FACTUAL, NON_FACTUAL, FACTUAL, NO_HALLU]
    pred = [NON_FACTUAL, INVALID, NON_FACTUAL, NO_HALLU]
    out = score_fhsumbench(gold, pred, [False, True, False, False], n_resamples=0)
    # recall of non-factual 1/2, of the others (factual, no_hallu) 1/2 -> 0.5
    assert out["factuality_bacc"] == pytest.approx(0.5)
    # faithful or not: no_hallu 1/1, the three hallucinations predicted not no_hallu 3/3 -> 1.0
    assert out["faithfulness_bacc"] == pytest.approx(1.0)
    assert "factuality_bacc" in out["ci95"]


def _seconds(read, text: str, tries: int = 3) -> float:
    """The best of `tries` timings of `read(text)` (a reader may raise its own parse error), in
    this process's CPU time: other work on a shared machine does not move it, as it moves the
    wall clock (a run beside a training job once read 0.56 s for a 0.05 s parse)."""
    import contextlib
    import time

    best = float("inf")
    for _ in range(tries):
        start = time.process_time()
        with contextlib.suppress(Exception):  # only the time matters here
            read(text)
        best = min(best, time.process_time() - start)
    return best


GROWTH_SHAPES = [
    "✅\n",
    ",\n",
    "$",
    "\n $",
    "( ;\n",
    "\t {\n",
    "A. x B. x ",
    "all ",
    "\n",
    "- 1\n",
    "- neither ",
    "- the x is not ",
    "factual ",
    "major ",
    "a.",  # a URL's scheme, tried from every "."
    "a-",
    "key",  # a query name holding a secret's word, after the "?" below
]
# a run of one unit between two words: white space that a pattern may try at every start
WRAPPED_SHAPES = [
    ("A", " ", "B"),
    ("- x", "\t", "y"),
    ("A. ", " \n", "B"),
    ("```json", " ", "```"),
    ("A. no ", "factual ", ""),
    ("?", "key", ""),
    ("?", "?a", ""),
    ("", "a-", ":"),
]


@pytest.mark.slow  # timings of 150 parses a case: `make test` runs them, as benchmarks
@pytest.mark.parametrize(
    "head, unit, tail",
    [("", unit, "") for unit in GROWTH_SHAPES] + WRAPPED_SHAPES,
    ids=[repr(unit) for unit in GROWTH_SHAPES] + [repr("".join(s)) for s in WRAPPED_SHAPES],
)
def test_the_answer_readers_take_linear_time_on_model_output(head, unit, tail):
    """A model's answer is untrusted input: four times the text may not take eight times the
    time (a quadratic reader takes sixteen; one 60 KB answer of '✅' lines took 29 s before, one
    of 100 KB holding a run of spaces 22 s)."""
    from fincheck.io.secrets import public_url, redact
    from fincheck.tasks.fhsumbench.metrics import lenient_judgement
    from fincheck.tasks.final.judge import parse_matching

    readers = {
        "final": read_descriptions,
        "fhsumbench": lenient_judgement,
        "judge": lambda text: parse_matching(text, ["a", "b"], ["c"]),
        # every served reply and every printed line goes through the secrets filter
        "redact": redact,
        "public_url": public_url,
    }
    for name, read in readers.items():
        small, large = (head + (unit * (n // len(unit) + 1))[:n] + tail for n in (20_000, 80_000))
        # interleaved, the best of three each: a machine's load changes between the two
        timings = [(_seconds(read, small, 1), _seconds(read, large, 1)) for _ in range(3)]
        fastest_small, fastest_large = (min(t) for t in zip(*timings, strict=True))
        ratio_allowed = 8 * fastest_small + 0.05  # + 50 ms: timer noise on tiny times
        assert fastest_large < ratio_allowed, f"{name} reader on {unit!r} x 4"
