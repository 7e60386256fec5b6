"""QASemConsistency: does the reference text support one predicate-argument QA of a response?

Data: the benchmark's dev and test files (one record per response, its QAs inside). Each QA
becomes one pair: reference text + the response sentence + question + answer -> `Yes` / `No`,
the majority of three votes where 1 means NOT supported. Our train/dev come from its dev file
(grouped by source: the responses of several models about one source share its document, so
they stay on one side), our test is its test file (1,556 QAs).
Metric (the QASem paper, Table 4): s = P(Yes)/(P(Yes)+P(No)) at the first answer position,
supported iff s >= 0.5; balanced accuracy and ROC-AUC of s per sub-dataset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.data.pairs import Pair
from fincheck.data.prompting import YES_NO
from fincheck.data.splits import split_by_group
from fincheck.io.config import config_field
from fincheck.io.sources import Source
from fincheck.metrics.classification import confusion_matrix, roc_curve
from fincheck.metrics.figures import fmt, fmt_ci
from fincheck.tasks.base import (
    CardInfo,
    Collected,
    DemoPlan,
    Joined,
    PaperNumber,
    PrepareSettings,
    ScoreSettings,
    Task,
    TaskScore,
    paper_rows,
)
from fincheck.tasks.qasem.convert import (
    NOT_SUPPORTED,
    SUPPORTED,
    convert_qasem_response,
    qasem_response_id,
    qasem_source_id,
)
from fincheck.tasks.qasem.metrics import (
    SUBSETS,
    THRESHOLD,
    QasemItem,
    parse_yes_no,
    qasem_figures,
    score_qasem,
    support_score,
)

# the paper's names of the subsets' columns
SUBSET_TITLES = {"cliff": "CLIFF", "factscore": "FActScore", "verifiability": "Generative Search"}
_ORIGIN = "https://raw.githubusercontent.com/ariecattan/qasem_consistency/6a48e9dfa09ec310f52223284ebbffe281e72c18/data"
_LICENSE = (
    "QASemConsistency (Cattan et al.); no license file in the repository at the pinned commit: "
    "research use; ask the authors before redistributing"
)
DEV, TEST = (
    Source(f"qasem/{split}.jsonl", f"{_ORIGIN}/{split}.jsonl", sha256, _LICENSE)
    for split, sha256 in (
        ("dev", "fde80e4c4c61bddd32c37a73b07957611d4020e80e8a7fc450d4f4505897556f"),
        ("test", "c816457d29088a976abe66fee8c472ee2d9e9d78cd6cfa789ebd875956eb1e5b"),
    )
)

_TABLE = "QASem paper, Table 4"


def _table4(system: str, bacc: tuple[float, ...], auc: tuple[float, ...] | None = None):
    """One system's row of Table 4 (percent in the paper, fractions here)."""
    return [
        PaperNumber(system, metric, round(v / 100, 4), _TABLE, subset)
        for metric, values in (("bacc", bacc), ("auc", auc))
        if values
        for subset, v in zip(SUBSETS, values, strict=True)
    ]


@dataclass
class QasemPrepareOptions(PrepareSettings):
    qasem_dev_fraction: float = config_field(
        0.15,
        "share of QASem's dev QAs held out as our dev split (grouped by source: every response "
        "about one source on one side); its test split is the evaluation set",
        at_least=0,
        below=1,
    )


