"""The FINAL judge against a fake OpenAI-compatible server on loopback (real HTTP)."""

from __future__ import annotations

import gzip
import json
import re
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from fake_judge_server import FakeJudgeServer

from fincheck.errors import FincheckError
from fincheck.inference.llm import RequestCache
from fincheck.models.llm_clients import OpenAIChatClient
from fincheck.tasks.final.judge import JudgePrompt, MatchingJudge, parse_matching
from fincheck.tasks.final.metrics import FinalItem, final_figures, true_positives

SENTINEL_KEY = "sk-test-SENTINEL-never-written-0123456789"


@pytest.fixture
def server():
    with FakeJudgeServer() as srv:
        yield srv


@pytest.fixture
def make_judge(server, tmp_path, monkeypatch):
    monkeypatch.setenv("FINCHECK_TEST_JUDGE_KEY", SENTINEL_KEY)

    def build(timeout_s: float = 5.0, max_retries: int = 2) -> MatchingJudge:
        client = OpenAIChatClient(
            model="fake-judge",
            base_url=server.base_url,
            api_key_env="FINCHECK_TEST_JUDGE_KEY",
            timeout_s=timeout_s,
            max_retries=max_retries,
        )
        return MatchingJudge(client, RequestCache(tmp_path / "judge_cache.jsonl"))

    return build


def test_paper_matching_example_gives_two_thirds(server, make_judge, data_dir):
    fixture_path = data_dir / "final" / "judge_example.json"
    example = json.loads(fixture_path.read_text())
    predicted = list(example["predicted"].values())
    gold = list(example["gold"].values())
    # the judge answers the way the paper printed it (Python's None, prose around it)
    server.script[example["summary"]] = [
        (
            "ok",
            'Step by step... A is about the north, B is an omission.\n{"A" : "C", "B" : None , "C" : "B" }',
        )
    ]
    result = make_judge().match(example["summary"], predicted, gold)
    assert result.status == "ok"
    assert result.matching == example["expected_matching"]
    item = FinalItem(len(predicted), len(gold), true_positives(result.matching))
    figures = final_figures([item])
    assert figures["precision"] == pytest.approx(example["expected"]["precision"])
    assert figures["recall"] == pytest.approx(example["expected"]["recall"])
    assert server.auth_headers == [f"Bearer {SENTINEL_KEY}"]
    # the key is sent to the endpoint but never written to the cache; the cache keeps what the
    # endpoint said it served with each answer (a rerun must not mix two judges)
    cache_text = (Path(make_judge().cache.path)).read_text()
    assert SENTINEL_KEY not in cache_text
    assert {json.loads(line)["served"] for line in cache_text.splitlines()} == {"fake-judge"}


def test_429_retry_after_is_honoured(server, make_judge):
    server.script["S-429"] = [("status", 429, {"Retry-After": "1"}), ("ok", '{"A": "A"}')]
    start = time.monotonic()
    result = make_judge().match("S-429", ["p"], ["g"])
    elapsed = time.monotonic() - start
    assert result.status == "ok" and result.matching == {"A": "A"}
    assert server.calls_for("S-429") == 2
    assert elapsed >= 0.9  # the client waited the server's 1 s, not its 0.5 s default backoff


def test_500s_are_retried_then_succeed(server, make_judge):
    server.script["S-500"] = [
        ("status", 500, {"retry-after-ms": "20"}),
        ("status", 503, {"retry-after-ms": "20"}),
        ("ok", '{"A": null, "B": "A"}'),
    ]
    result = make_judge().match("S-500", ["p1", "p2"], ["g"])
    assert result.status == "ok" and result.matching == {"A": None, "B": "A"}
    assert server.calls_for("S-500") == 3


def test_exhausted_retries_are_an_error_not_a_score(server, make_judge):
    server.script["S-down"] = [("status", 500, {"retry-after-ms": "10"})]
    judge = make_judge(max_retries=2)
    result = judge.match("S-down", ["p"], ["g"])
    assert result.status == "error" and result.matching is None
    assert "InternalServerError" in result.error
    assert server.calls_for("S-down") == 3  # first try + 2 retries
    # a failed call is not cached: the next run asks again
    server.script["S-down"] = [("ok", '{"A": "A"}')]
    assert make_judge().match("S-down", ["p"], ["g"]).status == "ok"


def test_a_malformed_reply_is_asked_again_like_a_transient_error(server, make_judge):
    """A 200 whose body is broken JSON is retried as a 500 would be (a proxy that cut the
    body); once retries are spent the call fails, and nothing is cached: a rerun asks again."""
    server.script["S-torn"] = [("raw", '{"id": "c", "choi', "always"), ("ok", '{"A": "A"}')]
    assert make_judge(max_retries=2).match("S-torn", ["p"], ["g"]).status == "ok"
    assert server.calls_for("S-torn") == 2
    server.script["S-cut"] = [("raw", '{"id": "c", "choi', "always")]
    result = make_judge(max_retries=2).match("S-cut", ["p"], ["g"])
    assert result.status == "error" and "a reply that is not JSON" in result.error
    assert server.calls_for("S-cut") == 3  # first try + 2 retries
    server.script["S-cut"] = [("ok", '{"A": "A"}')]
    assert make_judge().match("S-cut", ["p"], ["g"]).status == "ok"


