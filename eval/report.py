"""report.md: what was run, our figures with 95% CIs beside the papers', plots, failure counts,
and a few example outputs per task. Readable on its own."""

from __future__ import annotations

import math
from pathlib import Path

from fincheck.eval import paper_numbers


def fmt(value, scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, str):
        return value
    return f"{value * scale:.{digits}f}"


def fmt_ci(entry: dict, metric: str, scale: float = 1.0, digits: int = 3) -> str:
    ci = (entry.get("ci95") or {}).get(metric)
    value = fmt(entry.get(metric), scale, digits)
    if not ci:
        return value
    return f"{value} [{fmt(ci[0], scale, digits)}, {fmt(ci[1], scale, digits)}]"


def render_report(
    results: dict, plots: dict[str, list[str]], examples: dict[str, list[dict]]
) -> str:
    run = results["run"]
    lines = ["# fincheck evaluation report", ""]
    lines += ["## What was run", ""]
    for key in (
        "model",
        "adapter",
        "split",
        "data_dir",
        "data_fingerprint",
        "predictions_dir",
        "created",
    ):
        if run.get(key) is not None:
            lines.append(f"- **{key}**: `{run[key]}`")
    if run.get("prompts_trimmed"):
        trimmed = ", ".join(f"{t} {n}" for t, n in run["prompts_trimmed"].items())
        lines.append(
            f"- **prompts with a trimmed grounding text** (too long for the model): {trimmed}"
        )
    if run.get("prompt_hashes"):
        hashes = ", ".join(f"{t} `{h}`" for t, h in run["prompt_hashes"].items())
        lines.append(f"- **prompt hashes**: {hashes}")
    lines.append(
        f"- **confidence intervals**: 95% percentile bootstrap over examples, "
        f"{run.get('bootstrap_resamples')} resamples"
    )
    lines.append("")
    for task in ("final", "qasem", "fhsumbench"):
        if task not in results["tasks"]:
            continue
        figures = results["tasks"][task]
        counts = results["counts"][task]
        lines += [f"## {task}", ""]
        lines.append(
            f"{counts['n_scored']} examples scored of {counts['n_gold']} in the gold split"
            + (f" ({counts['n_missing']} without a prediction)" if counts["n_missing"] else "")
            + "."
        )
        lines.append("")
        lines += globals()[f"_section_{task}"](figures)
        for plot in plots.get(task, []):
            lines += [f"![{Path(plot).stem}]({plot})", ""]
        lines += _examples(examples.get(task, []))
    lines += ["## Comparability", "", paper_numbers.__doc__.split("\n\n", 1)[1].strip(), ""]
    return "\n".join(lines)


def _section_final(f: dict) -> list[str]:
    out = [
        "| system | precision | recall | F1 | binarized BAcc |",
        "| --- | --- | --- | --- | --- |",
        f"| **this run** | {fmt_ci(f, 'precision')} | {fmt_ci(f, 'recall')} | {fmt_ci(f, 'f1')} | "
        f"{fmt_ci(f, 'binary_bacc')} |",
    ]
    for name, f1 in paper_numbers.FINAL_F1.items():
        out.append(f"| {name} (paper) | – | – | {fmt(f1)} | – |")
    judge = f.get("judged_with")
    out += [
        "",
        f"TP (distinct gold items matched) {f['true_positives']}, predicted {f['n_predicted']}, "
        f"gold {f['n_gold']}; {f['n_needing_judge']} examples needed the judge "
        f"(the rest had an empty list).",
        f"Judge: {_judge_line(judge)}; errors {f['judge_errors']}, parse failures "
        f"{f['judge_parse_failed']} ({fmt(f['judge_parse_failure_rate'], 100, 1)}%), "
        f"unjudged examples left out of P/R: {f['n_unjudged']}.",
        "",
    ]
    if f.get("gold_origin"):
        origins = ", ".join(f"{name} {count}" for name, count in sorted(f["gold_origin"].items()))
        out += [
            f"Gold descriptions by origin: {origins} (the paper's figures are on the FINAL release).",
            "",
        ]
    if judge is None and f["n_needing_judge"]:
        out += [
            "No judge was configured: precision/recall/F1 need one (`--judge openai|local`).",
            "",
        ]
    return out


