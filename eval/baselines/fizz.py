"""FIZZ (FIZZ paper §3, algorithms 1-2; its reference code `plm3332/FIZZ` read for the details).

    facts    atomic facts of each summary sentence (sentences of more than 10 characters), one
             LLM call per sentence (`atomic_facts.txt`); the answers joined and split into
             sentences as the reference code does (`reference_fact_units`: a bullet without a
             final period runs into the next one), facts of 10 characters or fewer dropped.
             Sentences split as NLTK's punkt would in the common cases (`fincheck.data.sentences`:
             no break after "Mr.", "U.S.", initials or before a lowercase word)
    filter   keep a fact when, for some summary sentence as premise, entailment is the argmax of
             the NLI labels; none kept -> the summary sentences themselves are the facts
    score    per fact, the entailment probability against every document sentence; t = the
             best, at sentence i*; if entailment is not the argmax there, every contiguous
             window of 2-3 document sentences containing i* is scored too and t = the best of all
    summary  score = min over facts of t (a summary is as faithful as its least supported fact)
    decide   consistent iff score > threshold; the threshold is the percentile (0, 0.2, ...,
             99.8) of the dev scores that maximises balanced accuracy on dev (ties: the later)

The NLI model is any Hugging Face sequence-classification NLI model (`--nli-model`; the paper's
is tals/albert-xlarge-vitaminc-mnli). Its entailment, contradiction and neutral outputs are found
by their names in its config (also VitaminC's SUPPORTS / REFUTES / NOT ENOUGH INFO); a model
saved without names (LABEL_0..2) needs `--nli-labels`, its three labels in index order, except
the paper's model, which FIZZ's and SummaC's code read as 0 = entailment, 1 = contradiction,
2 = neutral (said in one line when used). Coreference resolution (the paper's mT5 model + name substitution) is not used:
the decomposition prompt asks for names instead of pronouns, and the report says so.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fincheck.data.sentences import split_sentences
from fincheck.errors import FincheckError
from fincheck.eval.baselines.methods import Example, Method, MethodOutput, ask, run_examples
from fincheck.inference.generation import computed_scores, default_device
from fincheck.inference.llm import CachedLLM
from fincheck.io.messages import library_errors_as_one_line
from fincheck.metrics.classification import balanced_accuracy
from fincheck.models.loading import base_config
from fincheck.tasks import all_tasks, get_task
from fincheck.tasks.base import Task

MIN_SENTENCE_CHARS = 10
MAX_WINDOW = 3
NLI_LABELS = ("entailment", "contradiction", "neutral")
# The FIZZ paper's NLI model has no label names in its config; FIZZ's and SummaC's code index
# its outputs in NLI_LABELS' order.
PAPER_NLI_MODEL = "tals/albert-xlarge-vitaminc-mnli"
# Names of the three labels as NLI and fact-verification models spell them (lower case, the
# start of the name is enough: "ENTAILMENT", "entails", "CONTRADICTION", "REFUTES", ...).
LABEL_NAMES = {
    "entailment": ("entai", "supports"),
    "contradiction": ("contr", "refutes"),
    "neutral": ("neutr", "not enough info", "not_enough_info"),
}


@dataclass(frozen=True)
class Entailment:
    entailment: float
    contradiction: float
    neutral: float

    @property
    def entailed(self) -> bool:
        """Entailment is the argmax (strictly), FIZZ's filtering and expansion test."""
        return self.entailment > self.contradiction and self.entailment > self.neutral