def test_timeout_is_retried(server, make_judge):
    server.script["S-slow"] = [("sleep", 3.0, '{"A": "A"}'), ("ok", '{"A": null}')]
    result = make_judge(timeout_s=0.5).match("S-slow", ["p"], ["g"])
    assert result.status == "ok" and result.matching == {"A": None}


def test_malformed_answer_gets_one_reask(server, make_judge):
    server.script["S-bad"] = [("ok", "A matches C, I think."), ("ok", '```json\n{"A": "B"}\n```')]
    result = make_judge().match("S-bad", ["p"], ["g1", "g2"])
    assert result.status == "ok" and result.matching == {"A": "B"}
    assert len(result.raw) == 2
    reask = server.requests[-1]["messages"]
    assert reask[-2] == {"role": "assistant", "content": "A matches C, I think."}
    assert "could not be used" in reask[-1]["content"]


def test_malformed_twice_is_parse_failed_with_raw_text(server, make_judge):
    server.script["S-worse"] = [("ok", '{"A": "Z"}')]  # Z is not a gold letter
    result = make_judge().match("S-worse", ["p"], ["g"])
    assert result.status == "parse_failed"
    assert result.raw == ['{"A": "Z"}', '{"A": "Z"}']
    assert "not a reference letter" in result.error


def test_rerun_hits_the_cache_and_makes_zero_calls(server, make_judge):
    server.script["S-one"] = [("ok", '{"A": "A"}')]
    server.script["S-two"] = [("ok", "nonsense"), ("ok", '{"A": null, "B": "A"}')]
    requests = [("S-one", ["p"], ["g"]), ("S-two", ["p1", "p2"], ["g"]), ("S-none", [], ["g"])]
    first = make_judge().match_many(requests, concurrency=2, progress=False)
    n_calls = len(server.requests)
    assert n_calls == 3  # S-one once, S-two twice (re-ask), S-none never
    rerun_judge = make_judge()
    second = rerun_judge.match_many(requests, concurrency=2, progress=False)
    assert len(server.requests) == n_calls
    assert [r.matching for r in second] == [r.matching for r in first]
    assert rerun_judge.cache.hits == 3 and sum(r.calls for r in second) == 0
    assert first[2].status == "skipped" and first[2].matching == {}


def test_concurrency_limit_is_respected(server, make_judge):
    requests = []
    for i in range(6):
        server.script[f"S-par-{i}"] = [("sleep", 0.2, '{"A": "A"}')]
        requests.append((f"S-par-{i}", ["p"], ["g"]))
    results = make_judge().match_many(requests, concurrency=2, progress=False)
    assert all(r.status == "ok" for r in results)
    assert server.max_in_flight == 2


def test_cache_survives_a_torn_last_line(tmp_path):
    path = tmp_path / "cache.jsonl"
    first = RequestCache(path)
    first.put("k1", "answer one")
    with path.open("a") as f:
        f.write('{"key": "k2", "respo')  # killed mid-write
    second = RequestCache(path)
    assert second.get("k1") == "answer one" and second.get("k2") is None
    second.put("k3", "answer three")
    third = RequestCache(path)
    assert third.get("k1") == "answer one" and third.get("k3") == "answer three"


@pytest.mark.parametrize("response", [5, ["a"], {"a": 1}, None])
def test_a_cache_record_of_another_shape_is_a_damaged_line(tmp_path, response):
    """A cached answer that is no text (an edited cache) is skipped like a torn line (the call
    is made again), never handed to a reader that expects text."""
    path = tmp_path / "cache.jsonl"
    RequestCache(path).put("k1", "answer one")
    with path.open("a") as f:
        f.write(json.dumps({"key": "k2", "response": response}) + "\n")
    with path.open("ab") as f:  # a byte damaged since: no UTF-8, never a replaced answer
        f.write(b'{"key": "k3", "response": "caf\xe9"}\n')
    cache = RequestCache(path)
    assert cache.get("k1") == "answer one" and cache.get("k2") is None and cache.get("k3") is None


@pytest.mark.parametrize("cached", ["abc", "nan", "inf", "1.5", "-0.1"])
def test_a_cached_p_yes_that_is_no_share_is_one_line(tmp_path, cached):
    """A P(Yes) read back from an edited or damaged cache must be a share in [0, 1]: a NaN or
    a word would otherwise become a score (or a traceback)."""
    from fincheck.inference.llm import CachedLLM
    from fincheck.models.llm_clients import OpenAIChatClient

    client = OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1")
    cache = RequestCache(tmp_path / "cache.jsonl")
    messages = [{"role": "user", "content": "Supported? Yes or No"}]
    key = RequestCache.key(client.identity, "v1", messages, {"read": "p_yes"})
    cache.put(key, cached)
    with pytest.raises(FincheckError, match=r"cache\.jsonl: a cached P\(Yes\) of .*not a share"):
        CachedLLM(client, RequestCache(tmp_path / "cache.jsonl"), {}).p_yes(messages, "v1")


