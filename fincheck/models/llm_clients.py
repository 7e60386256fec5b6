"""LLM clients for the judge, the baselines and a served detector: an OpenAI-compatible
chat-completions endpoint and a local transformers model, both `fincheck.inference.llm.ChatClient`s
that read P(Yes). ("Client" here: how an LLM is asked; "backend" names where `fincheck eval`'s
detector runs.) The HTTP client leaves timeouts and retries (backoff with jitter on 408/409/429,
5xx and connection errors, `Retry-After` honoured) to the `openai` client.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import queue
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

from fincheck.data.prompting import YES_NO, FirstWordShare
from fincheck.errors import FincheckError
from fincheck.inference.generation import PromptDoesNotFit
from fincheck.inference.llm import ChatClient, Completion, LLMCallError
from fincheck.inference.shared_prefix import answer_in_order
from fincheck.io.bounded_http import UnreadableReply, bounded_http_client
from fincheck.io.deadline import CallDeadline, within_deadline
from fincheck.io.jsonl import without_lone_surrogates
from fincheck.io.messages import one_line, shortened
from fincheck.io.secrets import hold_secret, hold_url_secrets, public_url, redact
from fincheck.models.loading import LoadOptions, load_model, model_content

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
LOCAL_REMEDY = "a model with a longer window, or a smaller answer budget"
# Defaults that give an answer or a one-line error within about five minutes on an endpoint
# that never answers: (1 + 4 retries) x 60 s, then the unreachable breaker.
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 4


@dataclass(frozen=True)
class EndpointCaller:
    """Who calls the endpoint, so its messages name that caller's own options: the endpoint
    block's flags under its prefix (`fincheck.eval.options.Endpoint`, `JudgeEndpoint`)."""

    name: str  # "the judge endpoint", "the endpoint"
    prefix: str = ""  # "judge_": --judge-base-url, ...

    def flag(self, option: str) -> str:
        return "--" + (self.prefix + option).replace("_", "-")


JUDGE = EndpointCaller("the judge endpoint", "judge_")
METHOD = EndpointCaller("the endpoint")
SERVED_DETECTOR = EndpointCaller("the served detector")


def served_model(response: Any) -> str | None:
    """The model name a reply says answered it, as it may be recorded: redacted (an endpoint
    may put anything there, a key it was sent included) and without lone surrogates."""
    served = getattr(response, "model", None)
    return redact(without_lone_surrogates(served)) if isinstance(served, str) else None


def build_client(opts, kind: str, model: str, caller: EndpointCaller, **local):
    """The one builder of an LLM client: an OpenAI-compatible endpoint set by the options'
    endpoint block under the caller's prefix, or a local model (`local`: the settings of
    `TransformersChatClient`)."""
    if kind == "openai":
        option = lambda name: getattr(opts, caller.prefix + name)  # noqa: E731
        settings = [option(n) for n in ("base_url", "api_key_env", "timeout", "max_retries")]
        return OpenAIChatClient(model, *settings, caller=caller)
    return TransformersChatClient(model, **local)