def _judge_line(judge: dict | None) -> str:
    if not judge:
        return "none"
    return ", ".join(f"{k} `{v}`" for k, v in judge.items())


def _section_qasem(f: dict) -> list[str]:
    subsets = [s for s in ("cliff", "factscore", "verifiability") if s in f]
    header = (
        "| system | "
        + " | ".join(f"{s} BAcc | {s} AUC" for s in subsets)
        + " | overall BAcc | overall AUC |"
    )
    out = [header, "| --- " * (2 * len(subsets) + 3) + "|"]
    row = "| **this run** | " + " | ".join(
        f"{fmt_ci(f[s], 'bacc', 100, 1)} | {fmt_ci(f[s], 'auc', 100, 1)}" for s in subsets
    )
    out.append(
        row + f" | {fmt_ci(f['overall'], 'bacc', 100, 1)} | {fmt_ci(f['overall'], 'auc', 100, 1)} |"
    )
    for name, table in paper_numbers.QASEM.items():
        cells = " | ".join(f"{fmt(table[s][0], 1, 1)} | {fmt(table[s][1], 1, 1)}" for s in subsets)
        out.append(f"| {name} (paper) | {cells} | – | – |")
    overall = f["overall"]
    out += [
        "",
        "Figures in percent; verifiability is the paper's Generative Search column. "
        "Supported iff P(Yes)/(P(Yes)+P(No)) ≥ 0.5. "
        f"{overall['n_scored_from_text']} predictions had no p_yes and were scored from their text; "
        f"{overall['n_parse_failed']} were neither Yes nor No (counted wrong).",
        "",
    ]
    if overall["n_scored_from_text"] == overall["n"]:
        out += [
            "No prediction carried p_yes: the AUC is that of hard 0/1 scores (it equals the BAcc) "
            "and is not comparable with the paper's AUC column.",
            "",
        ]
    return out


def _section_fhsumbench(f: dict) -> list[str]:
    out = [
        "| system | macro P | macro R | F | FH-Acc | NFH-Acc | NoH-Acc |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| **this run** | {fmt_ci(f, 'precision')} | {fmt_ci(f, 'recall')} | {fmt_ci(f, 'f')} | "
        f"{fmt(f['fh_acc'])} | {fmt(f['nfh_acc'])} | {fmt(f['noh_acc'])} |",
    ]
    for name, (p, r, fscore) in paper_numbers.FHSUMBENCH.items():
        out.append(f"| {name} (paper) | {fmt(p)} | {fmt(r)} | {fmt(fscore)} | – | – | – |")
    out += [
        "",
        f"F is the harmonic mean of macro-P and macro-R over gold ∪ predicted labels; "
        f"{f['n_invalid']} invalid predictions (faithful+non-factual or unparseable) form their own "
        f"class; parse failures {f['n_parse_failed']} ({fmt(f['parse_failure_rate'], 100, 1)}%).",
        "",
    ]
    return out


def _examples(examples: list[dict], n: int = 3) -> list[str]:
    """A few outputs, errors first (what a reader wants to look at)."""
    if not examples:
        return []
    wrong = [ex for ex in examples if not _is_right(ex)]
    right = [ex for ex in examples if _is_right(ex)]
    chosen = wrong[: n - 1] + right[:1]
    chosen += [ex for ex in examples if ex not in chosen][: n - len(chosen)]
    out = ["<details><summary>Example outputs</summary>", ""]
    for ex in chosen:
        verdict = "right" if _is_right(ex) else "wrong"
        out.append(
            f"- `{ex['id']}` ({verdict}) gold: `{_clip(str(ex.get('gold')))}` → output: `{_clip(ex['output'])}`"
        )
    out += ["", "</details>", ""]
    return out


def _is_right(ex: dict) -> bool:
    if "true_positives" in ex:  # FINAL: every gold item found, nothing extra
        tp = ex["true_positives"]
        return tp is not None and tp == len(ex["gold"]) == len(ex["predicted"])
    return ex.get("predicted") == ex.get("gold")


def _clip(text: str, limit: int = 200) -> str:
    text = text.replace("\n", " ⏎ ").replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