def test_cache_remembers_which_answers_were_cut(tmp_path):
    path = tmp_path / "cache.jsonl"
    first = RequestCache(path)
    first.put("k1", "1. The summary says", cut=True)
    first.put("k2", "None", cut=False)
    first.put("k3", "None")  # a client that cannot tell
    again = RequestCache(path)
    assert (again.cut("k1"), again.cut("k2"), again.cut("k3")) == (True, False, None)


def test_an_endpoint_answer_is_cut_when_it_used_its_budget():
    """finish_reason "length" means cut, unless the usage shows fewer tokens than allowed (a
    server that says "length" for every answer)."""
    from types import SimpleNamespace as NS

    from fincheck.models.llm_clients import hit_budget

    def reply(reason, used=None):
        usage = NS(completion_tokens=used) if used is not None else None
        return NS(finish_reason=reason), NS(usage=usage)

    assert hit_budget(*reply("length", 512), 512) is True
    assert hit_budget(*reply("length"), 512) is True  # no usage: trust the reason
    assert hit_budget(*reply("length", 37), 512) is False
    assert hit_budget(*reply("stop", 512), 512) is False
    assert hit_budget(*reply(None), 512) is None


def test_cache_key_covers_model_prompt_and_sampling():
    messages = [{"role": "user", "content": "x"}]
    base = RequestCache.key({"model": "m"}, "v1", messages, {"temperature": 0})
    assert base != RequestCache.key({"model": "m2"}, "v1", messages, {"temperature": 0})
    assert base != RequestCache.key({"model": "m"}, "v2", messages, {"temperature": 0})
    assert base != RequestCache.key({"model": "m"}, "v1", messages, {"temperature": 1})
    assert base == RequestCache.key({"model": "m"}, "v1", list(messages), {"temperature": 0})


def test_wrong_key_stops_the_run(server, make_judge):
    server.script["S-auth"] = [("status", 401, {})]
    with pytest.raises(FincheckError, match="refused the API key"):
        make_judge().match("S-auth", ["p"], ["g"])


def test_wrong_key_cancels_the_queued_calls(server, make_judge):
    requests = []
    for i in range(20):
        server.script[f"S-auth-{i}"] = [("status", 401, {})]
        requests.append((f"S-auth-{i}", ["p"], ["g"]))
    with pytest.raises(FincheckError, match="refused the API key"):
        make_judge().match_many(requests, concurrency=2, progress=False)
    assert len(server.requests) < 20


def test_unreachable_endpoint_stops_the_run(monkeypatch, tmp_path):
    import socket

    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("FINCHECK_TEST_JUDGE_KEY", "k")
    client = OpenAIChatClient(
        "m",
        f"http://127.0.0.1:{port}/v1",
        "FINCHECK_TEST_JUDGE_KEY",
        timeout_s=1,
        max_retries=0,
        max_consecutive_unreachable=3,
    )
    judge = MatchingJudge(client, RequestCache(tmp_path / "cache.jsonl"))
    assert judge.match("S", ["p"], ["g"]).status == "error"  # one failure is an error...
    with pytest.raises(FincheckError, match="is unreachable"):  # ...several in a row stop the run
        judge.match_many([("S", ["p"], ["g"])] * 10, concurrency=1, progress=False)


@pytest.mark.parametrize("status", [429, 503])
def test_429s_and_5xxs_in_a_row_stop_the_run(status, server, make_judge):
    """An overloaded or broken endpoint (429/5xx after every retry) trips a breaker as an
    unreachable one does: a few calls in a row, then one line, not a failure per example."""
    for i in range(8):
        server.script[f"S-busy-{i}"] = [("status", status, {"retry-after-ms": "1"})]
    judge = make_judge(max_retries=0)
    assert judge.match("S-busy-0", ["p"], ["g"]).status == "error"  # one failure is an error
    requests = [(f"S-busy-{i}", ["p"], ["g"]) for i in range(1, 8)]
    with pytest.raises(FincheckError, match=rf"answered HTTP {status} to 5 calls in a row"):
        judge.match_many(requests, concurrency=1, progress=False)
    assert server.calls_for("S-busy-7") == 0  # stopped before the last requests


def test_one_deadline_covers_a_call_s_re_asks_and_backoff(monkeypatch, tmp_path):
    """A reply that comes back malformed is asked again, but within the call's one deadline:
    five slow malformed replies and their backoff (about 9 s) are cut at the deadline (1 s)."""
    monkeypatch.setenv("FINCHECK_TEST_JUDGE_KEY", "k")
    client = OpenAIChatClient(
        "m", "http://127.0.0.1:9/v1", "FINCHECK_TEST_JUDGE_KEY", timeout_s=1, max_retries=4
    )
    client.deadline_s = 1.0

    def slow_and_malformed(**_):
        time.sleep(0.4)
        return type("Reply", (), {"choices": []})()

    monkeypatch.setattr(client._client.chat.completions, "create", slow_and_malformed)
    judge = MatchingJudge(client, RequestCache(tmp_path / "cache.jsonl"))
    start = time.monotonic()
    result = judge.match("S", ["p"], ["g"])
    assert result.status == "error" and time.monotonic() - start < 2.0


