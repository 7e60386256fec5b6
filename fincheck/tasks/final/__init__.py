"""FINAL: describe, one by one, what a summary says that its text does not support.

Data: the FINAL release when the user has it (`--final_file`: its items are the evaluation set),
else DeFacto, from which FINAL was built: consistent items -> `None`, inconsistent items ->
lettered descriptions derived from the annotator's explanation (silver). Train = DeFacto train,
dev = DeFacto val, test = DeFacto test or the FINAL file.
Metric (the FINAL paper, §4.2 and appendix C): a judge LLM matches predicted descriptions to
gold ones; TP = distinct gold items matched; micro P = ΣTP/Σ#predicted, R = ΣTP/Σ#gold, F1;
and the binarized form (flagged = at least one description) scored by balanced accuracy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.data.pairs import Pair
from fincheck.data.prompting import FirstWordShare
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
    UserFile,
    paper_rows,
)
from fincheck.tasks.final.defacto import convert_defacto
from fincheck.tasks.final.final_file import convert_final_item
from fincheck.tasks.final.judge import JUDGE_PROMPTS, JUDGE_VARIANTS, JudgePrompt, MatchingJudge
from fincheck.tasks.final.judge_sanity import judge_agreement
from fincheck.tasks.final.lettering import final_target
from fincheck.tasks.final.metrics import FinalItem, final_figures, score_final, true_positives
from fincheck.tasks.final.reader import NOTHING, has_final_output, read_descriptions

_ORIGIN = "https://raw.githubusercontent.com/microsoft/DeFacto/a7e70a2fab6b6953f88a2e56d5b14feb4ff5beef/data"
_LICENSE = (
    "DeFacto (Liu et al., XSum-derived); no license file in the repository at the pinned "
    "commit: research use; ask the authors before redistributing"
)
DEFACTO = {
    split: Source(f"defacto/{split}.jsonl", f"{_ORIGIN}/{split}.jsonl", sha256, _LICENSE)
    for split, sha256 in (
        ("train", "53a0e42f2d627170e00d3db32a367bfe8280f2a61c77aee6e2f8a2a354b72f78"),
        ("val", "f7f4ec9c2526d5e7bb542dcfb05d5df6444d9840cc3036ef6b90a8d5377b6466"),
        ("test", "5d3539be0cb1d71a9ec5e148a273e5744def10ece3184646bfaaeb033bc4e72c"),
    )
}
DEFACTO_SPLITS = {"train": "train", "val": "dev", "test": "test"}  # DeFacto split -> ours
FINAL_FILE = "final_file"

_TABLE = "FINAL paper, Table 4 (F1, test, 1,265)"


@dataclass
class FinalPrepareOptions(PrepareSettings):
    final_file: str | None = config_field(
        None,
        "a FINAL release file (JSONL or JSON): its items become final/test instead of DeFacto's test split",
    )


class FinalTask(Task):
    prepare_options = FinalPrepareOptions
    name = "final"
    listed = 1
    judge_prompts = tuple(JUDGE_PROMPTS)
    title = "FINAL"
    max_new_tokens = 384
    # The demo's untuned base writes until its budget ends (a trained adapter stops at its
    # end-of-turn token), each token ~20 ms a row on 2 cores: 128 tokens hold 3-4 descriptions.
    demo = DemoPlan(test_examples=32, answer_tokens=128, train_cap=32)
    # p_yes: a list opening ("A.") against "None" at the first answer position, read before the
    # list is written: the flag's score (its ROC-AUC, a threshold chosen on dev)
    first_word_share = FirstWordShare(("A", " A"), ("None", " None"))
    paper_numbers = (
        PaperNumber("Claude-3.5-Sonnet, CoT", "f1", 0.67, _TABLE),
        PaperNumber("GPT-4o, CoT", "f1", 0.59, _TABLE),
        PaperNumber("Llama-3.1-405B, CoT", "f1", 0.56, _TABLE),
        PaperNumber("FactScore-style pipeline, Claude-3.5-Sonnet", "f1", 0.62, _TABLE),
        PaperNumber("FactScore-style pipeline, Gemini-1.5-pro", "f1", 0.42, _TABLE),
    )
    comparability = (
        "FINAL's rows are prompted LLMs (no training) on the FINAL test set (1,265 items) with "
        "a GPT-4o judge; without the FINAL release fincheck evaluates on DeFacto's test articles "
        "with silver descriptions derived from DeFacto's explanations, and its judge is "
        "whatever `--judge` names: other items, another judge, and for an adapter another "
        "training regime (fine-tuned on DeFacto's train and validation items). For each model "
        "the paper used the better of two prompt variants on its dev set. The binarized figures "
        "(flagged or not) need no judge."
    )
    card = CardInfo(
        task_type="text-generation",
        task_name="Inconsistency descriptions (FINAL)",
        dataset_type="final",
        dataset_name="FINAL",
        metrics=("f1", "precision", "recall", "binary_f1", "binary_bacc", "flag_auc"),
        thresholded=("f1", "precision", "recall", "binary_f1", "binary_bacc"),
        threshold_note='a FINAL list whose flag score (P(a list opens) against P("None") at '
        "the first answer position) is below T is held back and the summary called consistent; "
        "`flag_auc` is that score's ROC-AUC, which no threshold changes",
        data_origin="DeFacto (github.com/microsoft/DeFacto) for training; FINAL's release for evaluation",
    )

    # --- prepare ---------------------------------------------------------------------------

    def build_judge(self, client: Any, cache: Any, prompt: str, sampling: dict) -> Any:
        return MatchingJudge(client, cache, prompt=JudgePrompt.named(prompt), sampling=sampling)

    def sources(self, config) -> list:
        if not config.final_file:
            return list(DEFACTO.values())
        # The FINAL file is the evaluation set: DeFacto's test split is not read.
        return [
            DEFACTO["train"],
            DEFACTO["val"],
            UserFile(FINAL_FILE, Path(config.final_file), "FINAL file", "--final_file"),
        ]

    def collect(self, config, files: dict[str, Path], stream) -> Collected:
        prompt = self.prompt()
        pairs = []
        explanation_stats: dict[str, dict[str, int]] = {}
        for source_split, split in DEFACTO_SPLITS.items():
            name = DEFACTO[source_split].name
            if name not in files:
                continue
            converted = stream.convert_file(
                name,
                files[name],
                lambda r: r["doc_id"],
                lambda raw, s=source_split, t=split: convert_defacto(raw, s, t, prompt),
            )
            inconsistent = [p for p in converted if p.meta["label"] == "inconsistent"]
            explanation_stats[source_split] = {
                "inconsistent": len(inconsistent),
                "split_into_several": sum(p.meta["explanation_split"] for p in inconsistent),
                "descriptions": sum(len(p.meta["descriptions"]) for p in inconsistent),
            }
            pairs += converted
        if FINAL_FILE in files:
            pairs += stream.convert_file(
                FINAL_FILE,
                files[FINAL_FILE],
                None,  # named by its pairs' ids: an item without an id is named by its line
                lambda raw: convert_final_item(raw, prompt),
            )
        return Collected(pairs, {"defacto_explanations": explanation_stats})

    # --- score -----------------------------------------------------------------------------

    def score(self, joined: Joined, settings: ScoreSettings) -> TaskScore:
        """With the judge; without one, only examples with an empty list get P/R counts (they
        need no judge) and the rest are left unjudged: the binarized BAcc is still exact."""
        judge = settings.judge
        # With a flag threshold chosen on dev (`--threshold final=T`), a list whose p_yes (P(a
        # list opens) against P("None"), read before it was written) is below T is held back:
        # the summary is called consistent. A prediction without p_yes keeps its text's verdict.
        threshold = settings.thresholds.get(self.name)
        held_back = [held_back_by(pred.p_yes, threshold) for _, pred in joined]
        # A reasoning answer cut at its token budget before "Final Output:", or ending without
        # it, has no list: its numbered steps are not descriptions (read as nothing flagged, and
        # counted apart).
        read = [
            NOTHING
            if pred.cut == "reasoning" or held
            else read_descriptions(pred.output, pred.reasoning)
            for (_, pred), held in zip(joined, held_back, strict=True)
        ]
        parsed = [
            (pair, pred, r.items, pair.meta_value("descriptions", list))
            for (pair, pred), r in zip(joined, read, strict=True)
        ]
        needs_judge = [i for i, (_, _, p, g) in enumerate(parsed) if p and g]
        results: dict[int, Any] = {}
        if judge is not None and needs_judge:
            requests = [
                (parsed[i][0].meta_value("summary", str), parsed[i][2], parsed[i][3])
                for i in needs_judge
            ]
            answers = judge.match_many(requests, settings.judge_concurrency, settings.progress)
            results = dict(zip(needs_judge, answers, strict=True))
        items, examples = [], []
        errors = parse_failed = 0
        first_error: str | None = None
        for i, (pair, pred, predicted, gold) in enumerate(parsed):
            record: dict[str, Any] = {
                "id": pair.id,
                "gold": gold,
                "predicted": predicted,
                "output": pred.output,
                "structured": read[i].structured,
            }
            if pred.cut:
                record["cut"] = pred.cut
            if pred.p_yes is not None:
                record["p_yes"] = pred.p_yes
            if held_back[i]:
                record["held_back"] = True
            tp: int | None = None
            failed = False
            if not (predicted and gold):
                tp, record["judge"] = 0, "skipped"
            elif (result := results.get(i)) is None:
                record["judge"] = "no_judge"
            else:
                record.update(judge=result.status, matching=result.matching)
                if result.status == "ok":
                    tp = true_positives(result.matching)
                else:
                    failed = True
                    record.update(judge_raw=result.raw, judge_error=result.error)
                    errors += result.status == "error"
                    parse_failed += result.status == "parse_failed"
                    first_error = first_error or result.error
            record["true_positives"] = tp
            items.append(FinalItem(len(predicted), len(gold), tp, failed, pred.p_yes))
            examples.append(record)
        figures = score_final(
            items, settings.bootstrap_resamples, settings.seed, settings.unit_keys
        )
        if judge is None and needs_judge:
            # P/R over only the examples that need no judge would be 0 by construction
            for metric in ("precision", "recall", "f1"):
                figures[metric] = math.nan
                figures["ci95"][metric] = None
                figures["excluding_judge_failures"][metric] = math.nan
        without_final = [
            pred.reasoning and pred.cut != "reasoning" and not has_final_output(pred.output)
            for _, pred in joined
        ]
        figures["n_without_final_output"] = sum(without_final)
        # where to look: the first few, each with `structured: false` in scored/final.jsonl
        figures["unstructured_ids"] = [
            pair.id for (pair, _), r in zip(joined, read, strict=True) if not r.structured
        ][:5]
        figures["n_unstructured"] = sum(
            not r.structured and not missing for r, missing in zip(read, without_final, strict=True)
        )
        if threshold is not None:
            figures["threshold"] = threshold
            figures["n_held_back"] = sum(held_back)
            figures["n_without_p_yes"] = sum(pred.p_yes is None for _, pred in joined)
        figures["n_cut"] = sum(pred.cut is not None for _, pred in joined)
        figures["n_cut_in_reasoning"] = sum(pred.cut == "reasoning" for _, pred in joined)
        figures["judge_errors"] = errors
        figures["judge_parse_failed"] = parse_failed
        figures["judge_parse_failure_rate"] = (
            parse_failed / len(needs_judge) if needs_judge else 0.0
        )
        figures["n_needing_judge"] = len(needs_judge)
        # FINAL release items vs DeFacto-derived silver descriptions: the paper's are the former
        figures["gold_origin"] = dict(
            Counter(str(pair.meta.get("origin", "unknown")) for pair, *_ in parsed)
        )
        figures["judged_with"] = judge.identity if judge else None
        # how far to trust it: its verdicts on description pairs of known answer
        figures["judge_sanity"] = (
            judge_agreement(judge, settings.judge_concurrency, settings.judge_check)
            if judge and settings.judge_sanity
            else None
        )
        asked = len(needs_judge) if judge is not None else 0
        return TaskScore(figures, examples, errors, parse_failed, asked, first_error)

    def headline(self, figures: dict) -> list[tuple[str, float | None]]:
        return [
            ("P", figures["precision"]),
            ("R", figures["recall"]),
            ("F1", figures["f1"]),
            ("binarized F1", figures.get("binary_f1")),
            ("binarized BAcc", figures["binary_bacc"]),
            *(
                [("judge sanity agreement", figures["judge_sanity"]["agreement"])]
                if figures.get("judge_sanity")
                else []
            ),
        ]

    def report_section(self, figures: dict) -> list[str]:
        f = figures
        out = [
            "| system | n | precision | recall | F1 | binarized P | binarized R | binarized F1 "
            "| binarized BAcc |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            f"| **this run** | {f['n']} | {fmt_ci(f, 'precision')} | {fmt_ci(f, 'recall')} | "
            f"{fmt_ci(f, 'f1')} | {fmt_ci(f, 'binary_precision')} | "
            f"{fmt_ci(f, 'binary_recall')} | {fmt_ci(f, 'binary_f1')} | "
            f"{fmt_ci(f, 'binary_bacc')} |",
        ]
        excluded = f.get("excluding_judge_failures") or {}
        if f.get("n_judge_failed"):
            out.append(
                f"| this run, judge failures left out | {f['n'] - f['n_judge_failed']} | "
                f"{fmt(excluded.get('precision'))} | "
                f"{fmt(excluded.get('recall'))} | {fmt(excluded.get('f1'))} | – | – | – | – |"
            )
        for system, numbers in paper_rows(self.paper_numbers).items():
            out.append(
                f"| {system} | – | – | – | {fmt(numbers.get(('f1', None)))} | – | – | – | – |"
            )
        judge = f.get("judged_with")
        judge_line = ", ".join(f"{k} `{v}`" for k, v in judge.items()) if judge else "none"
        sanity = f.get("judge_sanity")
        if sanity:
            judge_line += (
                f". **Judge checked on {sanity.get('set', 'the built-in sanity set')}** "
                f"({sanity.get('items', '?')} items): the expected verdict on "
                f"{sanity['agreed']} of {sanity['n']} predicted descriptions "
                f"({fmt(sanity['agreement'], 100, 0)}%; {sanity['matches_found']} matches found "
                f"where {sanity['matches_expected']} are right; match precision "
                f"{fmt(sanity.get('match_precision'))}, recall {fmt(sanity.get('match_recall'))};"
                f" {sanity['failed']} unanswered): weigh P/R/F1 by it"
            )
        out += [
            "",
            f"Paper rows: {_TABLE}. TP (distinct gold items matched) {f['true_positives']}; "
            f"predicted descriptions {f['predicted_descriptions']} (precision's divisor), gold "
            f"descriptions {f['gold_descriptions']} (recall's divisor); {f['n_needing_judge']} "
            "examples needed the judge (the rest had an empty list).",
            f"Judge: {judge_line}; errors {f['judge_errors']}, parse failures "
            f"{f['judge_parse_failed']} ({fmt(f['judge_parse_failure_rate'], 100, 1)}%): "
            f"{f['n_judge_failed']} examples counted as misses in the headline (as the paper, "
            "which excludes nothing), left out in the row marked so.",
            "Binarized: a summary is flagged when the answer lists at least one description; "
            "precision, recall and F1 of flagging an inconsistent summary are the paper's Fig. 4 "
            "figures, the balanced accuracy is fincheck's (flagging everything scores 0.5).",
            "Outputs not read with confidence as a list of descriptions or as nothing to "
            "report (prose, an empty or content-free answer, restated facts, another script: no "
            "prediction, as the paper's judge protocol has it): "
            f"{f.get('n_unstructured', 0)} of {f['n']}. Reasoning answers that ended without "
            f'their "Final Output:" (read as no description): {f.get("n_without_final_output", 0)}.'
            + (
                f" First ones: {', '.join(f['unstructured_ids'])} (`structured: false` in "
                "scored/final.jsonl)."
                if f.get("unstructured_ids")
                else ""
            ),
            *_flag_lines(f),
            f"Answers cut at their token budget: {f.get('n_cut', 0)} of {f['n']}, of which "
            f'{f.get("n_cut_in_reasoning", 0)} in their reasoning, before "Final Output:" '
            "(read as no description: raise the answer budget, `--llm-max-tokens` or "
            "`--max-new-tokens`).",
            "",
        ]
        if judge and judge.get("prompt") in JUDGE_VARIANTS:
            out += [
                f"Judged with {JUDGE_VARIANTS[judge['prompt']]}, so not comparable with its rows.",
                "",
            ]
        if f.get("gold_origin"):
            origins = ", ".join(f"{name} {n}" for name, n in sorted(f["gold_origin"].items()))
            out += [
                f"Gold descriptions by origin: {origins} (the paper's figures are on the FINAL "
                "release).",
                "",
            ]
        if judge is None and f["n_needing_judge"]:
            out += [
                "No judge was configured: precision/recall/F1 need one (`--judge openai|local`).",
                "",
            ]
        return out

    def plots(self, score: TaskScore, plot_dir: Path, model: str | None) -> list[Path]:
        from fincheck.metrics import plots

        return [
            plots.plot_confusion_figure(
                score.figures["binary_confusion"],
                f"FINAL (binarized): {model}" if model else "FINAL (binarized)",
                plot_dir / "final_binary_confusion.png",
            )
        ]

    needs_more_than_dev = ("f1",)  # the matching judge
    # the flag score's ranking, judge-free and threshold-free like QASem's AUC: greedy lists'
    # binarized BAcc stayed at 0.5 for a detector that flags everything (both epochs of the
    # first three-task run), so it chose nothing; binarized F1 rewards flagging everything
    choose_by = "flag_auc"
    compare_metrics = (
        ("f1", "F1"),
        ("binary_f1", "binarized F1"),
        ("binary_bacc", "binarized BAcc"),
        ("flag_auc", "flag ROC-AUC"),
    )

    def example_figures(self, examples: Sequence[dict]) -> dict[str, float]:
        items = [
            FinalItem(
                len(ex["predicted"]),
                len(ex["gold"]),
                ex["true_positives"],
                ex.get("judge") in ("error", "parse_failed"),
                ex.get("p_yes"),
            )
            for ex in examples
        ]
        figures = final_figures(items)
        if any(not it.tp_known and not it.judge_failed for it in items):
            for metric in ("precision", "recall", "f1"):
                figures[metric] = math.nan  # no judge: P/R/F1 unknown, not 0
        return figures

    def unreadable_outputs(self, figures: dict) -> tuple[int, int, str]:
        n_bad = figures.get("n_unstructured", 0) + figures.get("n_without_final_output", 0)
        return n_bad, figures["n"], "outputs in no asked-for format"

    def is_right(self, example: dict) -> bool:
        """Every gold item found, nothing extra."""
        tp = example["true_positives"]
        return tp is not None and tp == len(example["gold"]) == len(example["predicted"])

    def gold_consistent(self, pair: Pair) -> bool:
        return not pair.meta_value("descriptions", list)

    def verdict_answer(self, consistent: bool, reason: str) -> str:
        return final_target([] if consistent else [reason])

    def cut_in_reasoning(self, text: str) -> bool:
        return not has_final_output(text)

    # --- serve -----------------------------------------------------------------------------

    def detect_output(
        self, text: str, p_yes: float | None, threshold: float | None = None
    ) -> dict[str, Any]:
        """The descriptions, the verdict and (a local model) `flag_score`, the p_yes the list
        opened with: a ranking score, not a calibrated probability. With a `threshold` chosen
        on dev, a list whose flag score is below it is held back (`held_back`) and the summary
        called consistent, as `fincheck score --threshold final=T` scores it."""
        out = self._verdict(text)
        if held_back_by(p_yes, threshold):
            out = {"descriptions": [], "consistent": True, "held_back": out["descriptions"]}
        return out if p_yes is None else {**out, "flag_score": p_yes}

    def _verdict(self, text: str) -> dict[str, Any]:
        """An answer not read with confidence (empty, prose, content-free) says nothing, so its
        verdict is unknown (None, with a warning), never "consistent"."""
        if not (text or "").strip():
            return {
                "descriptions": [],
                "consistent": None,
                "warning": "the model's answer was empty: no verdict",
            }
        read = read_descriptions(text)
        if not read.structured:
            return {
                "descriptions": [],
                "consistent": None,
                "warning": "the model's answer is no list of descriptions nor a clear 'none': "
                "no verdict (its text is in `output`)",
            }
        return {"descriptions": read.items, "consistent": not read.items}


TASK = FinalTask()


def held_back_by(p_yes: float | None, threshold: float | None) -> bool:
    """Whether a list is held back by a flag threshold chosen on dev (score and detect alike):
    its flag score is below it; without a score or a threshold the text's verdict stands."""
    return threshold is not None and p_yes is not None and p_yes < threshold


def _flag_lines(f: dict) -> list[str]:
    """What the report says about the flag score (p_yes) and a threshold on it."""
    out = []
    if not math.isnan(f.get("flag_auc", math.nan)):
        out.append(
            'Flag score (p_yes: P(a list opens) against P("None"), at the first answer '
            f"position): ROC-AUC {fmt_ci(f, 'flag_auc')} for telling inconsistent summaries "
            "from consistent ones."
        )
    best = f.get("best_threshold")
    if best:
        out.append(
            f"On these summaries the binarized BAcc would peak at {fmt(best['bacc'], 100, 1)} "
            f"with the flag threshold {best['threshold']} (in-sample: read it off a dev run and "
            "pass it to the test run's `fincheck score --threshold final=...`)."
        )
    if "threshold" in f:
        out.append(
            f"Flagged by the threshold {f['threshold']} on p_yes (`--threshold`, chosen on dev; "
            f"a fincheck variant, not the paper's protocol): {f['n_held_back']} lists held back "
            f"(called consistent); {f['n_without_p_yes']} predictions had no p_yes and keep "
            "their text's verdict."
        )
    return out
