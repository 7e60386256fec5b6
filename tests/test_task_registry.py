"""The task registry: every stage loops over it, an unknown task is an error naming the known
ones, and a new benchmark is the handful of files docs/architecture.md lists -- shown by
registering a toy fourth task and running prepare -> score -> report on it."""

from __future__ import annotations

import ast
import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml

from fincheck.commands.cli import main
from fincheck.data.pairs import Pair, read_pairs
from fincheck.data.raw_records import RawRecord, iter_records, require
from fincheck.data_prep.prepare import PrepareConfig, run_prepare
from fincheck.errors import FincheckError
from fincheck.eval.score import ScoreOptions, run_score
from fincheck.io.sources import Source
from fincheck.tasks import get_task, load_prompt, task_names, temporary_tasks
from fincheck.tasks.base import CardInfo, Collected, PaperNumber, Task, TaskScore

BUILTIN = ("final", "qasem", "fhsumbench")  # the packages of fincheck/tasks/, as listed
REPO = Path(__file__).resolve().parents[1]

TOY_PROMPT = """\
# toy prompt: is the claim in the text?
[system]
Say Yes if the text states the claim, else No.
[user]
Text:
{text}

Claim: {claim}
"""


def convert_toy(raw: RawRecord) -> Pair:
    """The toy benchmark's converter: one record -> one pair (what data_prep/<name>.py holds)."""
    text = require(raw.value, "text", str, raw, non_empty=True)
    claim = require(raw.value, "claim", str, raw, non_empty=True)
    label = "Yes" if require(raw.value, "supported", bool, raw) else "No"
    messages, span = load_prompt("toy").messages(text=text, claim=claim)
    return Pair(
        id=f"toy-{raw.line}",
        task="toy",
        split=require(raw.value, "split", str, raw),
        messages=[*messages, {"role": "assistant", "content": label}],
        meta={"label": label, "group": f"toy-{raw.line}", "grounding_span": list(span)},
    )


class ToyTask(Task):
    """What fincheck/tasks/<name>.py holds for a new benchmark."""

    name, title, max_new_tokens = "toy", "Toy", 4
    paper_numbers = (PaperNumber("Some LLM", "accuracy", 0.75, "Toy paper, Table 1"),)
    comparability = "Toy numbers are on its test split."
    card = CardInfo(
        "text-classification", "Toy claims", "toy", "Toy", ("accuracy",),
        data_origin="Toy claims (example.invalid)",
    )  # fmt: skip

    def __init__(self, prompt_path: Path, source: Source) -> None:
        self._prompt_path, self.source = prompt_path, source

    @property
    def prompt_path(self) -> Path:
        return self._prompt_path

    def sources(self, config):
        return [self.source]

    def collect(self, config, files, stream) -> Collected:
        records = iter_records(files[self.source.name])
        key = lambda r: (r["text"], r["claim"])  # noqa: E731
        return Collected(list(stream.convert(self.source.name, records, key, convert_toy)))

    def score(self, joined, settings) -> TaskScore:
        right = [pair.meta_value("label", str) == pred.output.strip() for pair, pred in joined]
        examples = [
            {"id": p.id, "gold": p.meta["label"], "predicted": q.output, "output": q.output}
            for p, q in joined
        ]
        return TaskScore({"accuracy": sum(right) / len(right), "n": len(right)}, examples)

    def headline(self, figures):
        return [("accuracy", figures["accuracy"])]

    def report_section(self, figures):
        return [f"accuracy {figures['accuracy']:.3f} over {figures['n']} claims", ""]

    def detect_output(self, text, p_yes, threshold=None):
        return {"stated": text.strip() == "Yes"}

    compare_metrics = (("accuracy", "accuracy"),)

    def example_figures(self, examples):
        return {"accuracy": sum(e["gold"] == e["predicted"] for e in examples) / len(examples)}

    def unreadable_outputs(self, figures):
        return 0, figures["n"], "outputs neither Yes nor No"