def test_a_call_abandoned_at_its_deadline_sends_nothing_more(monkeypatch):
    """The openai client retries inside the call's thread, which the deadline abandons but
    cannot stop: its next attempts are not sent (each request asks whether its call's deadline
    has passed), so a server that holds its replies gets no more requests than were in time."""
    from fincheck.inference.llm import LLMCallError

    monkeypatch.setenv("FINCHECK_TEST_JUDGE_KEY", "k")
    with FakeJudgeServer() as server:
        server.script = {"": [("sleep", 1, "late")]}  # each attempt's read times out at 0.3 s
        client = OpenAIChatClient(
            "m", server.base_url, "FINCHECK_TEST_JUDGE_KEY", timeout_s=0.3, max_retries=8
        )
        client.deadline_s = 0.5
        with pytest.raises(LLMCallError, match=r"no complete answer within 0\.5 s"):
            client.complete([{"role": "user", "content": "hi"}], {"max_tokens": 4})
        in_time = len(server.requests)
        time.sleep(2)  # the abandoned thread's retries, had they been sent (backoff 0.4-1 s)
        assert len(server.requests) == in_time == 1


def test_parse_matching_validation():
    assert parse_matching('{"a": "c", "B": "None"}', ["A", "B"], ["A", "B", "C"]) == {
        "A": "C",
        "B": None,
    }
    for bad in ("no json", '{"A": "A"}', '{"A": "A", "B": "A", "C": null}', "{A: B}"):
        with pytest.raises(ValueError):
            parse_matching(bad, ["A", "B"], ["A"])


def test_prompt_file_fills_lettered_lists():
    prompt = JudgePrompt.load()
    messages = prompt.messages("The summary {gold}.", ["p one", "p two"], ["g one"])
    user = messages[1]["content"]
    assert "A. p one\nB. p two" in user and "A. g one" in user
    assert "The summary {gold}." in user  # braces in inputs are left alone
    assert len(prompt.version) == 12


def test_a_failed_p_yes_call_fails_the_example_and_is_not_cached(tmp_path):
    """Only a reply without logprobs means "no P(Yes)"; a call that failed for good raises, is
    not cached as "none", and a rerun asks again."""
    from fincheck.inference.llm import CachedLLM, LLMCallError
    from fincheck.models.llm_clients import OpenAIChatClient

    client = OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1")
    calls = []

    def failing(messages, sampling):
        calls.append(1)
        raise LLMCallError("HTTP 503 after retries")

    client._create = failing
    cache = RequestCache(tmp_path / "cache.jsonl")
    llm = CachedLLM(client, cache, {"temperature": 0.0})
    messages = [{"role": "user", "content": "Supported? Yes or No"}]
    with pytest.raises(LLMCallError):
        llm.p_yes(messages, "v1")
    with pytest.raises(LLMCallError):
        CachedLLM(client, RequestCache(tmp_path / "cache.jsonl"), {}).p_yes(messages, "v1")
    assert len(calls) == 2  # asked again: nothing was cached

    from types import SimpleNamespace as NS

    client._create = lambda messages, sampling: NS(choices=[NS(logprobs=None)])
    assert llm.p_yes(messages, "v1") is None  # a reply without logprobs: cached as such


def test_an_endpoint_without_logprobs_is_said_once(capsys):
    from types import SimpleNamespace as NS

    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    client = OpenAIChatClient("m", base_url="http://127.0.0.1:9/v1", caller=METHOD)
    client._create = lambda messages, sampling: NS(choices=[NS(logprobs=None)])
    messages = [{"role": "user", "content": "Supported? Yes or No"}]
    assert client.p_yes(messages) is None and client.p_yes(messages) is None
    err = capsys.readouterr().err
    assert err.count("returns no logprobs") == 1 and "scored from the answers' text" in err


@pytest.mark.parametrize(
    "param, error, sent_instead, line",
    [
        # OpenAI's reasoning models: the field named in `param`
        ("max_tokens",
         {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
          "Use 'max_completion_tokens' instead.", "param": "max_tokens"},
         "max_completion_tokens", "refuses max_tokens"),
        ("temperature",
         {"message": "Unsupported value: 'temperature' does not support 0.0 with this model.",
          "param": "temperature"},
         None, "answers are sampled at its default temperature"),
        # vLLM started with a small --max-logprobs: the field only in the message
        ("top_logprobs",
         {"message": "Requested sample logprobs of 20, which is greater than max allowed: 5"},
         None, "refuses logprobs as asked"),
    ],
)  # fmt: skip
def test_a_parameter_the_endpoint_refuses_is_adapted_once_and_said_in_one_line(
    param, error, sent_instead, line, capsys
):
    """Not ten refused calls and a stop, nor a silent change: the run goes on without (or with
    the renamed) parameter, and one line says what changed."""
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.script = {"": [("refuse", param, error, "Yes")]}
        client = OpenAIChatClient("m", base_url=server.base_url, max_retries=0, caller=METHOD)
        messages = [{"role": "user", "content": "Supported? Yes or No"}]
        for _ in range(3):
            if param == "top_logprobs":
                assert client.p_yes(messages) is None  # scored from the text
            else:
                answer = client.complete(messages, {"temperature": 0.0, "max_tokens": 8})
                assert answer.text == "Yes"
    refused = [r for r in server.requests if param in r]
    assert len(refused) == 1  # asked once with it, never again
    if sent_instead:
        assert all(r[sent_instead] == 8 for r in server.requests if r not in refused)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err