class OpenAIChatClient(ChatClient):
    """Chat completions over HTTP. The API key is read from an environment variable and only
    handed to the `openai` client: it is not stored on this object, printed, or cached."""

    reads_p_yes = True  # from the logprobs, when the endpoint returns them

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = DEFAULT_KEY_ENV,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_consecutive_unreachable: int = 5,
        max_consecutive_refused: int = 10,
        caller: EndpointCaller = JUDGE,
    ) -> None:
        import openai

        key = os.environ.get(api_key_env)
        hold_secret(key)  # redacted by value in every line printed and file written
        # the openai client would read $OPENAI_BASE_URL itself: read here, it is checked,
        # held and recorded as a given URL is
        base_url = endpoint_url(base_url or os.environ.get("OPENAI_BASE_URL") or None, caller)
        if not key:
            if base_url is None:
                raise FincheckError(
                    f"{caller.name} needs an API key: set ${api_key_env} (or point "
                    f"{caller.flag('api_key_env')} at the variable that holds it)"
                )
            key = "not-needed"  # local OpenAI-compatible servers (vLLM, llama.cpp) ignore it
        elif base_url and urlsplit(base_url).netloc.rpartition("@")[0]:
            # httpx sends a URL's user:password as `Authorization: Basic`, in place of the key's
            # `Bearer`: the key would never reach the endpoint, and it would answer 401s
            raise FincheckError(
                f"{caller.name} {public_url(base_url)}: the URL holds a user and password, "
                f"which would be sent in place of the API key in ${api_key_env}: give one of "
                f"the two (drop user:password@ from the URL, or unset ${api_key_env} for an "
                "endpoint behind Basic authentication)"
            )
        address, query = _without_query(base_url)
        self._client = openai.OpenAI(
            api_key=key,
            base_url=address,
            default_query=query,  # sent with every request, after its path (Azure's api-version)
            timeout=timeout_s,
            max_retries=max_retries,
            http_client=bounded_http_client(),  # replies capped as sent and as inflated
        )
        self.max_retries = max_retries  # also for replies that come back malformed
        # The openai client's timeout bounds each read of a socket: a server that drips a byte
        # every half second never trips it. Each call as a whole gets a deadline too: every
        # attempt's timeout, plus the client's backoff between attempts (at most 8 s each).
        self.deadline_s = timeout_s * (max_retries + 1) + 8.0 * max_retries
        self.caller = caller
        self.identity = {
            "backend": "openai",
            "model": model,
            "base_url": public_url(str(self._client.base_url) + _query_of(base_url)),
        }
        # Penalties a server applies unless told otherwise (llama-cpp-python's server: a repeat
        # penalty of 1.1) make "temperature 0" something other than the model's greedy answer:
        # sent at their neutral values, and named in the identity (its answers differ).
        self.neutral_sampling = declared_penalties(self._client, base_url) if base_url else {}
        if self.neutral_sampling:
            self.identity["neutral_sampling"] = self.neutral_sampling
        self.model = model
        self.where = f"{caller.name} {self.identity['base_url']}"  # its messages' subject
        self.without_logprobs = False  # a reply came without them, or they were refused
        # Circuit breakers: this many calls in a row that could not connect (each after all its
        # retries) means the endpoint is down or mistyped; stop instead of failing every example.
        self.max_consecutive_unreachable = max_consecutive_unreachable
        # 400/422 replies in a row (reset by any answer): a model name or option the endpoint
        # never accepts, where retrying every example would only repeat the refusal
        self.max_consecutive_refused = max_consecutive_refused
        self._in_a_row: Counter[str] = Counter()  # failures since the last answer, per breaker
        self._said: set[str] = set()  # notices already printed (`_say_once`)
        self._refused_params: set[str] = set()  # parameters this endpoint refused (`_adapted`)
        # The model names the replies carry (a router or a proxy may serve another model than
        # the one asked for): recorded beside the predictions and in results.json.
        self.served_models: set[str] = set()
        self._last = threading.local()  # this thread's last reply's served model
        self._lock = threading.Lock()

    def complete(
        self, messages: list[dict[str, str]], sampling: dict, span: Sequence[int] | None = None
    ) -> Completion:
        response = self._create(messages, sampling)
        choice = response.choices[0]  # checked by `reply_problem`: one, with a text message
        # stripped as the local path strips its decoded answer: the same tokens, the same text
        # (a served answer cut at the budget may end in the newline a local one loses)
        return Completion(  # redacted: an endpoint that echoes a held key writes it nowhere
            redact(without_lone_surrogates(choice.message.content)).strip(),
            hit_budget(choice, response, sampling.get("max_tokens")),
            served_model(response),
        )

    def p_yes(
        self,
        messages: list[dict[str, str]],
        span: Sequence[int] | None = None,
        share: FirstWordShare = YES_NO,
    ) -> float | None:
        """P(Yes)/(P(Yes)+P(No)) over the first token's top logprobs (spellings: Yes, yes, YES,
        with or without a leading space; `share`: another task's two words); None when the
        endpoint's reply has no logprobs or neither word is among them (the answer is then read
        from the text). A call that fails raises LLMCallError: the example fails and a rerun
        asks again (never "no logprobs")."""
        if "logprobs" in self._refused_params:  # said once already; the text is scored
            return None
        sampling = {"temperature": 0.0, "max_tokens": 1, "logprobs": True, "top_logprobs": 20}
        response = self._create(messages, sampling)
        if "logprobs" in self._refused_params:  # this very call found out
            self.without_logprobs = True
            return None
        top = top_logprobs(response.choices[0])  # its shape checked by `reply_problem`
        if top is None:  # a well-formed reply without them
            self.without_logprobs = True
            self._say_once(
                "no_logprobs",
                f"{self.where} returns no logprobs, so no p_yes: QASem is scored from the "
                "answers' text (the AUC of hard 0/1 scores; the report says so), FINAL has no "
                "flag score",
            )
            return None
        yes, no = (
            sum(math.exp(t.logprob) for t in top if t.token.strip().lower() in words)
            for words in ({w.strip().lower() for w in side} for side in (share.yes, share.no))
        )
        return yes / (yes + no) if yes + no > 0 else None

    def _say_once(self, what: str, line: str) -> None:
        """A notice about what the endpoint does not support, printed once per run."""
        with self._lock:
            if what in self._said:
                return
            self._said.add(what)
        print(line, file=sys.stderr)

    def _create(self, messages: list[dict[str, str]], sampling: dict):
        """One call, with the parameters this endpoint refused once adapted for the rest of
        the run (`refused_parameter`): said in one line, never silently."""
        end = time.monotonic() + self.deadline_s  # one deadline for the whole logical call
        while True:
            try:
                return self._create_once(messages, self._adapted(sampling), end)
            except _RefusedParameter as refused:
                with self._lock:
                    self._refused_params.add(refused.param)
                key = "no_logprobs" if refused.param == "logprobs" else refused.param
                self._say_once(key, self._adaptation_line(refused.param, refused.error))

    def _adapted(self, sampling: dict) -> dict:
        """`sampling` as this endpoint accepts it: max_tokens renamed max_completion_tokens
        (OpenAI's reasoning models), logprobs or temperature left out when refused; a penalty
        the server declares on by default set to neutral (`declared_penalties`)."""
        sent = {**self.neutral_sampling, **sampling}
        if "max_tokens" in self._refused_params and "max_tokens" in sent:
            sent["max_completion_tokens"] = sent.pop("max_tokens")
        if self._refused_params & {"logprobs", "top_logprobs"}:
            sent.pop("logprobs", None)
            sent.pop("top_logprobs", None)
        if "temperature" in self._refused_params:
            sent.pop("temperature", None)
        return sent

    def _adaptation_line(self, param: str, e: Exception) -> str:
        what = {
            "max_tokens": "refuses max_tokens: the budget is sent as max_completion_tokens",
            "logprobs": "refuses logprobs as asked (top 20; vLLM: serve with --max-logprobs "
            "20): QASem is scored from the answers' text (the AUC of hard 0/1 scores; the "
            "report says so)",
            "temperature": "refuses temperature 0: its answers are sampled at its default "
            "temperature, not greedy (runs will not repeat exactly)",
        }[param]
        return f"{self.where} {what} ({one_line(e)})"

    def _create_once(self, messages: list[dict[str, str]], sampling: dict, end: float):
        """One call and its reply checked (`reply_problem`). The openai client retries what
        fails over HTTP; a 200 whose reply is malformed is asked again the same way (its backoff,
        up to max_retries times), then the call fails: a malformed reply is never returned.
        Every attempt, re-asks and backoff included, ends by `end` (time.monotonic())."""
        from tenacity import Retrying, retry_if_result, stop_after_attempt

        def checked() -> tuple[Any, str | None]:
            response = self._call(messages, sampling, end)  # its failures are not retried here
            if isinstance(response, _NotJSON):
                return response, response.problem
            return response, reply_problem(response, asked_logprobs="logprobs" in sampling)

        def openai_backoff(state: Any) -> float:  # 0.5 s doubling up to 8 s, less 0-25% jitter
            return min(0.5 * 2 ** (state.attempt_number - 1), 8.0) * (1 - 0.25 * random.random())

        def within_end(state: Any) -> float:  # no backoff past the call's deadline
            return min(openai_backoff(state), max(0.0, end - time.monotonic()))

        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=within_end,
            retry=retry_if_result(lambda checked: checked[1] is not None),
            retry_error_callback=lambda state: self._malformed(state.outcome.result()[1]),
        )
        response, _ = retrying(checked)
        served = served_model(response)
        with self._lock:  # the first model named answers the whole run, when nothing did before
            if not self.expected_served and served is not None:
                self.expected_served = frozenset({served})
        if self.expected_served and served not in self.expected_served:  # None: unnamed
            raise FincheckError(
                f"{self.where} answered as {served!r}, but the answers this run keeps "
                f"(predictions, cached answers) were answered by "
                f"{', '.join(sorted(self.expected_served))}: going on would mix two models' "
                "answers; use another --out (this answer was not written)"
            )
        self._last.served = served
        with self._lock:
            self._in_a_row.clear()
            if served is not None:
                self.served_models.add(served)
        return response

    def last_served(self) -> str | None:
        return getattr(self._last, "served", None)

    def _call(self, messages: list[dict[str, str]], sampling: dict, end: float):
        """The HTTP call after the openai client's retries: the reply, a `_NotJSON`, or the
        failure as this client's error (a key refused or too many failures in a row stop the
        run; any other fails the example's call). It ends by `end`, the logical call's
        deadline, whatever attempt it is."""
        import openai

        try:
            left = end - time.monotonic()
            if left <= 0:
                raise CallDeadline(self.deadline_s)
            return within_deadline(
                lambda: self._client.chat.completions.create(
                    model=self.model, messages=messages, **openai_arguments(sampling)
                ),
                left,
            )
        except CallDeadline:
            if n := self._tripped("unreachable", self.max_consecutive_unreachable):
                raise FincheckError(
                    f"{self.where} gave no complete answer within {self.deadline_s:g} s to {n} "
                    f"calls in a row; check {self.caller.flag('base_url')} (a slow server needs a "
                    f"longer {self.caller.flag('timeout')}), then rerun (answers so far are cached)"
                ) from None
            raise LLMCallError(
                f"no complete answer within {self.deadline_s:g} s (each attempt's "
                f"{self.caller.flag('timeout')} and the retries between them)"
            ) from None
        except ValueError as e:  # a 200 whose body is broken JSON (json's and pydantic's errors)
            return _NotJSON(f"a reply that is not JSON ({one_line(e)})")
        except UnreadableReply as e:  # too large, or an encoding not asked for: not read
            return _NotJSON(str(e))
        except RecursionError:  # the openai client's own JSON reader, on a reply nested deep
            return _NotJSON("a reply nested too deep to read")
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise FincheckError(
                f"{self.where} refused the API key "
                f"(HTTP {e.status_code}); check the key variable and the model name"
            ) from None
        except openai.NotFoundError as e:
            raise FincheckError(
                f"{self.where} has no model {self.model!r} (HTTP {e.status_code})"
            ) from None
        except openai.APIError as e:  # after all retries: unreachable, 400/422, 429/5xx, other 4xx
            if isinstance(e, openai.APIConnectionError):  # also timeouts
                if n := self._tripped("unreachable", self.max_consecutive_unreachable):
                    raise FincheckError(
                        f"{self.where} is unreachable "
                        f"({n} calls in a row could not connect or timed out: {one_line(e)}); "
                        f"check {self.caller.flag('base_url')} and the network (a slow server needs a "
                        f"longer {self.caller.flag('timeout')}), then rerun (answers so far are cached)"
                    ) from None
            elif isinstance(e, openai.RateLimitError) or getattr(e, "status_code", 0) >= 500:
                # 429 and 5xx after all their retries (Retry-After honoured): an overloaded or
                # broken endpoint; so many in a row stop the run instead of failing every example
                if n := self._tripped("overloaded", self.max_consecutive_unreachable):
                    raise FincheckError(
                        f"{self.where} answered HTTP {e.status_code} to {n} calls in a row, each "
                        f"after {self.max_retries} retries ({one_line(e)}); wait or lower "
                        f"{self.caller.flag('concurrency')}, then rerun (answers so far are cached)"
                    ) from None
            elif isinstance(e, (openai.BadRequestError, openai.UnprocessableEntityError)):
                param = refused_parameter(e, sampling)
                if param is not None and param not in self._refused_params:
                    raise _RefusedParameter(param, e) from None
                if n := self._tripped("refused", self.max_consecutive_refused):
                    raise FincheckError(
                        f"{self.where} refused {n} "
                        f"requests in a row (HTTP {e.status_code}: {one_line(e)}); check the model name "
                        "and the options it accepts, then rerun (answers so far are cached)"
                    ) from None
            raise LLMCallError(f"{type(e).__name__}: {one_line(e)}") from None

    def _malformed(self, what: str) -> NoReturn:
        """A reply that is no chat completion, after the HTTP call succeeded: the example's call
        fails (never cached: a rerun asks again); so many in a row stop the run."""
        if self._tripped("unreachable", self.max_consecutive_unreachable):
            raise FincheckError(
                f"{self.where} does not answer with chat completions ({what}): is "
                f"{self.caller.flag('base_url')} the API's /v1 URL? Answers so far are cached; "
                "rerun once it is fixed"
            ) from None
        raise LLMCallError(f"{self.where} sent {what}") from None

    def _tripped(self, breaker: str, limit: int) -> int:
        """One more failure of this kind in a row: their number once it reaches `limit` (the
        breaker stops the run), else 0."""
        with self._lock:
            self._in_a_row[breaker] += 1
            n = self._in_a_row[breaker]
        return n if n >= limit else 0


