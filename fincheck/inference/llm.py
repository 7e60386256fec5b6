"""LLM clients as the evaluation sees them: the FINAL judge and the baselines ask through here.

A `ChatClient` answers a chat conversation with text and names itself (`identity`, never a
secret). `fincheck.models.llm_clients` has two: an OpenAI-compatible endpoint and a local
transformers model (the project's one inference path). On top of a client, `CachedLLM` keeps a
`RequestCache` (every answer on disk under a key of the whole request: client, prompt version,
messages, sampling), so an interrupted run resumes without repeating a call, and counts the
calls each example made.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from fincheck.data.prompting import YES_NO, FirstWordShare
from fincheck.errors import FincheckError
from fincheck.io import jsonl
from fincheck.io.safe_files import append_line, read_own_bytes
from fincheck.io.secrets import redact, redacted_value


@dataclass(frozen=True)
class Completion:
    """An answer's text, whether it was cut at the token budget (True), ended on its own
    (False), or the client cannot tell (None), and the model an endpoint said answered it."""

    text: str
    cut: bool | None = None
    served: str | None = None


def as_completion(answer: str | Completion) -> Completion:
    """A client may return plain text (cut unknown) or a Completion."""
    return answer if isinstance(answer, Completion) else Completion(answer)


class LLMCallError(Exception):
    """A call that failed for good (after the client's retries): recorded and not cached, so a
    rerun asks again. Its words are redacted: they quote an endpoint's reply, which may echo a
    held key, and they are written where the failed example is recorded."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(str(message)))


class ChatClient(ABC):
    """Answers a chat conversation with text. `identity` names the model and endpoint for the
    cache key. `span`: where the grounding text sits in the last user message, for a client
    that must trim it to its window (a local model); others ignore it. A client that can read
    P(Yes) at the first answer token says so (`reads_p_yes`) and reads it (`p_yes`; another
    task's first-word share, `share`, the same way)."""

    identity: dict[str, str]
    reads_p_yes: ClassVar[bool] = False
    trimmed: int = 0  # prompts whose grounding text was cut to fit the window (a local model)
    served_models: frozenset[str] | set[str] = frozenset()  # model names the replies carried
    # the models that answered a folder's earlier predictions: a reply from another stops the
    # run (a resume never mixes two models' answers); empty: any
    expected_served: frozenset[str] = frozenset()

    @abstractmethod
    def complete(
        self,
        messages: list[dict[str, str]],
        sampling: dict,
        span: Sequence[int] | None = None,
    ) -> str | Completion: ...

    def p_yes(
        self,
        messages: list[dict[str, str]],
        span: Sequence[int] | None = None,
        share: FirstWordShare = YES_NO,
    ) -> float | None:
        """P(Yes)/(P(Yes)+P(No)) at the first answer token (None: not available)."""
        return None

    def last_served(self) -> str | None:
        """The model an endpoint said answered this thread's last call (None: unnamed)."""
        return None


class RequestCache:
    """Append-only JSONL of {key, response[, cut]}: one line per completed call, flushed at once,
    so a crash loses at most the calls in flight. Only successful answers are stored."""

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path else None
        self._entries: dict[str, str] = {}
        self._cut: dict[str, bool] = {}  # answers known to have hit their token budget
        self._served: dict[str, str] = {}  # the model an endpoint said answered
        self._asked: dict[str, str] = {}  # which client was asked (`asked_of`), per key
        self._lock = threading.Lock()
        if self.path and (self.path.exists() or self.path.is_symlink()):
            text = read_own_bytes(self.path, "the request cache")
            for number, raw in enumerate(text.splitlines(), start=1):
                line = raw.decode("utf-8", errors="replace")
                try:
                    # a line that is no UTF-8 was damaged since it was written: never an answer
                    record = jsonl.loads(raw.decode("utf-8"))
                    key, response = record["key"], record["response"]
                    if not (isinstance(key, str) and isinstance(response, str)):
                        raise TypeError("a record's key and response are texts")  # else damaged
                    self._entries[key] = response
                    if "cut" in record:
                        self._cut[record["key"]] = bool(record["cut"])
                    if isinstance(record.get("served"), str):
                        self._served[record["key"]] = record["served"]
                    if isinstance(record.get("asked"), str):
                        self._asked[record["key"]] = record["asked"]
                except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
                    # a line torn by a crash is skipped; a file that does not start as a
                    # cache record does (json.dumps of {"key": ...}) is someone else's
                    # (`--judge-cache notes.jsonl`): never appended to
                    if number == 1 and not line.startswith('{"key": '):
                        raise FincheckError(
                            f"{self.path}:1: not a fincheck request cache (each line "
                            '{"key": ..., "response": ...}); give a cache fincheck wrote or a '
                            "new file (nothing was written)"
                        ) from None
                    continue
            # End a torn line so appends start clean; never truncate: another run sharing the
            # cache (--judge-cache) may be appending to it right now.
            if text and not text.endswith(b"\n"):
                append_line(self.path, "\n")
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(identity: dict, prompt_version: str, messages: list, sampling: dict) -> str:
        request = {
            "client": identity,
            "prompt_version": prompt_version,
            "messages": messages,
            "sampling": sampling,
        }
        canonical = json.dumps(request, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            response = self._entries.get(key)
            self.hits += response is not None
            self.misses += response is None
            return response

    def cut(self, key: str) -> bool | None:
        """Whether the cached answer hit its token budget (None: not recorded)."""
        with self._lock:
            return self._cut.get(key)

    def served_names(self, asked: str) -> set[str]:
        """Every model an endpoint said answered a request cached from the client `asked`
        (`asked_of`: a cache shared by two judges pins each to its own)."""
        with self._lock:
            return {m for k, m in self._served.items() if self._asked.get(k) == asked}

    def served(self, key: str) -> str | None:
        """The model an endpoint said answered (None: not recorded, or a local model)."""
        with self._lock:
            return self._served.get(key)

    def put(
        self,
        key: str,
        response: str,
        cut: bool | None = None,
        served: str | None = None,
        asked: str | None = None,
    ) -> None:
        with self._lock:
            self._entries[key] = response
            record: dict = {"key": key, "response": response}
            if cut is not None:
                self._cut[key] = cut
                record["cut"] = cut
            if served is not None:
                self._served[key] = served
                record["served"] = served
            if asked is not None:
                self._asked[key] = asked
                record["asked"] = asked
            if self.path:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                line = json.dumps(redacted_value(record), ensure_ascii=False)  # held keys: nowhere
                append_line(self.path, line + "\n")


def asked_of(client: ChatClient) -> str:
    """The client a cached answer was asked of, as its record keeps it: its identity's digest."""
    canonical = json.dumps(client.identity, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def expect_served(client: ChatClient, cache: RequestCache, recorded: Iterable[str] = ()) -> None:
    """A reply from another model than those that answered before stops the run: the models a
    folder's record names (`recorded`) and those kept with each answer the cache holds from
    this client (a record lost to a kill still leaves them there)."""
    client.expected_served = frozenset({*recorded, *cache.served_names(asked_of(client))})


class _ThreadCalls(threading.local):
    """Per caller thread: the requests of its current example, and whether its last answer
    hit its token budget (the class values: a thread's start)."""

    n: int = 0
    cut: bool | None = None


class CachedLLM:
    """A client behind the request cache, counting the requests of each caller thread (one
    example at a time per thread), cache hits included: a method's calls per example."""

    def __init__(self, client: ChatClient, cache: RequestCache, sampling: dict) -> None:
        self.client = client
        self.cache = cache
        self.sampling = dict(sampling)
        self._calls = _ThreadCalls()

    def start_example(self) -> None:
        self._calls.n = 0

    @property
    def calls(self) -> int:
        return self._calls.n

    @property
    def last_cut(self) -> bool | None:
        """Whether this thread's last answer (`ask`) hit its token budget (None: unknown)."""
        return self._calls.cut

    def ask(
        self,
        messages: list[dict[str, str]],
        prompt_version: str,
        span: Sequence[int] | None = None,
        max_tokens: int | None = None,
    ) -> str:
        sampling = {**self.sampling, **({"max_tokens": max_tokens} if max_tokens else {})}
        key = RequestCache.key(self.client.identity, prompt_version, messages, sampling)
        self._calls.n = self.calls + 1
        cached = self.cache.get(key)
        if cached is not None:
            self._calls.cut = self.cache.cut(key)
            return cached
        answer = as_completion(self.client.complete(messages, sampling, span))
        # who answered, kept with it, and whom it was asked of
        self.cache.put(key, answer.text, answer.cut, answer.served, asked_of(self.client))
        self._calls.cut = answer.cut
        return answer.text

    def p_yes(
        self,
        messages: list[dict[str, str]],
        prompt_version: str,
        span: Sequence[int] | None = None,
        share: FirstWordShare = YES_NO,
    ) -> float | None:
        """P(Yes) at the first answer token, cached like an answer ("none" when unavailable)."""
        if not self.client.reads_p_yes:
            return None
        read: dict = {"read": "p_yes"}
        if share != YES_NO:  # another task's words: another question (Yes/No keys unchanged)
            read |= {"yes": list(share.yes), "no": list(share.no)}
        key = RequestCache.key(self.client.identity, prompt_version, messages, read)
        self._calls.n = self.calls + 1
        cached = self.cache.get(key)
        if cached is None:
            value = self.client.p_yes(messages, span, share)
            cached = "none" if value is None else repr(float(value))
            self.cache.put(
                key, cached, served=self.client.last_served(), asked=asked_of(self.client)
            )
        return None if cached == "none" else self._share(cached)

    def _share(self, cached: str) -> float:
        """A cached P(Yes): a share in [0, 1], or one line naming the cache (edited, or
        damaged: a NaN or a word would become a score)."""
        try:
            value = float(cached)
        except ValueError:
            value = math.nan
        if not 0.0 <= value <= 1.0:
            raise FincheckError(
                f"{self.cache.path}: a cached P(Yes) of {cached[:40]!r}, not a share in [0, 1]; "
                "the cache was edited or damaged: remove it or give another (nothing was scored "
                "from it)"
            )
        return value


def run_concurrently(items: list, work, concurrency: int, on_done, progress: bool, desc: str):
    """`work(item)` for each item, `concurrency` at a time; `on_done(item, result)`, in this
    thread, as each finishes. Returns the failures ("id: reason", an `LLMCallError` each); any
    other error (a wrong key, a tripped breaker, Ctrl-C) stops the rest: nothing more is sent,
    and no call in flight is waited for. The workers are daemon threads: a thread pool's are
    joined when the interpreter exits, so a Ctrl-C waited for every call in flight (47 s
    measured); an abandoned call now never holds the command up."""
    import queue

    from tqdm.auto import tqdm

    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in items:
        todo.put(item)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set():
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                finished.put((item, work(item), None))
            except BaseException as error:  # handed to the main thread
                finished.put((item, None, error))

    for _ in range(min(max(1, concurrency), len(items))):
        threading.Thread(target=worker, daemon=True).start()
    failures: list[str] = []
    try:
        with tqdm(total=len(items), desc=desc, unit="ex", disable=not progress) as bar:
            for _ in items:
                while True:  # short waits: a Ctrl-C is seen at once
                    try:
                        item, result, error = finished.get(timeout=0.2)
                        break
                    except queue.Empty:
                        continue
                if isinstance(error, LLMCallError):
                    failures.append(f"{item.id}: {error}")
                elif error is not None:
                    raise error
                else:
                    on_done(item, result)
                bar.update(1)
    finally:
        stop.set()
    return failures