def test_a_refusal_naming_no_parameter_it_can_adapt_still_fails_the_call():
    from fincheck.inference.llm import LLMCallError
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.script = {"": [("refuse", "messages", {"message": "stop is not supported"}, "x")]}
        client = OpenAIChatClient("m", base_url=server.base_url, max_retries=0, caller=METHOD)
        with pytest.raises(LLMCallError, match="stop is not supported"):
            client.complete([{"role": "user", "content": "hi"}], {"max_tokens": 8})
    assert len(server.requests) == 1


def test_a_server_that_drips_its_answer_is_stopped_by_the_calls_deadline(server, make_judge):
    """A byte every 0.2 s keeps every socket read under --timeout; the call as a whole has a
    deadline (each attempt's timeout and the backoff between them): the example fails as one
    judge error and the judge goes on, where before it waited for ever."""
    server.script["S-drip"] = [("drip", 0.2)]
    judge = make_judge(timeout_s=1.0, max_retries=0)
    start = time.monotonic()
    result = judge.match("S-drip", ["p"], ["g"])
    assert time.monotonic() - start < 5  # the 1 s deadline, not the drip's endless minutes
    assert result.status == "error" and "no complete answer within 1 s" in result.error


JUDGE_CALLS = """
import time
from fincheck.inference.llm import ChatClient, RequestCache
from fincheck.tasks.final.judge import MatchingJudge

class Slow(ChatClient):
    identity = {"backend": "slow"}
    def complete(self, messages, sampling, span=None):
        time.sleep(600)

print("started", flush=True)
MatchingJudge(Slow(), RequestCache(None)).match_many([("S", ["p"], ["g"])] * 8, 4, False)
"""
ENDPOINT_CALLS = """
import time, types
from fincheck.inference.llm import run_concurrently
items = [types.SimpleNamespace(id=str(i)) for i in range(8)]
print("started", flush=True)
run_concurrently(items, lambda item: time.sleep(600), 4, lambda *a: None, False, "x")
"""


@pytest.mark.parametrize("calls", [ENDPOINT_CALLS, JUDGE_CALLS], ids=["endpoint", "judge"])
def test_ctrl_c_while_calls_are_in_flight_exits_at_once(calls, tmp_path):
    """Ctrl-C with LLM calls in flight, an answerer's or score's judge's: the command ends
    within a couple of seconds, the calls in flight abandoned, not joined (a thread pool's
    workers were, for as long as the slowest call took: 76 s for the judge)."""
    import signal
    import subprocess
    import sys

    script = tmp_path / "calls.py"
    script.write_text(calls)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        # as from a terminal: a suite run as a shell's background job (`make test &`) starts
        # with SIGINT ignored, and its children would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.monotonic() - start < 5 and proc.returncode != 0


def test_a_hand_matched_set_measures_the_judge_by_match_precision_and_recall(tmp_path):
    """By hand: two items matched by hand with 3 pairs between them; a judge that finds two of
    them and one pair the hand matching does not have has match precision 2/3 and recall 2/3.
    A set whose expected matching names a letter the lists do not have is one clear line."""
    from fincheck.tasks.final.judge_sanity import judge_agreement

    hand = tmp_path / "hand.jsonl"
    items = [
        {
            "id": "a",
            "summary": "s1",
            "predicted": ["p1", "p2"],
            "gold": ["g1", "g2"],
            "expected": {"A": "A", "B": "B"},
        },
        {
            "id": "b",
            "summary": "s2",
            "predicted": ["q1", "q2"],
            "gold": ["h1"],
            "expected": {"A": "A", "B": None},
        },
    ]
    hand.write_text("".join(json.dumps(i) + "\n" for i in items))
    answers = {"s1": {"A": "A", "B": None}, "s2": {"A": "A", "B": "A"}}

    class Judge:
        def match_many(self, requests, concurrency=8, progress=True):
            return [SimpleNamespace(status="ok", matching=answers[r[0]]) for r in requests]

    got = judge_agreement(Judge(), path=hand)
    assert (got["set"], got["items"], got["n"], got["agreed"]) == ("hand.jsonl", 2, 4, 2)
    assert got["match_precision"] == pytest.approx(2 / 3)
    assert got["match_recall"] == pytest.approx(2 / 3)
    items[1]["expected"] = {"A": "B", "B": None}  # there is no gold B
    hand.write_text("".join(json.dumps(i) + "\n" for i in items))
    with pytest.raises(FincheckError, match=r"hand.jsonl:2: expected: .* not \['B'\]"):
        judge_agreement(Judge(), path=hand)