class NLIScorer:
    """Softmax probabilities of an NLI sequence classifier for (premise, hypothesis) pairs."""

    def __init__(
        self,
        model_name: str,
        device: str | None = None,
        batch_size: int = 16,
        labels: Sequence[str] | None = None,
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = device or default_device()
        base_config(model_name, model_name, what="the NLI model")  # before its tokenizer
        try:
            with library_errors_as_one_line(
                f"the NLI model {model_name}", "give a model that loads"
            ):
                self.tokenizer = AutoTokenizer.from_pretrained(model_name)
                self.model = AutoModelForSequenceClassification.from_pretrained(model_name)
        except OSError as e:
            raise FincheckError(f"cannot load the NLI model {model_name!r}: {e}") from None
        self.model.to(self.device).eval()
        self.index = label_indices(self.model.config.id2label, labels, model_name)
        self.batch_size = batch_size
        self._lock = threading.Lock()

    def __call__(self, pairs: Sequence[tuple[str, str]]) -> list[Entailment]:
        import torch

        out: list[Entailment] = []
        with self._lock, torch.no_grad():
            for start in range(0, len(pairs), self.batch_size):
                chunk = pairs[start : start + self.batch_size]
                enc = self.tokenizer(
                    [p for p, _ in chunk],
                    [h for _, h in chunk],
                    truncation=True,
                    padding=True,
                    return_tensors="pt",
                ).to(self.device)
                logits = computed_scores(self.model(**enc).logits.float(), "NLI score")
                probs = torch.softmax(logits, dim=-1).tolist()
                out += [Entailment(*(row[self.index[k]] for k in NLI_LABELS)) for row in probs]
        return out


def label_indices(
    id2label: dict,
    order: Sequence[str] | None = None,
    model_name: str = "",
    notice: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> dict[str, int]:
    """Which output index is entailment, contradiction, neutral: `order` (the labels in index
    order, `--nli-labels`) when given, else the names in the model's config, else, for the
    paper's own unnamed model, the order FIZZ's code uses."""
    n = len(id2label)
    if order:
        names = [name.strip().lower() for name in order]
        if sorted(names) != sorted(NLI_LABELS) or n != 3:
            raise FincheckError(
                f"--nli-labels {','.join(order)}: name entailment, contradiction and neutral once "
                f"each, in the model's index order (the model has {n} labels: {dict(id2label)})"
            )
        return {name: i for i, name in enumerate(names)}
    found: dict[str, int] = {}
    for index, label in id2label.items():
        name = str(label).strip().lower()
        found |= {key: int(index) for key, starts in LABEL_NAMES.items() if name.startswith(starts)}
    if set(found) == set(NLI_LABELS) and len(set(found.values())) == 3:
        return found
    if model_name.rstrip("/").endswith(PAPER_NLI_MODEL) and n == 3:
        notice(
            f"{PAPER_NLI_MODEL} names no labels ({', '.join(map(str, id2label.values()))}): "
            f"reading them as {', '.join(NLI_LABELS)}, the order of FIZZ's code"
        )
        return {name: i for i, name in enumerate(NLI_LABELS)}
    raise FincheckError(
        f"the NLI model's labels {dict(id2label)} do not name entailment, contradiction and "
        "neutral: pass their index order (--nli-labels entailment,contradiction,neutral) or an "
        "NLI model whose config names them (--nli-model)"
    )


def windows(n_sentences: int, center: int, max_size: int = MAX_WINDOW) -> list[tuple[int, ...]]:
    """Every contiguous run of 1..max_size sentence indices that contains `center`, clipped at
    the document's edges, shortest first (the reference code's order)."""
    found = []
    for size in range(1, max_size + 1):
        for start in range(center - size + 1, center + 1):
            if start >= 0 and start + size <= n_sentences:
                found.append(tuple(range(start, start + size)))
    return found


def fact_score(fact: str, doc_sentences: list[str], nli: NLIScorer) -> tuple[float, dict]:
    """t of one fact: the best entailment over document sentences, expanded to windows of up
    to three sentences around the best one when entailment is not its argmax there."""
    scores = nli([(sentence, fact) for sentence in doc_sentences])
    best = max(range(len(scores)), key=lambda i: scores[i].entailment)
    t = scores[best].entailment
    expanded = None
    if not scores[best].entailed:
        spans = [w for w in windows(len(doc_sentences), best) if len(w) > 1]
        window_scores = nli([(" ".join(doc_sentences[i] for i in w), fact) for w in spans])
        if window_scores:
            expanded = max(s.entailment for s in window_scores)
            t = max(t, expanded)
    return t, {"best_sentence": best, "t": t, "expanded": expanded}


def filter_facts(facts: list[str], summary_sentences: list[str], nli: NLIScorer) -> list[str]:
    """The facts some summary sentence entails (argmax); the sentences themselves if none."""
    kept = [f for f in facts if any(e.entailed for e in nli([(s, f) for s in summary_sentences]))]
    return kept or list(summary_sentences)


def reference_fact_units(answers: list[str]) -> list[str]:
    """The facts of the decomposition answers as FIZZ's reference code makes them
    (`atomic_fact_decomposition.py`, `preprocess_decoded_ids`, then `atomic_fact_filtering.py`):
    each answer's lines joined ("\\n-" and newlines removed), the answers concatenated as they
    are, and the whole split into sentences, those of 10 characters or fewer dropped. So a bullet
    without a final period runs into the next, a prose answer is split by sentence, and an
    answer's first bullet keeps its "- ", as in the paper's runs."""
    joined = "".join("".join(answer.split("\n-")).replace("\n", "") for answer in answers)
    return split_sentences(joined, MIN_SENTENCE_CHARS)


def fizz_score(example: Example, llm: CachedLLM, nli: NLIScorer) -> tuple[float, dict]:
    document, summary = example.fields["text"], example.fields["summary"]
    summary_sentences = split_sentences(summary, MIN_SENTENCE_CHARS) or [summary]
    doc_sentences = split_sentences(document, MIN_SENTENCE_CHARS) or [document]
    answers = [ask(llm, "atomic_facts", max_tokens=256, sentence=s) for s in summary_sentences]
    facts = reference_fact_units(answers)
    kept = filter_facts(facts, summary_sentences, nli)
    per_fact = {fact: fact_score(fact, doc_sentences, nli) for fact in kept}
    weakest = min(per_fact, key=lambda f: per_fact[f][0])
    score = per_fact[weakest][0]
    trace = {
        "facts": facts,
        "kept": kept,
        "scores": {fact: detail for fact, (_, detail) in per_fact.items()},
        "weakest": weakest,
        "score": score,
    }
    return score, trace


def choose_threshold(scores: Sequence[float], consistent: Sequence[bool]) -> float:
    """The percentile of the dev scores (0, 0.2, ..., 99.8) whose rule score > threshold =
    consistent has the best balanced accuracy on dev; ties go to the later percentile."""
    import numpy as np

    if not scores:
        raise FincheckError("FIZZ needs dev-split scores to choose its threshold")
    best, best_bacc = float("nan"), -1.0
    for q in np.arange(0, 100, 0.2):
        threshold = float(np.percentile(scores, q))
        bacc = balanced_accuracy(list(consistent), [s > threshold for s in scores])
        if bacc >= best_bacc:
            best, best_bacc = threshold, bacc
    return best


def run_fizz(
    example: Example, llm: CachedLLM, nli: NLIScorer, threshold: float | None
) -> MethodOutput:
    score, trace = fizz_score(example, llm, nli)
    if threshold is None:  # the dev pass: scores only
        return MethodOutput("", None, trace)
    trace["threshold"] = threshold
    # what the task's scorer reads: its answer for FIZZ's binary verdict, an inconsistent one
    # naming the least supported fact (FHSumBench: faithfulness only, see `verdict_answer`)
    reason = f"The text does not support this: {trace.get('weakest')}"
    answer = get_task(example.pair.task).verdict_answer(score > threshold, reason)
    return MethodOutput(answer, None, trace)


def has_verdict(task: Task) -> bool:
    """A task FIZZ covers: a text and a summary to check, and an answer for a binary verdict."""
    overrides = type(task).verdict_answer is not Task.verdict_answer
    return {"text", "summary"} <= set(task.prompt().fields) and overrides


def build_fizz(opts: Any, llm: CachedLLM) -> Method:
    """FIZZ with the options' NLI model, and a threshold per task chosen on the dev split (the
    same --limit sample) before its examples run."""
    if not opts.nli_model:
        raise FincheckError(
            "--method fizz needs --nli-model (a Hugging Face NLI classifier, e.g. "
            f"{PAPER_NLI_MODEL} as in the FIZZ paper)"
        )
    nli = NLIScorer(opts.nli_model, opts.device, labels=opts.nli_labels)
    thresholds: dict[str, float] = {}
    tasks = tuple(name for name, task in all_tasks().items() if has_verdict(task))

    def run(example: Example, llm: CachedLLM) -> MethodOutput:
        return run_fizz(example, llm, nli, thresholds.get(example.pair.task))

    def prepare(task: str) -> dict[str, float]:
        """The dev pass: score the dev split's sample, pick the threshold."""
        scores: list[tuple[float, bool]] = []

        def done(pair, output: MethodOutput, calls: int) -> None:
            scores.append((output.trace["score"], get_task(task).gold_consistent(pair)))

        dev = opts.sample(task, "dev")
        failures = run_examples(
            run, llm, dev, opts.concurrency, done, opts.progress, f"fizz {task} dev"
        )
        if failures:
            raise FincheckError(f"FIZZ dev pass for {task}: {len(failures)} failed: {failures[0]}")
        thresholds[task] = choose_threshold([s for s, _ in scores], [c for _, c in scores])
        return {f"fizz_threshold_{task}": thresholds[task]}

    return Method("fizz", tasks, run, "FIZZ §3", prepare)