@dataclass(frozen=True)
class _NotJSON:
    """A 200 whose body the openai client could not read as JSON."""

    problem: str


def reply_problem(response, asked_logprobs: bool) -> str | None:
    """What makes a reply no well-formed chat completion (None: it is one). An allow-list of
    the fields fincheck reads: choices a non-empty list, the first with a message whose content
    is a string; when logprobs were asked, none at all (null or absent: a well-formed reply
    without them) or the first token's top logprobs as a list of tokens with finite
    log-probabilities. The one place a reply is checked: what passes is read without checks."""
    if not hasattr(response, "choices"):  # a 200 whose body is no chat completion (HTML)
        return f"a 200 reply that began {shortened(str(response), 80)!r}"
    if not isinstance(response.choices, list) or not response.choices:
        return "a reply with no choices"
    choice = response.choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        return "a reply whose choice has no message"
    if not isinstance(getattr(message, "content", None), str):
        return f"a message with no text ({getattr(message, 'content', None)!r})"
    if not asked_logprobs:
        return None
    try:
        top = top_logprobs(choice)
    except (AttributeError, TypeError, KeyError):
        return f"logprobs that are no list of tokens ({getattr(choice, 'logprobs', None)!r:.80})"
    if top is not None and not (isinstance(top, list) and all(map(_is_logprob, top))):
        return "logprobs that are no log-probabilities (a number <= 0 for each token)"
    return None