def test_the_direct_judge_prompt_keeps_the_papers_criteria_and_asks_for_json_alone():
    """The direct variant differs from the paper-following prompt only in its last paragraph
    (the JSON object alone, no step-by-step reasoning), and a report scored with it says so."""
    from fincheck.tasks.final.judge import JUDGE_PROMPTS, JUDGE_VARIANTS

    def criteria(name):
        text = JUDGE_PROMPTS[name].read_text(encoding="utf-8")
        body = text[text.index("\n[system]\n") :]  # the comment lines name it too
        return body[: body.index("How to match:")], body[body.index("How to match:") :]

    (head_paper, rules_paper), (head_direct, rules_direct) = criteria("paper"), criteria("direct")
    assert head_paper == head_direct
    paper_rules = rules_paper.split("\n\n")
    direct_rules = rules_direct.split("\n\n")
    assert paper_rules[0] == direct_rules[0] and len(paper_rules) == len(direct_rules) == 2
    assert "step by step" in paper_rules[1] and "step by step" not in direct_rules[1]
    assert "JSON object only, with no explanation" in direct_rules[1]
    messages = JudgePrompt.named("direct").messages("S.", ["p"], ["g"])
    assert "Detector descriptions:\nA. p" in messages[-1]["content"]
    assert "not the FINAL paper's protocol" in JUDGE_VARIANTS["direct"]


def gzip_bomb(inflated_mib: int) -> bytes:
    """A JSON reply's start and then spaces, `inflated_mib` MiB once inflated, gzipped a
    thousandfold (built a MiB at a time: the test never holds the inflated bytes)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [packer.compress(b'{"choices": [')]
    parts += [packer.compress(b" " * 2**20) for _ in range(inflated_mib)]
    return b"".join([*parts, packer.flush()])


def completion(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }


@pytest.mark.parametrize(
    ("body", "headers", "said"),
    [
        # 512 MiB of spaces gzipped to about half a MiB
        (gzip_bomb(512), {"Content-Encoding": "gzip"}, "inflates to more than 16,777,216 bytes"),
        (b'{"choices": ["' + b"x" * 20 * 2**20 + b'"]}', {}, "a reply of more than 16,777,216"),
        (b"{}", {"Content-Encoding": "br"}, "in the 'br' encoding, which was not asked for"),
        # small, but deeper than the openai client's JSON reader goes (a RecursionError)
        (b'{"choices": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", {}, "nested too deep"),
        # deflate without its zlib header, and a body that is no gzip at all
        (zlib.compress(b"{}")[2:-4], {"Content-Encoding": "deflate"}, "does not inflate"),
        (b"not gzip" * 100, {"Content-Encoding": "gzip"}, "does not inflate"),
        (gzip.compress(b'{"choices": []}')[:-12], {"Content-Encoding": "gzip"}, "cut short"),
    ],
    ids=["gzip-bomb", "huge", "unasked-encoding", "nested", "raw-deflate", "broken-gzip", "cut"],
)
def test_a_reply_too_large_as_sent_or_inflated_is_not_read(body, headers, said):
    """Replies cost bounded memory: a body past 16 MiB as sent, or once inflated, is not read
    (the call fails as a malformed reply does), and an encoding the client did not ask for is
    refused; a gzipped reply of normal size is read."""
    import tracemalloc

    from fincheck.inference.llm import LLMCallError
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.script = {
            "bomb": [("raw", body, "always", headers)],
            "fine": [
                (
                    "raw",
                    gzip.compress(json.dumps(completion("Yes")).encode()),
                    "always",
                    {"Content-Encoding": "gzip"},
                )
            ],
        }
        client = OpenAIChatClient("m", base_url=server.base_url, max_retries=0, caller=METHOD)
        tracemalloc.start()
        with pytest.raises(LLMCallError, match=re.escape(said)):
            client.complete([{"role": "user", "content": "bomb"}], {"max_tokens": 8})
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 200 * 2**20  # the cap and its copies, never the gigabyte
        assert server.calls_for("bomb") == 1  # not asked again by the openai client's retries
        answer = client.complete([{"role": "user", "content": "fine"}], {"max_tokens": 8})
        assert answer.text == "Yes"
        # a gzip stream of two members (valid gzip: the second is read too)
        body = json.dumps(completion("Yes, two members")).encode()
        members = gzip.compress(body[:20]) + gzip.compress(body[20:])
        server.script["two"] = [("raw", members, "always", {"Content-Encoding": "gzip"})]
        answer = client.complete([{"role": "user", "content": "two"}], {"max_tokens": 8})
        assert answer.text == "Yes, two members"


def test_an_answer_echoing_the_held_key_is_redacted_before_it_is_written(monkeypatch, tmp_path):
    """An endpoint (or a proxy) that echoes the API key in its answer, or in the name of the
    model it says served it: what fincheck keeps (predictions, caches, traces, the served
    models) carries it redacted."""
    from fincheck.inference.llm import RequestCache
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    monkeypatch.setenv("ECHO_TEST_KEY", "echoed-key-5566778899")
    with FakeJudgeServer() as server:
        # the model name the reply says served it is the endpoint's to fill in too
        served = {**completion("Yes."), "model": "served-by-echoed-key-5566778899"}
        server.script = {
            "name": [("raw", json.dumps(served), "always")],
            "": [("ok", "Yes. (auth: echoed-key-5566778899)")],
        }

        def client() -> OpenAIChatClient:  # (one client takes one served model)
            return OpenAIChatClient(
                "m", base_url=server.base_url, api_key_env="ECHO_TEST_KEY", max_retries=0,
                caller=METHOD,
            )  # fmt: skip

        answer = client().complete([{"role": "user", "content": "hi"}], {"max_tokens": 8})
        naming = client()
        named = naming.complete([{"role": "user", "content": "name"}], {"max_tokens": 8})
    assert answer.text == "Yes. (auth: <redacted>)"
    assert named.served == "served-by-<redacted>" and named.served in naming.served_models
    from fincheck.inference.llm import LLMCallError

    # an endpoint's error body quoting the key: the failure recorded beside the example
    assert "5566778899" not in str(LLMCallError("HTTP 400: bad key echoed-key-5566778899"))
    # ... past the 300 characters a library error's words are cut to, and spread over lines:
    # redacted before they are cut or made one line, so no part of the key is left
    from fincheck.io.messages import library_errors_as_one_line, one_line

    words = "invalid request:\n" + "x" * 270 + " echoed-key-5566778899 was refused"
    with pytest.raises(FincheckError) as refused, library_errors_as_one_line("base", "fix it"):
        raise ValueError(words)
    for line in (str(refused.value), one_line(ValueError(words))):
        assert "echoed-key" not in line and "<redacted>" in line
    from fincheck.io.jsonl import record_json  # every record fincheck writes (a trace's too)

    assert record_json({"trace": ["echoed-key-5566778899"], "x": float("nan")}) == (
        '{"trace": ["<redacted>"], "x": null}'
    )
    cache = RequestCache(tmp_path / "cache.jsonl")  # and what a cache is given: written redacted
    cache.put("k", "echoed-key-5566778899", served="echoed-key-5566778899")
    assert "5566778899" not in (tmp_path / "cache.jsonl").read_text()


def test_judge_answers_from_two_served_models_are_never_mixed(server, make_judge, tmp_path):
    """What the judge endpoint said it served is kept with each cached answer: a rerun whose
    endpoint now serves another model, beside answers cached from the first, stops instead of
    scoring with two judges; the served model is named in the judge's identity."""
    server.script["S-one"] = [("ok", '{"A": "A"}')]
    first = make_judge()
    first.match_many([("S-one", ["p"], ["g"])], concurrency=1, progress=False)
    assert first.identity["served_models"] == ["fake-judge"]
    served_b = {**completion('{"A": "A"}'), "model": "judge-b"}
    server.script["S-two"] = [("raw", json.dumps(served_b), "always")]
    requests = [("S-one", ["p"], ["g"]), ("S-two", ["p"], ["g"])]
    cache = (tmp_path / "judge_cache.jsonl").read_text()
    with pytest.raises(
        FincheckError, match=r"answered as 'judge-b', but .* were answered by fake-judge"
    ):
        make_judge().match_many(requests, concurrency=1, progress=False)
    assert (tmp_path / "judge_cache.jsonl").read_text() == cache  # judge-b's answer not cached
    # another judge (another --judge-model) sharing the cache is pinned to its own answers'
    other = OpenAIChatClient(
        "other-judge", server.base_url, "FINCHECK_TEST_JUDGE_KEY", timeout_s=5, max_retries=2
    )
    result = MatchingJudge(other, RequestCache(tmp_path / "judge_cache.jsonl")).match_many(
        [("S-two", ["p"], ["g"])], concurrency=1, progress=False
    )
    assert result[0].served == "judge-b"