@pytest.fixture
def toy(tmp_path):
    records = [
        {"text": "The tunnel opened in 1985.", "claim": "It opened in 1985.", "supported": True},
        {"text": "The bridge opened in 1990.", "claim": "It opened in 1991.", "supported": False},
        {"text": "Rain fell all day.", "claim": "It was sunny.", "supported": False},
        {"text": "The team won twice.", "claim": "The team won.", "supported": True},
    ]
    data = tmp_path / "data"
    (data / "toy").mkdir(parents=True)
    lines = [
        json.dumps({**r, "split": "train" if i == 0 else "test"}) for i, r in enumerate(records)
    ]
    (data / "toy" / "claims.jsonl").write_text("\n".join(lines) + "\n")
    digest = hashlib.sha256((data / "toy" / "claims.jsonl").read_bytes()).hexdigest()
    source = Source("toy/claims.jsonl", "https://example.invalid/claims.jsonl", digest, "test")
    (tmp_path / "toy.txt").write_text(TOY_PROMPT)
    task = ToyTask(tmp_path / "toy.txt", source)
    with temporary_tasks(task):
        yield task, data
    assert "toy" not in task_names()  # gone after the block


def test_a_toy_fourth_task_runs_prepare_score_and_report(toy, tmp_path, capsys):
    _, data = toy
    assert task_names() == (*BUILTIN, "toy")
    manifest = run_prepare(
        PrepareConfig(tasks=["toy"]), data, tmp_path / "prepared", progress=False, log=print
    )
    assert manifest["counts"]["toy"]["test"]["pairs"] == 3
    assert manifest["prompt_hashes"]["toy"] == load_prompt("toy").hash
    test_pairs = list(read_pairs(tmp_path / "prepared" / "toy" / "test.jsonl", task_names()))
    predictions = tmp_path / "run" / "predictions"
    predictions.mkdir(parents=True)
    with (predictions / "toy.jsonl").open("w") as f:
        for pair, output in zip(test_pairs, ["No", "No", "No"], strict=True):
            f.write(json.dumps({"id": pair.id, "task": "toy", "output": output}) + "\n")
    code = main(
        ["score", "--data", str(tmp_path / "prepared"), "--predictions", str(predictions),
         "--out", str(tmp_path / "run"), "--tasks", "toy"]
    )  # fmt: skip
    assert code == 0
    assert "toy: accuracy 0.667" in capsys.readouterr().out  # 2 of 3 right
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["tasks"]["toy"]["accuracy"] == pytest.approx(2 / 3)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## toy" in report and "accuracy 0.667 over 3 claims" in report
    assert "Toy: Toy numbers are on its test split." in report


TOY_E2E = """\
# toy end-to-end prompt (the toy paper's Table 1)
[system]
Answer Yes or No.
[user]
Does the text state the claim?
{text}
Claim: {claim}
"""


