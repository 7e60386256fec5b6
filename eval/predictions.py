"""The predictions file: what `fincheck eval` writes and `fincheck score` reads.

`RUN_DIR/predictions/<task>.jsonl`, one JSON object per line:
    {"id": str, "task": <a registered task>, "output": str, "p_yes": float?}
`id` is the prepared pair's id; `output` the model's raw text; `p_yes` (optional) the task's
first-word share at the first generated position (QASem: P(Yes)/(P(Yes)+P(No)); FINAL: a list
against "None"). Other keys are kept but ignored. Any tool can write this file and be scored
the same way.

`fincheck eval` also writes beside them `eval_config.json` (what produced them: model, adapter,
split, generation lengths) and `eval_summary.json` (per task, written when the task is
finished: its predictions, prompts trimmed, and the file's sha256); this module reads and
writes both, for eval (resume checks) and score (the report's "what was run", and whether each
task's eval finished and its file is still what eval wrote: `eval_state`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fincheck.data.pairs import CUT_KINDS, Pair, Prediction
from fincheck.errors import FincheckError, InvalidRecordError
from fincheck.io import jsonl
from fincheck.io.checksums import folder_sha256, sha256_file
from fincheck.io.jsonl import iter_json_objects, read_json_record, record_json
from fincheck.io.safe_files import open_own_file, open_regular_file, write_text
from fincheck.io.secrets import redacted_value
from fincheck.tasks import task_names

EVAL_CONFIG = "eval_config.json"
EVAL_SUMMARY = "eval_summary.json"


def read_predictions(path: Path, task: str | None = None) -> list[Prediction]:
    """Read and validate a predictions file; a duplicate id is an error naming both lines."""
    predictions: list[Prediction] = []
    seen: dict[str, int] = {}
    for line_no, record in iter_json_objects(path):
        prediction = _validate(record, str(path), line_no, task)
        if prediction.id in seen:
            raise InvalidRecordError(
                str(path),
                line_no,
                "id",
                f"duplicate id {prediction.id!r} (first on line {seen[prediction.id]})",
            )
        seen[prediction.id] = line_no
        predictions.append(prediction)
    return predictions


def _validate(record: Any, where: str, line: int, task: str | None) -> Prediction:
    if not isinstance(record, dict):
        raise InvalidRecordError(where, line, "<record>", "expected a JSON object")
    for key in ("id", "task", "output"):
        if not isinstance(record.get(key), str):
            raise InvalidRecordError(where, line, key, "missing or not a string")
    if record["task"] not in task_names():
        raise InvalidRecordError(where, line, "task", f"{record['task']!r} not in {task_names()}")
    if task is not None and record["task"] != task:
        raise InvalidRecordError(where, line, "task", f"{record['task']!r} in the {task} file")
    p_yes = record.get("p_yes")
    if p_yes is not None:
        if isinstance(p_yes, bool) or not isinstance(p_yes, (int, float)) or not 0 <= p_yes <= 1:
            raise InvalidRecordError(
                where, line, "p_yes", f"expected a number in [0, 1], got {p_yes!r}"
            )
        p_yes = float(p_yes)
    cut = record.get("cut")
    if cut is not None and cut not in CUT_KINDS:
        raise InvalidRecordError(where, line, "cut", f"expected one of {CUT_KINDS}, got {cut!r}")
    reasoning = record.get("reasoning", False)
    if not isinstance(reasoning, bool):
        raise InvalidRecordError(
            where, line, "reasoning", f"expected true or false, got {reasoning!r}"
        )
    return Prediction(record["id"], record["task"], record["output"], p_yes, line, cut, reasoning)


def join_with_gold(
    gold: list[Pair], predictions: list[Prediction], predictions_path: Path, gold_path: Path
) -> tuple[list[tuple[Pair, Prediction]], list[str]]:
    """Pair each prediction with its gold pair by id, in the gold split's order: the order a
    predictions file was written in (a resumed eval, a baseline's concurrent calls) must not
    move a bootstrap CI.

    An id that is not in the gold split is an error (file:line); gold ids without a prediction
    are returned as `missing` (a --limit run scores a sample; the report says how many).
    """
    gold_ids = {pair.id for pair in gold}
    for prediction in predictions:
        if prediction.id not in gold_ids:
            raise InvalidRecordError(
                str(predictions_path),
                prediction.line,
                "id",
                f"{prediction.id!r} is not in the gold split {gold_path}",
            )
    by_id = {p.id: p for p in predictions}  # unique: read_predictions refuses a repeated id
    joined = [(pair, by_id[pair.id]) for pair in gold if pair.id in by_id]
    return joined, [pair.id for pair in gold if pair.id not in by_id]


class PredictionWriter:
    """Appends predictions and flushes per batch, so a crash loses at most the batch in flight.

    On open it reads the ids already written (resume) and drops a torn last line left by a
    crash mid-write.
    """

    def __init__(self, path: Path, task: str) -> None:
        self.path = Path(path)
        self.task = task
        self.done: set[str] = set()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._recover()
        fd = open_own_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "predictions")
        self._file = os.fdopen(fd, "a", encoding="utf-8")

    def _recover(self) -> None:
        good: list[str] = []
        with open(open_regular_file(self.path), "rb") as f:  # a FIFO: one line
            for line_no, raw in enumerate(f, start=1):
                line = raw.removeprefix(b"\xef\xbb\xbf") if line_no == 1 else raw  # a BOM
                try:
                    record = jsonl.loads(line.decode("utf-8"))  # a torn line may end mid-character
                    prediction = _validate(record, str(self.path), line_no, self.task)
                except (json.JSONDecodeError, InvalidRecordError, UnicodeDecodeError):
                    if line.endswith(b"\n"):  # damage in the middle is not a crash artefact
                        raise FincheckError(
                            f"{self.path}:{line_no}: unreadable prediction; fix or delete the file"
                        ) from None
                    continue  # torn last line
                if prediction.id not in self.done:
                    good.append(prediction.to_json())
                    self.done.add(prediction.id)
        write_text(self.path, "".join(line + "\n" for line in good))

    def write_batch(self, predictions: list[Prediction]) -> None:
        for prediction in predictions:
            self._file.write(prediction.to_json() + "\n")
            self.done.add(prediction.id)
        self._file.flush()
        os.fsync(self._file.fileno())  # on disk, not just in the OS cache: a batch costs minutes

    def close(self) -> None:
        self._file.close()


def _write_json(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, record_json(record, indent=2) + "\n")  # no NaN, no held secret


def read_eval_config(predictions_dir: Path) -> dict[str, Any]:
    """What produced the predictions in this folder ({} when another tool wrote them)."""
    return read_json_record(Path(predictions_dir) / EVAL_CONFIG, EVAL_CONFIG_SHAPE) or {}


# What a resume, score and publish read of eval_config.json and eval_summary.json (`check_shape`)
EVAL_CONFIG_SHAPE = {
    "tasks": [str],
    "served_models": [str],
    "limit": (dict, int, type(None)),
    "sample_by": (dict, type(None)),
    "data_fingerprint": (str, type(None)),
    "split_sha256": {str: (str, type(None))},
}
EVAL_SUMMARY_SHAPE = {
    str: {
        "n_predictions": int,
        "trimmed": int,
        "failed": int,
        "calls_per_example": (int, float),
        "sha256": str,
    }
}


def _limit_of(config: dict[str, Any], task: str) -> Any:
    limit = config.get("limit")
    return limit.get(task) if isinstance(limit, dict) else limit


# What decides which examples are predicted and what the model sees: predictions written under
# other values would be mixed with new ones (`random.sample` of 341 and of 342 items differ).
SAME_RUN_KEYS = (
    "backend",  # the model loaded here, or an endpoint's answers
    "base_url",
    "model",
    "adapter",
    "split",
    "method",
    "sample_seed",
    "requested_window",
    "max_input_tokens",
    # ... and what changes an answer: the data, the answer budgets, the model's numerics and
    # chat template options, the decoding path, a method's own models
    "data_fingerprint",
    "requested_max_new_tokens",
    "dtype",
    "requested_template_kwargs",
    "prefix_reuse",
    "max_tokens",
    "nli_model",
    "nli_labels",
    "step1",
    "step2",
    "tokenizer",  # a served detector's prompts fitted with it (or sent whole without one)
    "overlap_weight",  # QASem's scores combined with the word overlap
)
# what a folder written before a key was recorded ran with: it is compared as that
RUN_KEY_DEFAULTS = {"overlap_weight": 0.0}


def path_identity(value: str | None) -> str | None:
    """An option that names a folder or a name (a tokenizer, two-step's step 1), as a run's
    identity records it: an existing folder by its content (the same model wherever it lies,
    and another one once changed in place), another path made absolute, a hub id by the
    snapshot the hub cache holds, a name as given."""
    if value and Path(value).is_dir():
        return f"{Path(value).name} sha256:{folder_sha256(value)}"
    if value and Path(value).exists():
        return str(Path(value).resolve())
    from fincheck.io.runs import looks_like_hub_id
    from fincheck.models.loading import model_content  # (torch's and the hub's imports: here)

    content = model_content(value) if value and looks_like_hub_id(value) else None
    return f"{value} sha256:{content}" if content else value  # a hub id by its cached snapshot


def check_eval_config(predictions_dir: Path, config: dict[str, Any]) -> None:
    """Record what produces the predictions; refuse to mix two runs' outputs in one folder."""
    previous = read_eval_config(predictions_dir)
    config = redacted_value(config)  # as it was recorded: a held value is never written
    if previous:
        previous = {**RUN_KEY_DEFAULTS, **previous}
    changed = [
        k for k in SAME_RUN_KEYS if k in previous and k in config and previous[k] != config[k]
    ]
    was = {k: previous.get(k) for k in changed}
    now = {k: config.get(k) for k in changed}
    for task in sorted(set(previous.get("tasks", [])) & set(config.get("tasks", []))):
        limits = _limit_of(previous, task), _limit_of(config, task)  # (before, now)
        if limits[0] != limits[1]:
            changed.append(f"--limit of {task}")
            was[f"limit {task}"], now[f"limit {task}"] = limits
        elif limits[1] is not None and _sample_by(previous, task) != _sample_by(config, task):
            # the same --limit drew pairs, and now whole documents (or back)
            changed.append(f"the sampling of {task}")
            was[f"sample_by {task}"] = _sample_by(previous, task)
            now[f"sample_by {task}"] = _sample_by(config, task)
    if changed:
        raise FincheckError(
            f"{predictions_dir} holds predictions of a different run ({', '.join(changed)} "
            f"differ: {was} before, {now} now); use another --out"
        )
    # what the model loaded turned out to be stays until `record_loaded` compares it, and what
    # an endpoint said served the predictions stays while they do (a rerun that asks nothing
    # adds no name: it had erased the record, and the next resume took any model)
    kept = {k: previous[k] for k in (*SAME_LOADED_KEYS, "served_models") if k in previous}
    _write_json(Path(predictions_dir) / EVAL_CONFIG, {**kept, **config})


def _sample_by(config: dict[str, Any], task: str) -> str:
    """How --limit drew a task's sample: "documents" or "pairs" (runs before whole-document
    sampling recorded nothing: pairs)."""
    return (config.get("sample_by") or {}).get(task, "pairs")


def read_eval_summary(predictions_dir: Path) -> dict[str, Any]:
    return read_json_record(Path(predictions_dir) / EVAL_SUMMARY, EVAL_SUMMARY_SHAPE) or {}


def record_generation(predictions_dir: Path, task: str, counts: dict[str, int]) -> None:
    """eval_summary.json: per task, how many predictions there are and how many of their prompts
    had a trimmed grounding text. The counts cover every pair of the task, not only those this
    invocation generated, so a resumed evaluation reports what an uninterrupted one does."""
    record = read_eval_summary(predictions_dir)
    failed = len(counts.get("failed") or [])
    record[task] = {"n_predictions": counts["total"] - failed, "trimmed": counts["trimmed"]}
    if "failed" in counts:  # an LLM's answers (an endpoint, a baseline): examples that failed
        record[task]["failed"] = failed
    if "calls_per_example" in counts:  # a baseline method: LLM calls per example
        record[task]["calls_per_example"] = round(counts["calls_per_example"], 3)
    path = Path(predictions_dir) / f"{task}.jsonl"
    if path.is_file():  # complete means listed: what the finished task's file holds
        record[task]["sha256"] = sha256_file(path)
    _write_json(Path(predictions_dir) / EVAL_SUMMARY, record)


def unlist_task(predictions_dir: Path, task: str) -> None:
    """A task whose file eval is about to extend (a first run, a resume) leaves the summary,
    which then exists from the start: a run stopped in its first task is told apart from a
    folder no eval wrote."""
    record = read_eval_summary(predictions_dir)
    if task in record or not (Path(predictions_dir) / EVAL_SUMMARY).is_file():
        record.pop(task, None)
        _write_json(Path(predictions_dir) / EVAL_SUMMARY, record)


def eval_state(predictions_dir: Path, task: str) -> str:
    """Whether `fincheck eval` finished a task's predictions: "finished" (eval_summary.json
    lists the file, which still holds what eval wrote), "unfinished" (the summary does not list
    the task: stopped, or still running), or "unknown" (no summary: another tool's folder, or
    a copy of the predictions alone; or one from before files were listed). A file changed
    after its eval finished stops the score: its figures would be of other predictions than
    the run's."""
    folder = Path(predictions_dir)
    if not (folder / EVAL_SUMMARY).is_file():
        return "unknown"
    listed = read_eval_summary(folder).get(task)
    if not isinstance(listed, dict):
        return "unfinished"
    if "sha256" not in listed:
        return "unknown"
    if sha256_file(folder / f"{task}.jsonl") != listed["sha256"]:
        raise FincheckError(
            f"{folder / f'{task}.jsonl'}: changed since `fincheck eval` finished it (its sha256 "
            f"is no longer the one {EVAL_SUMMARY} lists): score the eval's own file, or rerun "
            "the eval into a new folder"
        )
    return "finished"


# What the loaded model turned out to be that changes what it reads or answers: a folder whose
# predictions were made under other values takes no more (an adapter retrained into the same
# run folder keeps its path, not its weights; results would name the new weights' sha256 for
# answers the old ones gave). The template's fingerprint is not among them: a template that
# writes today's date renders differently tomorrow, and that is only a warning.
SAME_LOADED_KEYS = (
    "base",  # the adapter's recorded base when --model is not given
    "base_content",  # ... and what its folder holds (weights changed in place: another model)
    "adapter_sha256",
    "adapter_content",  # the adapter's weights and adapter_config.json (its lora_alpha)
    "window",
    "max_new_tokens",
    "chat_template_kwargs",
    "tokenizer_fingerprint",  # what fits a served detector's prompts, by content
)


def record_loaded(predictions_dir: Path, **fields: Any) -> None:
    """What the loaded model turned out to be (the chat template's fingerprint and kwargs, the
    adapter weights' sha256), beside the evaluation's config: `fincheck score` copies it into
    results.json and `fincheck publish` checks results against the adapter it uploads. A
    folder holding predictions made with another adapter, window or budget is refused."""
    record = read_eval_config(predictions_dir)
    now = {
        k: redacted_value(json.loads(json.dumps(v)))  # as it is recorded
        for k, v in fields.items()
        if k in SAME_LOADED_KEYS
    }
    changed = [k for k in now if k in record and _differs(k, record[k], now[k])]
    if changed and _holds_predictions(Path(predictions_dir)):
        raise FincheckError(
            f"{predictions_dir} holds predictions of a different run ({', '.join(changed)} "
            f"differ: { ({k: record[k] for k in changed}) } before, "
            f"{ ({k: now[k] for k in changed}) } now); use another --out"
        )
    before, after = record.get("max_new_tokens"), now.get("max_new_tokens")
    if isinstance(before, dict) and isinstance(after, dict):  # a rerun may add a task's budget
        fields = {**fields, "max_new_tokens": {**before, **after}}
    record.update(fields)
    _write_json(Path(predictions_dir) / EVAL_CONFIG, record)


def _differs(key: str, before: Any, now: Any) -> bool:
    """Per-task budgets differ only for a task evaluated both times (a rerun may add one)."""
    if key == "max_new_tokens" and isinstance(before, dict) and isinstance(now, dict):
        return any(before[t] != now[t] for t in before.keys() & now.keys())
    return before != now


def served_before(predictions_dir: Path) -> list[str]:
    """The models an endpoint said it served for the predictions already in this folder ([]
    when none are, or it said nothing): a resume must be answered by the same."""
    if not _holds_predictions(Path(predictions_dir)):
        return []
    return [str(m) for m in read_eval_config(predictions_dir).get("served_models") or []]


def _holds_predictions(predictions_dir: Path) -> bool:
    return any(p.stat().st_size > 0 for p in predictions_dir.glob("*.jsonl") if p.is_file())