def _chat_schema(**defaults: float) -> dict:
    """An OpenAPI schema as FastAPI serves it: the chat endpoint's request body and its fields."""
    request = {"properties": {name: {"default": v} for name, v in defaults.items()}}
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Req"}}}}
    return {
        "paths": {"/v1/chat/completions": {"post": {"requestBody": body}}},
        "components": {"schemas": {"Req": request}},
    }


@pytest.mark.parametrize(
    ("schema", "sent"),
    [
        (_chat_schema(repeat_penalty=1.1, presence_penalty=0.0), {"repeat_penalty": 1.0}),
        (_chat_schema(repeat_penalty=1.0, frequency_penalty=0.0), {}),
        (None, {}),  # no schema: nothing is sent that the server might refuse
        ({**_chat_schema(), "components": {"schemas": {"Req": {"properties": [1]}}}}, {}),
    ],
)
def test_a_penalty_a_server_turns_on_by_default_is_sent_neutral(schema, sent):
    """llama-cpp-python's server declares repeat_penalty 1.1 as its default: at temperature 0
    its answers are then not the model's greedy ones. The client reads the schema once and sends
    such a penalty at its neutral value (in the request body, outside OpenAI's own names), and
    names it in its identity (another request cache); other servers get nothing more."""
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.openapi = schema
        server.script["hi"] = [("ok", "Yes")]
        client = OpenAIChatClient("m", base_url=server.base_url, caller=METHOD)
        client.complete([{"role": "user", "content": "hi"}], {"temperature": 0.0})
    assert client.neutral_sampling == sent
    assert {k: server.requests[-1][k] for k in sent} == sent
    assert (
        "repeat_penalty" in server.requests[-1]
        if sent
        else "repeat_penalty" not in server.requests[-1]
    )
    assert client.identity.get("neutral_sampling") == (sent or None)