def test_the_toy_task_is_evaluated_served_and_run_by_the_papers_e2e_method(toy, tmp_path, capsys):
    """No path skips a registered task: a served detector (`fincheck eval --backend openai`)
    answers the toy task's prompts, and `fincheck baseline --method e2e` runs the toy paper's
    prompt shipped beside the task's own. A method that does not cover it says so."""
    from fake_judge_server import FakeJudgeServer

    task, data = toy
    prepared = tmp_path / "prepared"
    run_prepare(PrepareConfig(tasks=["toy"]), data, prepared, progress=False, log=print)
    common = ["--data", str(prepared), "--no-progress"]
    endpoint = ["--backend", "openai", "--model", "m", "--max-retries", "0"]
    with FakeJudgeServer() as server:
        server.script = {"": [("ok", "Yes")] * 12}
        served = tmp_path / "served"
        code = main(
            ["eval", *endpoint, "--base-url", server.base_url, "--out", str(served), *common]
        )
        assert code == 0
        assert len(_lines(served / "predictions" / "toy.jsonl")) == 3
        sent = [m["content"] for r in server.requests for m in r["messages"]]
        assert any("Say Yes if the text states the claim" in c for c in sent)  # its own prompt
        assert {r["max_tokens"] for r in server.requests} == {task.max_new_tokens}

        method = ["baseline", "--method", "e2e", *endpoint, "--base-url", server.base_url]
        capsys.readouterr()
        assert main([*method, "--out", str(tmp_path / "none"), *common]) == 1
        assert "--method e2e covers final, qasem, fhsumbench, not toy" in capsys.readouterr().err
        (tmp_path / "e2e.txt").write_text(TOY_E2E)  # beside the task's prompt file
        server.requests.clear()
        e2e = tmp_path / "e2e"
        assert main([*method, "--out", str(e2e), *common]) == 0
        assert len(_lines(e2e / "predictions" / "toy.jsonl")) == 3
        assert all("Does the text state the claim?" in r["messages"][-1]["content"]
                   for r in server.requests)  # fmt: skip
        # overlap reads a QA's answer: the toy task has none, and a run naming it is refused
        args = ["baseline", "--method", "overlap", "--tasks", "toy", "--out", str(tmp_path / "o")]
        assert main([*args, *common]) == 1
        assert "--method overlap covers qasem, not toy" in capsys.readouterr().err


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_the_toy_task_trains_evaluates_detects_and_goes_into_the_card(
    toy, tmp_path, capsys, monkeypatch
):
    """Registered, the toy task is in the default training mixture (the prepared folder holds
    it), evaluated and scored, answered by `fincheck detect` (routed by its prompt's fields),
    and named in the model card with its own data origin: no stage was edited for it."""
    from fincheck.train.sft import build_trainer, load_training_recipe, train_and_save

    _, data = toy
    prepared, run = tmp_path / "prepared", tmp_path / "run"
    run_prepare(PrepareConfig(tasks=["toy"]), data, prepared, progress=False, log=print)
    monkeypatch.chdir(REPO)
    recipe = load_training_recipe(
        REPO / "configs/train/tiny-cpu.yaml",
        [f"--dataset_dir={prepared}", f"--output_dir={run}", "--deepspeed=", "--max_steps=2",
         "--save_steps=100", "--data_config=configs/data/all-tasks.yaml"],
    )  # fmt: skip
    assert train_and_save(build_trainer(recipe)) == 0
    trained = json.loads((run / "fincheck_run.json").read_text())["data"]["train_examples"]
    assert trained == {"toy": 1}  # the default mixture: every task the folder holds

    out = tmp_path / "eval"
    common = ["--data", str(prepared), "--out", str(out), "--no-progress"]
    assert main(["eval", "--adapter", str(run), "--device", "cpu", *common]) == 0
    assert len((out / "predictions" / "toy.jsonl").read_text().splitlines()) == 3
    assert main(["score", "--predictions", str(out / "predictions"), *common]) == 0
    assert json.loads((out / "results.json").read_text())["tasks"]["toy"]["n"] == 3

    inputs = tmp_path / "claims.jsonl"
    inputs.write_text(json.dumps({"text": "The bridge opened in 1990.", "claim": "It did."}) + "\n")
    capsys.readouterr()
    assert main(["detect", "--adapter", str(run), "--input", str(inputs), "--device", "cpu"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(answer) >= {"id", "stated"}  # the toy task's own reading (detect_output)

    repo = tmp_path / "repo"
    assert main(["publish", "--checkpoint", str(run), "--repo-id", "me/toy", "--dry-run",
                 str(repo)]) == 0  # fmt: skip
    card = (repo / "README.md").read_text()
    assert "Toy claims (example.invalid)" in card and (repo / "prompts" / "toy.txt").is_file()


def test_the_toy_task_joins_the_demo_by_its_plan(toy):
    """The demo samples, budgets and trains each task by its demo plan (`Task.demo`): the toy
    task, with the default plan, is in its evaluations and its training mixture; the built-in
    tasks keep theirs."""
    import demo

    from fincheck.train.data import load_mixture_config

    assert demo.test_examples() == "final=32,qasem=200,fhsumbench=36,toy=32"
    assert demo.answer_budgets() == ["--max-new-tokens", "final=128,fhsumbench=64"]
    mixture = load_mixture_config(REPO / "configs" / "data" / "demo.yaml")
    assert [mixture.weight(t) for t in task_names()] == [1.0, 0.2, 1.0, 1.0]
    assert [mixture.cap(t) for t in task_names()] == [32, None, 32, None]
    plain = load_mixture_config(REPO / "configs" / "data" / "all-tasks.yaml")
    assert [plain.weight(t) for t in task_names()] == [1.0, 1.0, 1.0, 1.0]
    assert [plain.cap(t) for t in task_names()] == [None] * 4


def test_unknown_task_is_an_error_that_names_the_known_ones(tmp_path, prepared_dir):
    with pytest.raises(FincheckError, match=r"unknown task 'toy'; known tasks: final, qasem"):
        get_task("toy")
    predictions = tmp_path / "predictions"
    predictions.mkdir()
    (predictions / "final.jsonl").write_text("")
    with pytest.raises(FincheckError, match=r"unknown task 'summaries'; known tasks"):
        run_score(ScoreOptions(prepared_dir, predictions, tmp_path / "out", tasks=("summaries",)))


# A task's name, in any case: a string that is the name or starts with it ("qasem", "FINAL",
# "final=32", "fhsumbench/f"; "final_" is English too often: final_adapter), or an identifier
# holding qasem/fhsum anywhere (QasemItem, fhsumbench_labels, score_qasem). Docstrings and
# comments are prose, not counted. `TASK_NAME` picks the names out of what matched.
TASK_STRING = re.compile(r"^((final|qasem|fhsumbench)($|[=/.,\-])|(qasem|fhsumbench)_)", re.I)
TASK_IDENTIFIER = re.compile(r"qasem|fhsum", re.IGNORECASE)
TASK_NAME = re.compile(r"final|qasem|fhsum(?:bench)?", re.IGNORECASE)

# Non-test files outside fincheck/tasks/ that still name tasks (Python code, and the keys and
# values of the YAML configs), with the names each holds (as written, sorted) and why. The test
# fails when a file gains or loses a name, or swaps one for another (then edit its list), so
# this list only shrinks.
NAMED_OUTSIDE: dict[str, list[str]] = {
    # the configs choose tasks by name: a training mixture, prepare's settings, a recipe's dev figures
    # its tasks, per-task weights and caps
    # its tasks and per-task weights
    "configs/data/qasem-fhsumbench.yaml": ["fhsumbench", "fhsumbench", "qasem", "qasem"],
    "configs/data/three-tasks.yaml": [
        "fhsumbench",
        "fhsumbench",
        "final",
        "final",
        "qasem",
        "qasem",
    ],
    "configs/data/three-tasks-final-third.yaml": [
        "fhsumbench",
        "fhsumbench",
        "final",
        "final",
        "qasem",
        "qasem",
    ],
    # per-task caps
    "configs/data/tiny.yaml": ["fhsumbench", "final", "qasem"],
    "configs/prepare/detector.yaml": [
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "qasem",
    ],
    # each task's own settings (qasem_dev_fraction, fhsumbench_*); no task list: every task
    "configs/prepare/default.yaml": [
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "qasem",
    ],
    "configs/prepare/paper-eval.yaml": ["fhsumbench", "qasem"],
    # the dev figures of two tasks; the best checkpoint by qasem_auc
    "configs/train/smollm2-135m-learn-cpu.yaml": ["fhsumbench", "fhsumbench", "qasem", "qasem"],
    "configs/train/qwen2.5-0.5b-cpu.yaml": ["fhsumbench", "fhsumbench", "qasem", "qasem"],
    # its dev figures, their per-task limits
    "configs/train/qwen2.5-0.5b-three-tasks-cpu.yaml": ["fhsumbench", "final", "final", "qasem"],
    # the papers' systems are per-benchmark protocols: their coverage, prompts and parsing
    # FINAL's own pipeline and two-step
    "eval/baselines/final_methods.py": ["final", "final", "final"],
    # the documented Python API: describe / support / classify
    "fincheck/detector.py": ["fhsumbench", "fhsumbench", "final", "final", "qasem", "qasem"],
    # the RAG evaluators' metrics read an answer against its context as FINAL reads a summary
    "serve/rag_metrics/support.py": ["final"],
    # benchmarks and the demo: per-task sample sizes and workloads
    # its default task and its default sample size per task
    "scripts/bench/eval_paths.py": ["fhsumbench", "final", "qasem", "qasem"],
    "scripts/crosscheck_scores.py": [
        "fhsum",
        "fhsum",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "fhsumbench",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
        "qasem",
    ],
    # the word-overlap floor beside QASem's figures
    "scripts/demo.py": ["qasem"],
}

SKIPPED_FOLDERS = {"tests", "build", "dist", "node_modules", "__pycache__"}


def _names(text: str) -> list[str]:
    return TASK_NAME.findall(text)


def task_names_in(path: Path) -> list[str]:
    """The task names a Python file's code holds (its strings and identifiers), as written."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and TASK_STRING.match(node.value):
                found += _names(node.value)
        else:
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.arg):
                name = node.arg
            if isinstance(name, str) and TASK_IDENTIFIER.search(name):
                found += TASK_IDENTIFIER.findall(name)
    return found


def task_names_in_yaml(path: Path) -> list[str]:
    """The task names a YAML file's keys and string values hold (comments are prose)."""
    found = []

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and TASK_STRING.match(value):
            found.extend(_names(value))

    walk(yaml.safe_load(path.read_text(encoding="utf-8")))
    return found


def files_to_read(root: Path) -> list[Path]:
    """Every Python file under `root`, tracked or not, and the YAML files under configs/; not
    tests, not the task packages, not hidden folders (.git, .venv), builds or caches."""
    found = []
    for path in [*root.rglob("*.py"), *(root / "configs").rglob("*.yaml")]:
        parts = path.relative_to(root).parts
        if any(p.startswith(".") or p in SKIPPED_FOLDERS or p.endswith(".egg-info") for p in parts):
            continue
        if parts[:2] == ("fincheck", "tasks"):
            continue
        found.append(path)
    return sorted(found)


def names_outside(root: Path) -> dict[str, list[str]]:
    named = {}
    for path in files_to_read(root):
        reader = task_names_in_yaml if path.suffix == ".yaml" else task_names_in
        if found := reader(path):
            named[path.relative_to(root).as_posix()] = sorted(found)
    return named


def test_no_task_is_named_outside_its_package():
    """Every non-test Python file is read (untracked ones too), and the YAML configs; a task's
    name belongs in fincheck/tasks/."""
    assert names_outside(REPO) == NAMED_OUTSIDE


def test_the_task_name_reader_finds_names_in_code_not_in_prose(tmp_path):
    path = tmp_path / "named.py"
    path.write_text(
        '"""A docstring naming qasem is prose."""\n'
        'LIMIT = "final=32,qasem=200"\n'
        'if task == "FHSumBench":\n    pass\n'
        "item = QasemItem()\n"
        "score = score_qasem\n"
        'saved = "final_adapter"\n'
        'said = "FINAL"  # in any case\n'
    )
    assert sorted(task_names_in(path)) == sorted(
        ["FHSumBench", "FINAL", "Qasem", "final", "qasem", "qasem"]
    )
    config = tmp_path / "prepare.yaml"
    config.write_text(
        "# comments name qasem: prose\ntasks: [final, QASem]\nqasem_dev_fraction: 0.15\n"
        "weights: {fhsumbench: 1.0}\nname: final answers\n"
    )
    assert sorted(task_names_in_yaml(config)) == ["QASem", "fhsumbench", "final", "qasem"]


def test_a_task_name_swapped_in_an_allowed_file_or_an_untracked_one_fails(tmp_path):
    """In a copy of an allowed file: a "qasem" swapped for "FHSumBench" changes its list (the
    same count); and a new untracked file or config naming a task shows up."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "configs").mkdir()
    (copy / "scripts" / "demo.py").write_text((REPO / "scripts" / "demo.py").read_text())
    assert names_outside(copy) == {"scripts/demo.py": NAMED_OUTSIDE["scripts/demo.py"]}
    swapped = copy / "scripts" / "demo.py"
    text = swapped.read_text(encoding="utf-8")
    assert '"qasem"' in text
    swapped.write_text(text.replace('"qasem"', '"FHSumBench"', 1), encoding="utf-8")
    (copy / "scratch.py").write_text('TASK = "Qasem"\n')  # untracked, anywhere
    (copy / "configs" / "new.yaml").write_text("fhsumbench_dev_fraction: 0.2\n")
    named = names_outside(copy)
    assert len(named["scripts/demo.py"]) == len(NAMED_OUTSIDE["scripts/demo.py"])
    assert named["scripts/demo.py"] != NAMED_OUTSIDE["scripts/demo.py"]
    assert "FHSumBench" in named["scripts/demo.py"]
    assert named["scratch.py"] == ["Qasem"]
    assert named["configs/new.yaml"] == ["fhsumbench"]


def test_the_docs_list_the_files_a_new_benchmark_needs(toy):
    """docs/architecture.md's list is the one the built-in tasks follow: a package holding the
    task, its prompt and its converter (the toy task above shows that no stage needs an edit,
    and the test below that the registry finds a new package by itself)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## How to add a benchmark", 1)[1].split("\n## ", 1)[0]
    files = re.findall(r"^\d+\. `([^`]+)`", section, flags=re.M)
    assert files == [
        "fincheck/tasks/<name>/__init__.py",
        "fincheck/tasks/<name>/prompt.txt",
        "fincheck/tasks/<name>/convert.py",
    ]
    for builtin in BUILTIN:  # and the built-in tasks follow it
        package = REPO / "fincheck" / "tasks" / builtin
        assert get_task(builtin).prompt_path == package / "prompt.txt"
        converters = {"final": "defacto.py"}  # FINAL's training data is DeFacto's
        assert (package / converters.get(builtin, "convert.py")).is_file()


def test_a_new_task_package_is_found_without_a_line_elsewhere(tmp_path, monkeypatch):
    """A folder with `__init__.py` defining TASK, put beside the built-in task packages, is a
    registered task: listed after them (no `listed`), by no edit of the registry."""
    import fincheck.tasks as registry

    package = tmp_path / "zzz_claims"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from fincheck.tasks.base import Task\n\n\n"
        "class ClaimsTask(Task):\n"
        "    name = 'claims'\n    title = 'Claims'\n    max_new_tokens = 8\n\n\n"
        "for _abstract in sorted(ClaimsTask.__abstractmethods__):\n"
        "    setattr(ClaimsTask, _abstract, lambda *a, **k: None)\n"
        "ClaimsTask.__abstractmethods__ = frozenset()\n"
        "TASK = ClaimsTask()\n"
    )
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_registry", {})
    assert task_names() == (*BUILTIN, "claims")
    assert get_task("claims").title == "Claims"


def test_a_task_folder_that_does_not_load_is_one_warning_and_the_rest_go_on(
    tmp_path, monkeypatch, caplog, capsys
):
    """A stray folder beside the task packages (an import error, no TASK, a TASK of another
    kind, a syntax error) is one warning naming the folder; the built-in tasks load and every
    command, `--help` included, runs."""
    import fincheck.tasks as registry

    bodies = {
        "zz_import": "import a_module_that_is_not_there\n",
        "zz_none": "X = 1\n",
        "zz_kind": "TASK = 'final'\n",
        "zz_syntax": "def broken(:\n",
    }
    for name, body in bodies.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(body)
    monkeypatch.setattr(registry, "__path__", [*registry.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_registry", {})
    with caplog.at_level("WARNING", logger="fincheck.tasks"):
        assert task_names() == BUILTIN
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == len(bodies)
    for name, line in zip(sorted(bodies), sorted(said), strict=True):
        assert line.startswith(f"{tmp_path / name}: not loaded as a task: ") and "\n" not in line
    monkeypatch.setattr(registry, "_registry", {})
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--help"])
    assert exit_.value.code == 0 and "Traceback" not in capsys.readouterr().err
