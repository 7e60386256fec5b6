"""FHSumBench: is a summary faithful to its document, and is it factual in the world?

Data: the benchmark's one file, 1,336 (source, summary, label) samples over 466 documents.
Target: `{"Faithfulness": bool, "Factuality": bool}` (no_hallu = faithful + factual,
factual_hallu = unfaithful + factual, non_factual_hallu = unfaithful + non-factual). Split by
document (40/10/50 by default; `fhsumbench_eval_all` puts all 1,336 in test, as the paper).
Metric: the reference scorer's (the benchmark repository's method/score.py): macro P and R over
gold ∪ predicted labels, "invalid" a class of its own, F their harmonic mean; per-class accuracy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.data.pairs import Pair
from fincheck.data.splits import split_by_group
from fincheck.io.config import config_field
from fincheck.io.sources import Source
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
from fincheck.tasks.fhsumbench.convert import convert_fhsumbench
from fincheck.tasks.fhsumbench.metrics import (
    INVALID,
    fhsumbench_figures,
    judgement_to_label,
    lenient_judgement,
    score_fhsumbench,
)
from fincheck.tasks.fhsumbench.reference import cot_judgement, reference_judgement

DATA = Source(
    "fhsumbench/FHSumBench_data.json",
    "https://raw.githubusercontent.com/cece00/FHSumBench/4cffcdffac22e6174bbece5d5525548321cd4bd6"
    "/FHSumBench_data.json",
    "657caa975b34c261573faae06a5b76a239039e724e7db0d286f5ac22cd6b6031",
    "FHSumBench (XSum-derived); no license file in the repository at the pinned commit: "
    "research use; ask the authors before redistributing",
)


# The paper's tables, all on the 1,336 samples (Table 2's retrieval rows may not be: their
# per-class accuracies in Table 6 do not come out as fractions of the class sizes).
_T1 = "FHSumBench paper, Table 1"
_T2 = "FHSumBench paper, Table 2"
_T7 = "FHSumBench paper, Table 7 (appendix)"


def _prf(system: str, t: str, p: float, r: float, f: float) -> list[PaperNumber]:
    """One system's macro P, macro R and F (t: the paper's table)."""
    return [PaperNumber(system, m, v, t) for m, v in {"precision": p, "recall": r, "f": f}.items()]


@dataclass
class FhsumbenchPrepareOptions(PrepareSettings):
    fhsumbench_train_fraction: float = config_field(
        0.4, "FHSumBench share for training (grouped by source document)", at_least=0, at_most=1
    )
    fhsumbench_dev_fraction: float = config_field(
        0.1, "FHSumBench share for validation (grouped by source document)", at_least=0, at_most=1
    )
    fhsumbench_test_fraction: float = config_field(
        0.5, "FHSumBench share for evaluation (grouped by source document)", at_least=0, at_most=1
    )
    fhsumbench_eval_all: bool = config_field(
        False,
        "put all 1,336 FHSumBench samples in test and train on none of them (numbers comparable with the paper)",
    )

    def check(self) -> None:
        fractions = (
            self.fhsumbench_train_fraction,
            self.fhsumbench_dev_fraction,
            self.fhsumbench_test_fraction,
        )
        if any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise ValueError(f"FHSumBench fractions must be >= 0 and sum to 1, got {fractions}")


class FhsumbenchTask(Task):
    prepare_options = FhsumbenchPrepareOptions
    name = "fhsumbench"
    listed = 3
    title = "FHSumBench"
    max_new_tokens = 96
    # 64 tokens hold the label's JSON object five times over (the untuned base writes on)
    demo = DemoPlan(test_examples=36, answer_tokens=64, train_cap=32)
    paper_numbers = (
        *_prf("GPT-4o vanilla", _T1, 0.4575, 0.4650, 0.4612),
        PaperNumber("GPT-4o CoT", "f", 0.4637, _T1),
        *_prf("Qwen2.5-7B vanilla", _T7, 0.4587, 0.4706, 0.4646),
        PaperNumber("GPT-4o reflection retrieval (best of Table 2)", "f", 0.5010, _T2),
        PaperNumber("Qwen2.5-72B reflection retrieval (best overall)", "f", 0.5022, _T7),
        # the same sizes as fincheck's CPU detectors, zero-shot (vanilla judge)
        *_prf("Qwen2.5-0.5B vanilla", _T7, 0.2631, 0.1918, 0.2219),
        *_prf("Qwen2.5-1.5B vanilla", _T7, 0.3609, 0.3504, 0.3556),
        *_prf("Random", _T1, 0.3185, 0.3184, 0.3185),
    )
    comparability = (
        "FHSumBench's rows are off-the-shelf LLM judges prompted without training, on all 1,336 "
        "samples. A fincheck adapter is fine-tuned on 40% of the source documents and evaluated "
        "on the summaries of another half (667 with `configs/prepare/default.yaml`): other items "
        "and another training regime. The same-size zero-shot rows (Qwen2.5-0.5B and 1.5B "
        "vanilla, Table 7) are the nearest anchors; `configs/prepare/paper-eval.yaml` holds all "
        "1,336 out for a zero-shot system."
    )
    card = CardInfo(
        task_type="text-classification",
        task_name="Factual vs non-factual hallucination (FHSumBench)",
        dataset_type="fhsumbench",
        dataset_name="FHSumBench",
        metrics=("f", "precision", "recall", "accuracy", "fh_acc", "nfh_acc", "noh_acc"),
        data_origin="FHSumBench (github.com/cece00/FHSumBench)",
    )

    # --- prepare ---------------------------------------------------------------------------

    def sources(self, config) -> list:
        return [DATA]

    def collect(self, config, files: dict[str, Path], stream) -> Collected:
        prompt = self.prompt()
        samples = stream.convert_file(
            DATA.name,
            files[DATA.name],
            lambda r: str(r["id"]),
            lambda raw: convert_fhsumbench(raw, "test", prompt),
        )
        if not config.fhsumbench_eval_all:
            split_by_group(
                samples,
                {
                    "train": config.fhsumbench_train_fraction,
                    "dev": config.fhsumbench_dev_fraction,
                    "test": config.fhsumbench_test_fraction,
                },
                config.seed,
            )
        return Collected(samples, {"fhsumbench_documents": len({p.meta["group"] for p in samples})})

    # --- score -----------------------------------------------------------------------------

    def score(self, joined: Joined, settings: ScoreSettings) -> TaskScore:
        """The headline figures read every output as the reference scorer does; the same
        figures under fincheck's lenient reading go beside them, labelled."""
        gold, pred, failed, lenient, examples = [], [], [], [], []
        stages: dict[str, int] = {}
        reasoned = 0
        for pair, prediction in joined:
            # A chain of thought: the paper's CoT runs scored the judgement stored apart from
            # the reasoning; here it is the answer's last JSON object (`cot_judgement`)
            text = cot_judgement(prediction.output) if prediction.reasoning else prediction.output
            reasoned += prediction.reasoning
            judgement, stage = reference_judgement(text)
            label = judgement_to_label(judgement)
            gold.append(pair.meta_value("label", str))
            pred.append(label)
            failed.append(judgement is None)
            lenient.append(judgement_to_label(lenient_judgement(prediction.output)))
            stages[stage] = stages.get(stage, 0) + 1
            examples.append(
                {
                    "id": pair.id,
                    "gold": gold[-1],
                    "output": prediction.output,
                    "predicted": label,
                    "parse_failed": judgement is None,
                    "read_by": stage,
                    "lenient_predicted": lenient[-1],
                }
            )
        figures = score_fhsumbench(
            gold, pred, failed, settings.bootstrap_resamples, settings.seed, settings.unit_keys
        )
        figures["read_by"] = dict(sorted(stages.items()))
        figures["n_chain_of_thought"] = reasoned
        figures["lenient_parse"] = {
            **fhsumbench_figures(gold, lenient),
            "n_invalid": lenient.count(INVALID),
        }
        return TaskScore(figures, examples)

    # the reference scorer's F (harmonic mean of macro P and R)
    choose_by = "f"
    compare_metrics = (
        ("f", "F"),
        ("precision", "macro P"),
        ("recall", "macro R"),
        ("faithfulness_bacc", "faithful BAcc (not in the paper)"),
        ("factuality_bacc", "non-factual BAcc (not in the paper)"),
    )
    shuffle_floor_metrics = ("f",)
    resample_units = ("source",)  # the 667 test summaries share 227 source documents

    def resample_keys(self, pair: Pair) -> dict[str, str]:
        return {"source": pair.meta_value("group", str)}  # the split's key: the source text

    def example_figures(self, examples: Sequence[dict]) -> dict[str, float]:
        return fhsumbench_figures(
            [ex["gold"] for ex in examples], [ex["predicted"] for ex in examples]
        )

    def unreadable_outputs(self, figures: dict) -> tuple[int, int, str]:
        return figures["n_parse_failed"], figures["n"], "outputs the reference parser cannot read"

    def headline(self, figures: dict) -> list[tuple[str, float | None]]:
        return [("P", figures["precision"]), ("R", figures["recall"]), ("F", figures["f"])]

    def headline_text(self, figures: dict) -> str:
        return f"{super().headline_text(figures)} parse failures {figures['n_parse_failed']}"

    def report_section(self, figures: dict) -> list[str]:
        f = figures
        out = [
            "| system | n | macro P | macro R | F | FH-Acc | NFH-Acc | NoH-Acc |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| **this run** | {f['n']} | {fmt_ci(f, 'precision')} | {fmt_ci(f, 'recall')} | "
            f"{fmt_ci(f, 'f')} | {fmt(f['fh_acc'])} | {fmt(f['nfh_acc'])} | {fmt(f['noh_acc'])} |",
        ]
        if lenient := f.get("lenient_parse"):
            out.append(
                f"| this run, lenient parse | {f['n']} | {fmt(lenient['precision'])} | "
                f"{fmt(lenient['recall'])} | {fmt(lenient['f'])} | {fmt(lenient['fh_acc'])} | "
                f"{fmt(lenient['nfh_acc'])} | {fmt(lenient['noh_acc'])} |"
            )
        for system, numbers in paper_rows(self.paper_numbers).items():
            cells = " | ".join(fmt(numbers.get((m, None))) for m in ("precision", "recall", "f"))
            out.append(f"| {system} | – | {cells} | – | – | – |")
        out += [
            "",
            f"F is the harmonic mean of macro-P and macro-R over gold ∪ predicted labels; "
            f"{f['n_invalid']} invalid predictions (faithful+non-factual or unparseable) form "
            f"their own class; parse failures {f['n_parse_failed']} "
            f"({fmt(f['parse_failure_rate'], 100, 1)}%). Outputs are read as the "
            f"benchmark's reference scorer reads them (stages: {f.get('read_by', {})}); the "
            "lenient-parse row reads them more tolerantly and is not comparable with the papers.",
            "",
            f"Faithful or not (no_hallu vs either hallucination), balanced accuracy: "
            f"{fmt_ci(f, 'faithfulness_bacc')}; non-factual hallucination or not: "
            f"{fmt_ci(f, 'factuality_bacc')}. fincheck figures, not in the paper: the first is "
            "the binary question a faithfulness metric such as FIZZ answers.",
            "",
        ]
        if n := f.get("n_chain_of_thought"):
            out += [
                f"Chain of thought ({n} answers): the judgement read is the answer's last JSON "
                "object, the reasoning before it left out. The paper's CoT runs scored a judgement "
                "stored apart from the reasoning; its released code does not say how the two were "
                "split, so CoT figures follow that protocol, not its exact code.",
                "",
            ]
        return out

    def plots(self, score: TaskScore, plot_dir: Path, model: str | None) -> list[Path]:
        from fincheck.metrics import plots

        confusion = score.figures["confusion"]
        return [
            plots.plot_confusion_figure(
                confusion,
                f"FHSumBench: {model}" if model else "FHSumBench",
                plot_dir / "fhsumbench_confusion.png",
                gold_labels=[label for label in confusion["labels"] if label != INVALID],
            )
        ]

    def gold_consistent(self, pair: Pair) -> bool:
        return pair.meta_value("label", str) == "no_hallu"

    def verdict_answer(self, consistent: bool, reason: str) -> str:
        """Faithfulness only: a binary verdict says nothing of factuality, so an unfaithful
        summary is written as factual (only the faithfulness figure is then meaningful)."""
        return json.dumps({"Faithfulness": consistent, "Factuality": True})

    # --- serve -----------------------------------------------------------------------------

    def detect_output(
        self, text: str, p_yes: float | None, threshold: float | None = None
    ) -> dict[str, Any]:
        return {"label": judgement_to_label(reference_judgement(text)[0])}


TASK = FhsumbenchTask()
