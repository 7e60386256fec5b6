"""The task registry: every stage (prepare, train, eval, score, report, demo, detect, the model
card) loops over it instead of naming tasks.

    from fincheck.tasks import get_task, task_names
    task_names()                 # ('final', 'qasem', 'fhsumbench')
    get_task("qasem").score(...)  # an unknown name is an error that lists the known ones

A task is a package of this folder whose `__init__.py` defines `TASK`: found and imported on
first use, so a new task is a new folder and nothing else. A test (or a plugin) adds a task for
a while with `temporary_tasks(MyTask())`.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TypeVar

from fincheck.data.prompting import Prompt
from fincheck.errors import FincheckError
from fincheck.io.messages import one_line
from fincheck.tasks.base import Task

_registry: dict[str, Task] = {}
log = logging.getLogger(__name__)
T = TypeVar("T")


def _load_builtins() -> None:
    """Every task package of this folder, in the order reports list them (`Task.listed`). A
    folder that does not load as a task (an import error, no `TASK`, not a `Task`, a name
    taken) is one warning naming it; the other tasks and every command go on."""
    if _registry:
        return
    packages = [m for m in pkgutil.iter_modules(__path__) if m.ispkg]
    found: list[Task] = []
    for package in packages:
        task, problem = _load_task(package.name)
        if task is not None and task.name in {t.name for t in found}:
            task, problem = None, f"its task name {task.name!r} is taken by another folder"
        if task is None:
            folder = Path(getattr(package.module_finder, "path", __path__[0])) / package.name
            log.warning("%s: not loaded as a task: %s", folder, problem)
            continue
        found.append(task)
    for task in sorted(found, key=lambda t: (t.listed, t.name)):
        _registry[task.name] = task


def _load_task(name: str) -> tuple[Task | None, str]:
    """The `TASK` of the package `name`, or None and why not in a few words."""
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except Exception as e:  # any error of a task's own code: the folder is named, not crashed on
        return None, f"importing it raised {type(e).__name__}: {one_line(e, 200)}"
    task = getattr(module, "TASK", None)
    if not isinstance(task, Task):
        got = type(task).__name__
        return None, f"its __init__.py defines no TASK (a fincheck.tasks.base.Task; got {got})"
    return task, ""


def all_tasks() -> dict[str, Task]:
    """name -> task, in registry order."""
    _load_builtins()
    return dict(_registry)


def task_names() -> tuple[str, ...]:
    return tuple(all_tasks())


def get_task(name: str) -> Task:
    tasks = all_tasks()
    if name not in tasks:
        raise FincheckError(f"unknown task {name!r}; known tasks: {', '.join(tasks)}")
    return tasks[name]


def load_prompt(name: str) -> Prompt:
    """The prompt of a registered task (its `prompt_path`)."""
    return get_task(name).prompt()


def prompt_hashes(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """name -> its prompt's hash (recorded in manifests, runs and model cards)."""
    return {name: load_prompt(name).hash for name in names}


def check_task_names(names: list[str] | tuple[str, ...], what: str = "tasks") -> None:
    """A non-empty list of known task names, or one error naming the unknown ones."""
    known = task_names()
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise FincheckError(
            f"{what}: unknown task(s) {unknown}; known tasks: {', '.join(known)}"
            if unknown
            else f"{what}: give at least one of {', '.join(known)}"
        )


def per_task_numbers(text: str) -> int | dict[str, int]:
    """'256' (every task) or 'final=512,fhsumbench=128' (only the tasks named, each once); each
    N >= 1."""

    def at_least_one(value: str) -> int:
        if (number := int(value)) < 1:
            raise ValueError(value)
        return number

    try:
        if "=" in text:  # an unknown task or one named twice: a FincheckError
            return per_task_values(text, "", lambda _task, value: at_least_one(value))
        return at_least_one(text)
    except (ValueError, FincheckError):
        raise FincheckError(
            f"expected N or task=N,... with N >= 1, each task once (tasks:"
            f" {','.join(task_names())}), got {text!r}"
        ) from None


def per_task_values(text: str, option: str, convert: Callable[[Task, str], T]) -> dict[str, T]:
    """`task=value,...` (an option's text, each task once) -> {task: convert(task, value)};
    `convert` raises a FincheckError, worded without the option, for a value the task cannot
    take."""
    values: dict[str, T] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep:
            raise FincheckError(f"{option} {part}: expected task=value")
        if name in values:  # `qasem=0.5,qasem=0.7` would keep the last without a word
            raise FincheckError(f"{option} {part}: {name} was already given a value")
        try:
            values[name] = convert(get_task(name), value)  # an unknown task: the registry's error
        except FincheckError as e:
            raise FincheckError(f"{option} {part}: {e}") from None
    return values


def per_task_thresholds(text: str) -> dict[str, float]:
    """`--threshold task=T,...`: a decision threshold in (0, 1) on the p_yes of each task
    named (chosen on dev), for a task whose predictions carry one."""

    def threshold_of(task: Task, value: str) -> float:
        if not task.reads_p_yes:
            raise FincheckError(f"{task.name} has no p_yes to threshold")
        with suppress(ValueError):
            if 0 < (threshold := float(value)) < 1:
                return threshold
        raise FincheckError("expected task=T with 0 < T < 1")

    return per_task_values(text, "--threshold", threshold_of)


def per_task_budget(text: str) -> dict[str, int]:
    """`--max-new-tokens`: N for every task, or the tasks named (the others keep their own)."""
    numbers = per_task_numbers(text)
    return dict.fromkeys(task_names(), numbers) if isinstance(numbers, int) else numbers


@contextmanager
def temporary_tasks(*tasks: Task) -> Iterator[None]:
    """Register extra tasks for the duration of a `with` block (tests, experiments)."""
    _load_builtins()
    clash = [t.name for t in tasks if t.name in _registry]
    if clash:
        raise FincheckError(f"task(s) {clash} already registered")
    _registry.update((t.name, t) for t in tasks)
    try:
        yield
    finally:
        for task in tasks:
            _registry.pop(task.name, None)
