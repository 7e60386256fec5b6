"""FHSumBench: is a summary faithful to its document, and is it factual in the world?

Data: the benchmark's one file, 1,336 (source, summary, label) samples over 466 documents.
Target: `{"Faithfulness": bool, "Factuality": bool}` (no_hallu = faithful + factual,
factual_hallu = unfaithful + factual, non_factual_hallu = unfaithful + non-factual). Split by
document (40/10/50 by default; `fhsumbench_eval_all` puts all 1,336 in test, as the paper).
Metric: the reference scorer's (the benchmark repository's method/score.py): macro P and R over
gold ∪ predicted labels, "invalid" a class of its own, F their harmonic mean; per-class accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fincheck.data_prep.fhsumbench import convert_fhsumbench
from fincheck.data_prep.raw_records import iter_records
from fincheck.data_prep.sources import Source
from fincheck.data_prep.splits import split_by_group
from fincheck.eval.fhsumbench_metrics import (
    judgement_to_label,
    parse_judgement,
    score_fhsumbench,
)
from fincheck.tasks.base import (
    CardInfo,
    Collected,
    Joined,
    PaperNumber,
    ScoreSettings,
    Task,
    TaskScore,
)

DATA = Source(
    "fhsumbench/FHSumBench_data.json",
    "https://raw.githubusercontent.com/cece00/FHSumBench/4cffcdffac22e6174bbece5d5525548321cd4bd6"
    "/FHSumBench_data.json",
    "657caa975b34c261573faae06a5b76a239039e724e7db0d286f5ac22cd6b6031",
    "FHSumBench (XSum-derived); no license file in the repository at the pinned commit: "
    "research use; ask the authors before redistributing",
)


class FhsumbenchTask(Task):
    name = "fhsumbench"
    title = "FHSumBench"
    max_new_tokens = 96
    paper_numbers = (
        PaperNumber("GPT-4o vanilla", "precision", 0.458, "FHSumBench paper"),
        PaperNumber("GPT-4o vanilla", "recall", 0.465, "FHSumBench paper"),
        PaperNumber("GPT-4o vanilla", "f", 0.461, "FHSumBench paper"),
        PaperNumber("Qwen2.5-7B vanilla", "f", 0.465, "FHSumBench paper"),
        PaperNumber("GPT-4o reflection retrieval (best)", "f", 0.501, "FHSumBench paper"),
        PaperNumber("Random", "precision", 0.3185, "FHSumBench paper"),
        PaperNumber("Random", "recall", 0.3184, "FHSumBench paper"),
        PaperNumber("Random", "f", 0.3185, "FHSumBench paper"),
    )
    comparability = (
        "FHSumBench numbers are on all 1,336 samples, while a grouped train/test split evaluates "
        "on a subset (`configs/prepare/paper-eval.yaml` holds all of them out)."
    )
    card = CardInfo(
        task_type="text-classification",
        task_name="Factual vs non-factual hallucination (FHSumBench)",
        dataset_type="fhsumbench",
        dataset_name="FHSumBench",
        metrics=("f", "precision", "recall", "accuracy", "fh_acc", "nfh_acc", "noh_acc"),
    )

    # --- prepare ---------------------------------------------------------------------------

    def sources(self, config) -> list:
        return [DATA]

    def collect(self, config, files: dict[str, Path], stream) -> Collected:
        samples = list(
            stream.convert(
                DATA.name,
                iter_records(files[DATA.name]),
                lambda r: str(r["id"]),
                lambda raw: convert_fhsumbench(raw, "test"),
            )
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
        notes = {"fhsumbench_documents": len({p.meta["group"] for p in samples})}
        return Collected(samples, notes)

    # --- score -----------------------------------------------------------------------------

    def score(self, joined: Joined, settings: ScoreSettings) -> TaskScore:
        gold, pred, failed, examples = [], [], [], []
        for pair, prediction in joined:
            judgement = parse_judgement(prediction.output)
            label = judgement_to_label(judgement)
            gold.append(pair.meta_value("label", str))
            pred.append(label)
            failed.append(judgement is None)
            examples.append(
                {
                    "id": pair.id,
                    "gold": gold[-1],
                    "output": prediction.output,
                    "predicted": label,
                    "parse_failed": judgement is None,
                }
            )
        figures = score_fhsumbench(
            gold, pred, failed, n_resamples=settings.bootstrap_resamples, seed=settings.seed
        )
        return TaskScore(figures, examples)

    def headline(self, figures: dict) -> list[tuple[str, float | None]]:
        return [
            ("P", figures["precision"]),
            ("R", figures["recall"]),
            ("F", figures["f"]),
        ]

    def headline_text(self, figures: dict) -> str:
        return f"{super().headline_text(figures)} parse failures {figures['n_parse_failed']}"

    def report_section(self, figures: dict) -> list[str]:
        from fincheck.eval.report import fmt, fmt_ci, paper_rows

        f = figures
        out = [
            "| system | macro P | macro R | F | FH-Acc | NFH-Acc | NoH-Acc |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| **this run** | {fmt_ci(f, 'precision')} | {fmt_ci(f, 'recall')} | "
            f"{fmt_ci(f, 'f')} | {fmt(f['fh_acc'])} | {fmt(f['nfh_acc'])} | {fmt(f['noh_acc'])} |",
        ]
        for system, numbers in paper_rows(self.paper_numbers).items():
            cells = " | ".join(fmt(numbers.get((m, None))) for m in ("precision", "recall", "f"))
            out.append(f"| {system} (paper) | {cells} | – | – | – |")
        out += [
            "",
            f"F is the harmonic mean of macro-P and macro-R over gold ∪ predicted labels; "
            f"{f['n_invalid']} invalid predictions (faithful+non-factual or unparseable) form "
            f"their own class; parse failures {f['n_parse_failed']} "
            f"({fmt(f['parse_failure_rate'], 100, 1)}%).",
            "",
        ]
        return out

    def plots(self, score: TaskScore, plot_dir: Path, model: str | None) -> list[Path]:
        from fincheck.eval import plots

        confusion = score.figures["confusion"]
        return [
            plots.plot_confusion(
                confusion["counts"],
                confusion["labels"],
                "FHSumBench",
                plot_dir / "fhsumbench_confusion.png",
            )
        ]

    # --- serve -----------------------------------------------------------------------------

    def detect_output(self, text: str, p_yes: float | None) -> dict[str, Any]:
        return {"label": judgement_to_label(parse_judgement(text))}


TASK = FhsumbenchTask()