class QasemTask(Task):
    prepare_options = QasemPrepareOptions
    name = "qasem"
    listed = 2
    title = "QASemConsistency"
    max_new_tokens = 8
    first_word_share = YES_NO
    limit_by_document = True  # ~14 QAs per reference document
    # The demo: about 200 QAs of 14 test references (its prefix tree makes them cheap; QAs of
    # one reference are not independent evidence), a fifth of its train references, whole.
    demo = DemoPlan(test_examples=200, train_weight=0.2)
    paper_numbers = (
        *_table4("GPT-4o", (75.7, 82.4, 79.2)),
        *_table4("MiniCheck-770M", (70.4, 78.0, 76.3), (80.8, 87.3, 83.4)),
        *_table4("Gemma-2-9B", (70.0, 78.0, 77.1), (82.5, 88.1, 87.1)),
        *_table4("Llama-3.1-8B", (65.8, 76.5, 68.5), (79.0, 89.4, 83.7)),
    )
    comparability = (
        "QASem numbers are on its test split (1,556 QAs), like ours; the paper's verifiability "
        "column is called Generative Search. The paper's verifiers see the article and the QA "
        "only (its Table 5); fincheck's detector prompt also shows the response sentence the "
        "QA was taken from (the baselines' prompts do not), so a detector's figures are not "
        "in the paper's setting. Its rows are LLMs prompted without training and MiniCheck "
        "(trained on other data, at 0.5 with no threshold tuning); a fincheck adapter is "
        "fine-tuned on responses of QASem's dev file, a threshold other than 0.5 is chosen on "
        "the dev split and labelled. No row of the paper is of fincheck's sizes (0.5B-1.5B); "
        "MiniCheck-770M is the nearest."
    )
    card = CardInfo(
        task_type="text-classification",
        task_name="QA support labels (QASemConsistency)",
        dataset_type="qasem_consistency",
        dataset_name="QASemConsistency",
        metrics=("bacc", "auc"),
        subsets=(*SUBSETS, "overall"),
        data_origin="QASemConsistency (github.com/ariecattan/qasem_consistency)",
    )

    # --- prepare ---------------------------------------------------------------------------

    def sources(self, config) -> list:
        return [DEV, TEST]

    def collect(self, config, files: dict[str, Path], stream) -> Collected:
        prompt = self.prompt()
        dev = stream.convert_file(
            DEV.name,
            files[DEV.name],
            qasem_response_id,
            lambda raw: convert_qasem_response(raw, "dev", "train", prompt),
        )
        fraction = config.qasem_dev_fraction
        split_by_group(dev, {"train": 1 - fraction, "dev": fraction}, config.seed)
        test = stream.convert_file(
            TEST.name,
            files[TEST.name],
            qasem_response_id,
            lambda raw: convert_qasem_response(raw, "test", "test", prompt),
        )
        return Collected(dev + test)

    # --- score -----------------------------------------------------------------------------

    def score(self, joined: Joined, settings: ScoreSettings) -> TaskScore:
        threshold = settings.thresholds.get(self.name)
        items, examples = [], []
        for pair, pred in joined:
            gold = pair.meta_value("label", str) == "Yes"
            s, failed, from_text = support_score(pred.output, pred.p_yes, gold)
            neither = parse_yes_no(pred.output) is None
            item = QasemItem(pair.meta_value("dataset", str), gold, s, failed, from_text, neither)
            items.append(item)
            examples.append(
                {
                    "id": pair.id,
                    "subset": item.subset,
                    "gold": "Yes" if gold else "No",
                    "output": pred.output,
                    "score": s,
                    "predicted": "Yes" if item.predicted else "No",
                    "parse_failed": failed,
                    "text_not_yes_no": neither,
                    **({"threshold": threshold} if threshold is not None else {}),
                }
            )
        figures = score_qasem(
            items, settings.bootstrap_resamples, settings.seed, threshold, settings.unit_keys
        )
        return TaskScore(figures, examples)

    # the pooled figures, then each subset's AUC (the paper's columns: "auc_cliff", ...)
    needs_more_than_dev = ("bacc_at_threshold",)  # a threshold chosen on dev beforehand
    choose_by = "auc"  # the ranking, which no threshold choice changes
    compare_metrics = (
        ("auc", "ROC-AUC"),
        ("bacc", "BAcc"),
        ("bacc_at_threshold", "BAcc at the dev threshold"),
        *((f"auc_{s}", f"{SUBSET_TITLES[s]} AUC") for s in SUBSETS),
    )

    # 1,556 test QAs ask about 151 responses over 49 sources: the QAs of one source are not
    # independent draws, so intervals resample whole sources (or whole responses on request)
    resample_units = ("source", "response")

    def resample_keys(self, pair: Pair) -> dict[str, str]:
        response = pair.meta_value("response_id", str)
        return {"source": qasem_source_id(response), "response": response}

    def compare_figure(self, figures: dict, metric: str) -> tuple[float | None, list | None]:
        subset = next((s for s in SUBSETS if metric == f"auc_{s}"), None)
        section = figures.get(subset or "overall") or {}
        metric = "auc" if subset else metric
        return section.get(metric), (section.get("ci95") or {}).get(metric)

    def example_figures(self, examples: Sequence[dict]) -> dict[str, float]:
        # score_qasem's figures: pooled, and each subset's AUC; predicted is score >= THRESHOLD
        def items(group: Sequence[dict]) -> list[QasemItem]:
            return [QasemItem("", ex["gold"] == "Yes", ex["score"]) for ex in group]

        thresholds = {ex.get("threshold") for ex in examples}  # scored with --threshold
        threshold = thresholds.pop() if len(thresholds) == 1 else None
        figures = {"bacc_at_threshold": math.nan, **qasem_figures(items(examples), threshold)}
        for subset in SUBSETS:
            group = [ex for ex in examples if ex.get("subset") == subset]
            figures[f"auc_{subset}"] = qasem_figures(items(group))["auc"] if group else math.nan
        return figures

    def unreadable_outputs(self, figures: dict) -> tuple[int, int, str]:
        overall = figures["overall"]
        return overall["n_text_not_yes_no"], overall["n"], "answers not starting with Yes or No"

    def headline(self, figures: dict) -> list[tuple[str, float | None]]:
        """Each subset's BAcc and AUC, then the pooled ones: "cliff BAcc 0.712 AUC 0.790 ..."."""
        return [
            figure
            for name in (*SUBSETS, "overall")
            if name in figures
            for figure in ((f"{name} BAcc", figures[name]["bacc"]), ("AUC", figures[name]["auc"]))
        ]

    def report_section(self, figures: dict) -> list[str]:
        subsets = [s for s in SUBSETS if s in figures]
        header = (
            "| system | "
            + " | ".join(f"{s} BAcc (n={figures[s]['n']}) | {s} AUC" for s in subsets)
            + f" | overall BAcc (n={figures['overall']['n']}) | overall AUC |"
        )
        out = [header, "| --- " * (2 * len(subsets) + 3) + "|"]
        row = "| **this run** | " + " | ".join(
            f"{fmt_ci(figures[s], 'bacc', 100, 1)} | {fmt_ci(figures[s], 'auc', 100, 1)}"
            for s in subsets
        )
        overall = figures["overall"]
        out.append(
            row + f" | {fmt_ci(overall, 'bacc', 100, 1)} | {fmt_ci(overall, 'auc', 100, 1)} |"
        )
        for system, numbers in paper_rows(self.paper_numbers).items():
            cells = " | ".join(
                f"{fmt(numbers.get(('bacc', s)), 100, 1)} | {fmt(numbers.get(('auc', s)), 100, 1)}"
                for s in subsets
            )
            out.append(f"| {system} | {cells} | – | – |")
        out += [
            "",
            f"Figures in percent; verifiability is the paper's Generative Search column; paper "
            f"rows: {_TABLE}. Supported iff P(Yes)/(P(Yes)+P(No)) ≥ {THRESHOLD}. "
            f"{overall['n_scored_from_text']} predictions had no p_yes and were scored from their "
            f"text; {overall['n_parse_failed']} of those were neither Yes nor No (counted wrong). "
            f"{overall['n_text_not_yes_no']} outputs in all did not start with Yes or No: with "
            "p_yes they are scored by P(Yes) at the answer position (the paper's protocol), "
            "whatever the text says.",
            "",
        ]
        if "threshold" in overall:
            out += [
                f"BAcc at the threshold {overall['threshold']} (`--threshold`, chosen on dev, "
                f"not the paper's protocol): overall {fmt_ci(overall, 'bacc_at_threshold', 100, 1)}"
                + "".join(
                    f", {s} {fmt_ci(figures[s], 'bacc_at_threshold', 100, 1)}" for s in subsets
                )
                + ".",
                "",
            ]
        if "best_threshold" in overall:
            best = overall["best_threshold"]
            out += [
                f"On these QAs BAcc would peak at {fmt(best['bacc'], 100, 1)} with the threshold "
                f"{best['threshold']} (in-sample: read it off a dev run and pass it to the "
                f"test run's `fincheck score --threshold {self.name}=...`).",
                "",
            ]
        if overall["n_scored_from_text"] == overall["n"]:
            out += [
                "No prediction carried p_yes: the AUC is that of hard 0/1 scores (it equals the "
                "BAcc) and is not comparable with the paper's AUC column.",
                "",
            ]
        return out

    def plots(self, score: TaskScore, plot_dir: Path, model: str | None) -> list[Path]:
        from fincheck.metrics import plots

        made = []
        groups: dict[str, list[dict]] = {}
        for ex in score.examples:
            groups.setdefault(ex["subset"], []).append(ex)
        groups["overall"] = score.examples
        curves = {}
        for name, group in groups.items():
            gold = [ex["gold"] == "Yes" for ex in group]
            if all(gold) or not any(gold):
                continue
            fpr, tpr = roc_curve(gold, [ex["score"] for ex in group])
            curves[name] = (fpr, tpr, score.figures[name]["auc"])
        if curves:
            made.append(
                plots.plot_roc(
                    curves,
                    f"QASem ROC: {model}" if model else "QASem ROC (positive = supported)",
                    plot_dir / "qasem_roc.png",
                )
            )
        counts = confusion_matrix(
            [ex["gold"] for ex in score.examples],
            [ex["predicted"] for ex in score.examples],
            ["Yes", "No"],
        )
        made.append(
            plots.plot_confusion(
                counts,
                ["Yes", "No"],
                f"QASem (s >= {THRESHOLD})" + (f": {model}" if model else ""),
                plot_dir / "qasem_confusion.png",
            )
        )
        return made

    def gold_consistent(self, pair: Pair) -> bool:
        return pair.meta_value("label", str) == SUPPORTED

    def verdict_answer(self, consistent: bool, reason: str) -> str:
        return SUPPORTED if consistent else NOT_SUPPORTED

    # --- serve -----------------------------------------------------------------------------

    def detect_output(
        self, text: str, p_yes: float | None, threshold: float | None = None
    ) -> dict[str, Any]:
        at = THRESHOLD if threshold is None else threshold
        return {"p_yes": p_yes, "supported": p_yes is not None and p_yes >= at}


TASK = QasemTask()