def test_a_schema_dripped_byte_by_byte_costs_no_more_than_the_probe_s_time():
    """A server that sends its /openapi.json one byte a second answers each read in time: the
    probe's limit is on the whole reply, so the client starts after PROBE_TIMEOUT_S with no
    penalty to neutralize (before: as long as the server dripped)."""
    import time

    from fincheck.models.llm_clients import METHOD, PROBE_TIMEOUT_S, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.openapi = _chat_schema(repeat_penalty=1.1)
        server.openapi_drip_s = 1.0
        server.script["hi"] = [("ok", "Yes")]
        start = time.monotonic()
        client = OpenAIChatClient("m", base_url=server.base_url, caller=METHOD)
        client.complete([{"role": "user", "content": "hi"}], {"temperature": 0.0})
        took = time.monotonic() - start
    assert client.neutral_sampling == {} and took < PROBE_TIMEOUT_S + 10, took


def test_a_base_url_with_a_query_string_keeps_its_path():
    """An endpoint whose URL carries a query (Azure's `?api-version=`): every request goes to
    the URL's path plus the call's own (`/v1/chat/completions?api-version=7`), not after the
    query (`/v1?api-version=7chat/completions`); the identity keeps the query's key."""
    from fincheck.models.llm_clients import METHOD, OpenAIChatClient

    with FakeJudgeServer() as server:
        server.script["hi"] = [("ok", "Yes")]
        client = OpenAIChatClient("m", base_url=f"{server.base_url}?api-version=7", caller=METHOD)
        client.complete([{"role": "user", "content": "hi"}], {"temperature": 0.0})
    assert server.paths[-1].endswith("/chat/completions?api-version=7"), server.paths
    assert client.identity["base_url"].endswith("?api-version=<redacted>")


def test_a_url_s_user_and_password_never_replace_the_api_key(monkeypatch):
    """httpx sends a URL's userinfo as `Authorization: Basic`, in place of the key's Bearer
    token: with a key set, such a URL is one line naming both (the key never shown); with no
    key, the URL's credentials are the endpoint's (a server behind Basic authentication)."""
    import base64

    with FakeJudgeServer() as server:
        server.script = {"": [("ok", "Yes")]}
        url = server.base_url.replace("http://", "http://al:pw-secret-99@")
        monkeypatch.setenv("FINCHECK_TEST_JUDGE_KEY", SENTINEL_KEY)
        with pytest.raises(FincheckError, match="in place of the API key") as refused:
            OpenAIChatClient("m", base_url=url, api_key_env="FINCHECK_TEST_JUDGE_KEY")
        assert "pw-secret-99" not in str(refused.value) and SENTINEL_KEY not in str(refused.value)
        monkeypatch.setenv("OPENAI_BASE_URL", url)  # read by the openai client when none given
        with pytest.raises(FincheckError, match="in place of the API key"):
            OpenAIChatClient("m", api_key_env="FINCHECK_TEST_JUDGE_KEY")
        monkeypatch.delenv("OPENAI_BASE_URL")
        for cut in ("\t", "\n", " "):  # urlsplit drops tabs and newlines from what it parses
            tabbed = url.replace("pw-secret", f"pw{cut}-secret")
            with pytest.raises(FincheckError, match="a space or a control character") as refused:
                OpenAIChatClient("m", base_url=tabbed, api_key_env="FINCHECK_TEST_JUDGE_KEY")
            assert "secret" not in str(refused.value) and "\n" not in str(refused.value)
        host = server.base_url.removeprefix("http://")
        for bad in (  # forms URL readers disagree on: what is held would not be what is shown
            f"al:pw-secret-99@{host}",  # no scheme: no host part to find the password in
            f"http://al:pw/secret-99@{host}",  # a "/" in the password: a port of "pw"
            f"http://al:12/secret-99@{host}",  # ... or a valid port, and the rest a path
            f"http://al:pw#secret-99@{host}",
            f"ftp://al:pw-secret-99@{host}",
        ):
            with pytest.raises(FincheckError, match="its URL") as refused:
                OpenAIChatClient("m", base_url=bad, api_key_env="FINCHECK_TEST_JUDGE_KEY")
            assert "secret" not in str(refused.value), bad
        monkeypatch.delenv("FINCHECK_TEST_JUDGE_KEY")
        client = OpenAIChatClient("m", base_url=url, api_key_env="FINCHECK_TEST_JUDGE_KEY")
        client.complete([{"role": "user", "content": "hi"}], {"max_tokens": 8})
        assert server.auth_headers == ["Basic " + base64.b64encode(b"al:pw-secret-99").decode()]


def test_an_endpoint_url_that_is_refused_is_written_nowhere(tmp_path, capsys):
    """A served eval records its endpoint before it asks anything: a URL the client refuses
    (a "/" in its password, which a URL reader takes for the end of the host) is refused
    before any file is written, so no unheld piece of the password reaches a record."""
    from fincheck.commands.cli import main

    out = tmp_path / "eval"
    small = Path(__file__).parent / "assets" / "prepared"
    url = "http://al:pw/secret-99@127.0.0.1:9/v1"
    argv = ["eval", "--backend", "openai", "--model", "m", "--base-url", url, "--data"]
    assert main([*argv, str(small), "--tasks", "qasem", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "its URL" in err and "secret" not in err
    assert not [f for f in out.rglob("*") if f.is_file() and "secret" in f.read_text()]