def top_logprobs(choice) -> list | None:
    """The first token's top logprobs of a choice; None where the reply carries none (no
    logprobs, no token, no top list). Raises on a shape that is no logprobs object."""
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is None:
        return None
    content = logprobs.content  # AttributeError: a string, a number where the object goes
    if content is None or content == []:
        return None
    if not isinstance(content, list):
        raise TypeError("logprobs.content is no list")
    return content[0].top_logprobs


def _is_logprob(entry) -> bool:
    """A top-logprob entry as the API defines it: a token and a finite log-probability <= 0."""
    value = getattr(entry, "logprob", None)
    return (
        isinstance(getattr(entry, "token", None), str)
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value <= 1e-6
    )


# The sampling penalties a server may apply by default, at the values that turn them off.
NEUTRAL_PENALTIES = {
    "repeat_penalty": 1.0,  # llama.cpp (llama-cpp-python's server defaults to 1.1)
    "repetition_penalty": 1.0,  # vLLM, TGI
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
PROBE_TIMEOUT_S = 2.0
OUTSIDE_OPENAI_API = ("repeat_penalty", "repetition_penalty")  # sent in the body as extras


def openai_arguments(sampling: dict) -> dict:
    """`sampling` as `chat.completions.create` takes it: a server's own parameters in
    `extra_body` (the client refuses names outside OpenAI's API)."""
    extra = {k: sampling[k] for k in OUTSIDE_OPENAI_API if k in sampling}
    rest = {k: v for k, v in sampling.items() if k not in extra}
    return {**rest, "extra_body": extra} if extra else rest


def endpoint_url(url: str | None, caller: EndpointCaller) -> str | None:
    """`url` if it has the one form an endpoint URL is read in: http or https, a host (and a
    port that is a number), an optional user:password@ whose reserved characters are
    percent-encoded, no space or control character, no "@" after the host; its credentials
    held from then on (`hold_url_secrets`). Anything else is one line that never echoes it:
    URL readers disagree on such URLs (tabs and newlines dropped, a password cut at its "/"),
    so what is held would not be what is printed or recorded."""
    if url is None:
        return None
    problem = None
    if any(ch <= " " or ch == "\x7f" for ch in url):
        problem = "holds a space or a control character (a tab, a newline)"
    else:
        parts = urlsplit(url)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            problem = "is not http:// or https:// followed by a host"
        elif not port_ok:
            problem = "has a port that is no number (a ':', '/', '?' or '#' in a password?)"
        elif "@" in url.partition("://")[2][len(parts.netloc) :].split("#")[0].split("?")[0]:
            problem = "has an '@' after its host (a '/' in a password? percent-encode it)"
    if problem:
        raise FincheckError(
            f"{caller.name}: its URL {problem}: percent-encode what belongs to a user or a "
            "password, and give the URL without anything else"
        )
    hold_url_secrets(url)
    return url


def _without_query(base_url: str | None) -> tuple[str | None, dict[str, str] | None]:
    """A base URL's query string apart: the openai client appends each request's path to the
    base URL as a string, after the query (`/v1?api-version=1chat/completions`)."""
    if base_url is None or "?" not in base_url:
        return base_url, None
    from urllib.parse import parse_qsl, urlunsplit

    parts = urlsplit(base_url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return urlunsplit(parts._replace(query="", fragment="")), query or None


def _query_of(base_url: str | None) -> str:
    return "?" + base_url.split("?", 1)[1].partition("#")[0] if base_url and "?" in base_url else ""


def declared_penalties(client: Any, base_url: str) -> dict[str, float]:
    """The penalties the server's own OpenAPI schema (`/openapi.json`, served by FastAPI-based
    servers) declares for chat completions with a default other than neutral, each at its
    neutral value; {} when the server publishes no schema (or none in time: the whole reply
    within PROBE_TIMEOUT_S, not each read, so a server that drips it costs no more) or none
    differs."""
    root = str(base_url).rstrip("/").removesuffix("/v1")
    try:
        url = f"{root}/openapi.json"
        reply = within_deadline(
            lambda: client._client.get(url, timeout=PROBE_TIMEOUT_S), PROBE_TIMEOUT_S
        )
        if reply.status_code != 200:
            return {}
        schema = reply.json()
        chat = next(v for k, v in schema["paths"].items() if k.endswith("/chat/completions"))
        body = chat["post"]["requestBody"]["content"]["application/json"]["schema"]
        name = body["$ref"].rsplit("/", 1)[-1]  # "#/components/schemas/<request>"
        declared = schema["components"]["schemas"][name]["properties"]
        return {
            name: neutral
            for name, neutral in NEUTRAL_PENALTIES.items()
            if isinstance(declared.get(name), dict)
            and isinstance(declared[name].get("default"), (int, float))
            and declared[name]["default"] != neutral
        }
    except Exception:  # no schema, another shape, a slow or odd server: nothing to neutralize
        return {}


class _RefusedParameter(Exception):
    """A 400 naming a parameter the client can adapt (`refused_parameter`)."""

    def __init__(self, param: str, error: Exception) -> None:
        super().__init__(param)
        self.param, self.error = param, error


def refused_parameter(error: Exception, sent: dict) -> str | None:
    """The parameter a 400 says the endpoint does not support, among those fincheck can do
    without or rename: max_tokens (OpenAI's reasoning models want max_completion_tokens),
    logprobs/top_logprobs (answers are then scored from their text), temperature (models that
    only sample). Read from the error's `param` field (OpenAI's API) or its message (vLLM,
    llama.cpp and others name the field in the text); None for any other refusal."""
    named = getattr(error, "param", None)
    message = str(getattr(error, "message", error)).lower()
    refusal = any(
        w in message for w in ("unsupported", "not supported", "not allowed", "greater than")
    )
    for param in ("max_tokens", "top_logprobs", "logprobs", "temperature"):
        if param in sent and (named == param or (refusal and param in message)):
            return "logprobs" if param == "top_logprobs" else param
    return None


def hit_budget(choice, response, max_tokens: int | None) -> bool | None:
    """Whether an endpoint's answer was cut at the token budget: finish_reason "length", unless
    the reported usage shows fewer completion tokens than were allowed (a server that says
    "length" for every answer). None when the endpoint gives no finish_reason."""
    reason = getattr(choice, "finish_reason", None)
    if reason is None:
        return None
    if reason != "length":
        return False
    used = getattr(getattr(response, "usage", None), "completion_tokens", None)
    return not (isinstance(used, int) and isinstance(max_tokens, int) and used < max_tokens)


class TransformersChatClient(ChatClient):
    """A local causal LM through the project's one inference path: chat template, the prompt
    fitted to the model's window by trimming its grounding text (when the caller says where it
    is), explicit greedy decoding (not the model's shipped sampling or repetition penalty).

    Calls arrive from several example threads at once; a worker thread gathers what is waiting
    (up to `batch_size`, same kind of call) and runs it as one batch, so a method written one
    example at a time still feeds the model full batches."""

    reads_p_yes = True

    def __init__(
        self,
        model_path: str,
        max_new_tokens: int = 512,
        device: str | None = None,
        batch_size: int = 8,
        window: int | None = None,
        dtype: str = "auto",
    ):
        self.loaded = load_model(
            model_path, None, LoadOptions(dtype=dtype, device=device, window=window)
        )
        self.max_new_tokens = max_new_tokens
        self.batch_size = batch_size
        self.identity = {"backend": "transformers", "model": str(model_path)}
        if dtype != "auto":  # other weights, other answers: a cache keyed by identity tells them
            self.identity["dtype"] = dtype
        # the model by its content, not its path: another model at the same path (a folder
        # replaced, a name fetched again) is another identity, for the cache and for a rerun
        if content := model_content(model_path):
            self.identity["content"] = content[:16]
        # A fast tokenizer's padding state is shared: the worker's padded batches and the
        # callers' token counts must not interleave.
        self._tokenizer_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- the ChatClient interface: called from any thread ----------------------------------

    def complete(
        self, messages: list[dict[str, str]], sampling: dict, span: Sequence[int] | None = None
    ) -> Completion:
        max_new = min(int(sampling.get("max_tokens", self.max_new_tokens)), self.max_new_tokens)
        return self._submit((max_new, None), self._prompt(messages, span, max_new))

    def p_yes(
        self,
        messages: list[dict[str, str]],
        span: Sequence[int] | None = None,
        share: FirstWordShare = YES_NO,
    ) -> float | None:
        return self._submit((8, share), self._prompt(messages, span, 8))

    # -- internals ---------------------------------------------------------------------------

    def _prompt(self, messages, span, max_new: int) -> str:
        try:
            with self._tokenizer_lock:
                fit = self.loaded.fit_for_answer(messages, span, max_new, remedy=LOCAL_REMEDY)
        except PromptDoesNotFit as error:  # this example fails, the others go on
            raise LLMCallError(str(error)) from None
        self.trimmed += fit.trimmed
        return fit.text

    def _submit(self, kind: tuple, prompt: str):  # kind: (answer budget, share or None)
        with self._start_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, daemon=True)
                self._worker.start()
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((kind, prompt, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            time.sleep(0.01)  # let the other example threads' calls arrive
            # this thread is the queue's only reader: a call it sees waiting is still there
            while len(batch) < self.batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for kind in dict.fromkeys(item[0] for item in batch):
                group = [item for item in batch if item[0] == kind]
                prompts, (budget, share) = [item[1] for item in group], kind
                model, tokenizer = self.loaded.model, self.loaded.tokenizer
                try:
                    with self._tokenizer_lock:  # prompts over one document share its prefix
                        answers = answer_in_order(model, tokenizer, prompts, budget, share=share)
                    texts = [*map(Completion, answers.texts, answers.cut)]
                    values = answers.p_yes if share else texts
                except Exception as error:  # every waiting caller hears of it
                    for item in group:
                        item[2].set_exception(error)
                    continue
                for item, value in zip(group, values, strict=True):
                    item[2].set_result(value)
