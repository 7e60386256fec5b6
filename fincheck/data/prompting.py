"""Task prompts: stored as files (`fincheck/tasks/<task>/prompt.txt`, each task's `prompt_path`),
rendered the same way for training, evaluation and detection.

A prompt file has a `[system]` and a `[user]` section; `#` lines are comments. Placeholders are
`{name}`; only the names a task declares are substituted, so braces elsewhere (the JSON answer
format of fhsumbench) are left alone. The prompt's hash is over the file's bytes: editing the
wording changes the hash recorded in every manifest, recipe run and model card.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fincheck.errors import FincheckError

GROUNDING_FIELD = "text"  # the placeholder holding the grounding text in every task
YES_SPELLINGS = ("Yes", " Yes", "yes", " yes")
NO_SPELLINGS = ("No", " No", "no", " no")


@dataclass(frozen=True)
class FirstWordShare:
    """What a task's `p_yes` is: P(yes) / (P(yes) + P(no)) at the answer's first position, each
    summed over its spellings. QASem: "Yes" against "No", and the word is the whole answer
    (`ends_answer`: decoding stops after its first token). FINAL: a list opening ("A.")
    against "None", read before the list is written: the flag's score, which a threshold
    chosen on dev turns into a decision."""

    yes: tuple[str, ...]
    no: tuple[str, ...]
    ends_answer: bool = False


YES_NO = FirstWordShare(YES_SPELLINGS, NO_SPELLINGS, ends_answer=True)
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True)
class Prompt:
    task: str
    system: str
    user: str
    hash: str
    path: Path

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_PLACEHOLDER.findall(self.user)))

    def render(self, **values: str) -> tuple[str, str, tuple[int, int]]:
        """Fill the user template. Returns (system, user, grounding span in user)."""
        missing = [name for name in self.fields if name not in values]
        if missing:
            raise FincheckError(f"prompt {self.task}: missing values for {missing}")
        parts = _PLACEHOLDER.split(self.user)  # literal, name, literal, ..., name, literal
        span = (0, 0)
        for i in range(1, len(parts), 2):
            value = values[parts[i]]
            if parts[i] == GROUNDING_FIELD:
                start = sum(map(len, parts[:i]))
                span = (start, start + len(value))
            parts[i] = value
        return self.system, "".join(parts), span

    def fields_of(self, user: str, span: Sequence[int] | None = None) -> dict[str, str]:
        """The values this prompt was rendered with, read back from its user message (how a
        baseline with its own prompt gets a prepared pair's document, summary or QA). With the
        grounding `span` the document is taken from it, never searched for: a document holding
        the template's own separator ("\n\nSummary:\n") is read whole, and the rest is
        matched around it (a search from every separator was quadratic)."""
        pieces = _PLACEHOLDER.split(self.user)  # literal, name, literal, ..., name, literal
        if span is None or GROUNDING_FIELD not in pieces[1::2]:
            return self._matched(pieces, user)
        at = pieces.index(GROUNDING_FIELD, 1)
        start, end = span
        before, after = (
            self._matched(pieces[:at], user[:start]),
            self._matched(pieces[at + 1 :], user[end:]),
        )
        if any(before[k] != v for k, v in after.items() if k in before):
            raise self._not_rendered()
        return {**before, GROUNDING_FIELD: user[start:end], **after}

    def _matched(self, pieces: list[str], text: str) -> dict[str, str]:
        pattern, named = list(pieces), set()
        for i, piece in enumerate(pattern):
            if i % 2 == 0:
                pattern[i] = re.escape(piece)
            else:
                pattern[i] = f"(?P={piece})" if piece in named else f"(?P<{piece}>.*?)"
                named.add(piece)
        found = re.fullmatch("".join(pattern), text, flags=re.DOTALL)
        if found is None:
            raise self._not_rendered()
        return found.groupdict()

    def _not_rendered(self) -> FincheckError:
        return FincheckError(
            f"the message was not rendered from {self.path}: re-run `fincheck prepare` with "
            "the installed prompts"
        )

    def messages(self, **values: str) -> tuple[list[dict[str, str]], tuple[int, int]]:
        """Chat messages (system, user) for these values, and the grounding span."""
        system, user, span = self.render(**values)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}], span


def parse_prompt_file(path: Path, task: str, needs_grounding: bool = True) -> Prompt:
    raw = path.read_bytes()
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in raw.decode("utf-8").splitlines():
        if line.startswith("#"):
            continue
        header = re.fullmatch(r"\[(system|user)\]\s*", line)
        if header:
            current = header.group(1)
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    if set(sections) != {"system", "user"}:
        raise FincheckError(f"{path}: a prompt file needs a [system] and a [user] section")
    system, user = ("\n".join(sections[k]).strip() for k in ("system", "user"))
    if needs_grounding and "{" + GROUNDING_FIELD + "}" not in user:
        raise FincheckError(f"{path}: the [user] section must contain {{{GROUNDING_FIELD}}}")
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return Prompt(task=task, system=system, user=user, hash=digest, path=path)


@cache
def load_prompt_file(path: Path, task: str) -> Prompt:
    """A task's prompt file, read once (`Task.prompt`; by name: `fincheck.tasks.load_prompt`)."""
    if not path.is_file():
        raise FincheckError(f"no prompt file for task {task!r}: expected {path}")
    return parse_prompt_file(path, task)
