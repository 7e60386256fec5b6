"""`fincheck eval` on the tiny random-init model: p_yes against an independent computation,
batching with left padding, resume after a crash, an adapter, and eval -> score end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from fincheck.commands.cli import main
from fincheck.data import pairs as pairs_module
from fincheck.data.pairs import Pair, Prediction, read_pairs
from fincheck.data.prompting import NO_SPELLINGS, YES_NO, YES_SPELLINGS
from fincheck.errors import FincheckError
from fincheck.eval import generate
from fincheck.eval import predictions as generate_predictions
from fincheck.inference import generation as inference
from fincheck.models import loading
from fincheck.tasks import task_names

SHORT = "final=6,qasem=2,fhsumbench=6"
CPU = loading.LoadOptions(device="cpu")
CPU_FP32 = loading.LoadOptions(device="cpu", dtype="fp32")


@pytest.fixture(scope="session")
def tiny_adapter(tiny_base, tmp_path_factory) -> Path:
    """A LoRA adapter with non-zero weights (so it changes the outputs), saved like training does."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_base)
    config = LoraConfig(r=4, lora_alpha=16, target_modules="all-linear", init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    out = tmp_path_factory.mktemp("adapter") / "adapter"
    peft_model.save_pretrained(out)
    return out


def _load(tiny_base):
    loaded = loading.load_model(str(tiny_base), options=CPU)
    return loaded.model, loaded.tokenizer


def render_prompt(tokenizer, pair):
    return inference.render_chat(tokenizer, pair.prompt_messages, add_generation_prompt=True)


def _independent_p_yes(model, tokenizer, prompt: str) -> float:
    """Unpadded, one prompt at a time: P(spelling) = prod of next-token probabilities."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def prob_of(words):
        total = 0.0
        for seq in inference.answer_spellings(tokenizer, words):
            ids = torch.tensor([prompt_ids + list(seq)])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            total += float(
                torch.exp(sum(log_probs[len(prompt_ids) - 1 + k, t] for k, t in enumerate(seq)))
            )
        return total

    yes, no = prob_of(YES_SPELLINGS), prob_of(NO_SPELLINGS)
    return yes / (yes + no)


def test_p_yes_batched_equals_unbatched_sequence_probability(tiny_base, prepared_dir):
    model, tokenizer = _load(tiny_base)
    spellings = inference.answer_spellings(tokenizer, YES_SPELLINGS)
    assert any(len(s) > 1 for s in spellings) and any(len(s) == 1 for s in spellings)  # both paths
    pairs = list(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    pairs = sorted(pairs[:40], key=lambda p: len(p.user_content))[::13][
        :3
    ]  # three different lengths
    prompts = [render_prompt(tokenizer, p) for p in pairs]
    assert len({len(p) for p in prompts}) == 3  # so the batch really is left-padded
    texts, p_yes = inference.generate_batch(
        model, tokenizer, prompts, max_new_tokens=3, share=YES_NO
    )
    for prompt, text, value in zip(prompts, texts, p_yes, strict=True):
        assert value == pytest.approx(_independent_p_yes(model, tokenizer, prompt), abs=1e-4)
        alone, _ = inference.generate_batch(model, tokenizer, [prompt], max_new_tokens=3)
        assert alone == [text]  # left padding does not change greedy outputs


def _eval_args(tiny_base, prepared_dir, out, limit, *extra):
    return [
        "eval",
        "--model",
        str(tiny_base),
        "--data",
        str(prepared_dir),
        "--out",
        str(out),
        "--limit",
        str(limit),
        "--batch-size",
        "2",
        "--max-new-tokens",
        SHORT,
        "--max-input-tokens",  # keeps the tiny model fast; exercises trimming end to end
        "512",
        *extra,
    ]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _crash_after_first_batch(monkeypatch) -> list[int]:
    """Make the eval's answer path raise after its first batch; returns that batch's indices
    (filled in when it runs)."""
    real, first = generate.answer_prompts, []

    def crashing(*args, **kwargs):
        batches = real(*args, **kwargs)
        batch = next(batches)
        first.extend(batch.indices)
        yield batch
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(generate, "answer_prompts", crashing)
    return first


def test_eval_writes_predictions_resumes_and_scores(
    tiny_base, prepared_dir, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    # a crash in the second batch of the first task: the first batch is already on disk
    first = _crash_after_first_batch(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(_eval_args(tiny_base, prepared_dir, out, 3, "--tasks", "fhsumbench"))
    assert len(_lines(out / "predictions" / "fhsumbench.jsonl")) == len(first) > 0
    assert generate_predictions.eval_state(out / "predictions", "fhsumbench") == "unfinished"
    monkeypatch.undo()

    # a torn line (killed mid-write) is dropped on resume
    with (out / "predictions" / "fhsumbench.jsonl").open("a") as f:
        f.write('{"id": "fhsumbench-')
    capsys.readouterr()
    assert main(_eval_args(tiny_base, prepared_dir, out, 3)) == 0
    printed = capsys.readouterr().out
    assert "fhsumbench: 1 generated, 2 already done" in printed
    assert "final: 3 generated, 0 already done" in printed
    assert sum(int(n) for n in re.findall(r"(\d+) prompts trimmed", printed)) > 0  # 512 is short
    for task in ("final", "qasem", "fhsumbench"):
        records = _lines(out / "predictions" / f"{task}.jsonl")
        gold_pairs = list(read_pairs(prepared_dir / task / "test.jsonl", task_names()))
        by_document = task == "qasem"  # --limit 3 of QASem: one whole reference document
        sample = (pairs_module.sample_documents if by_document else pairs_module.sample_pairs)(
            gold_pairs, 3, seed=0
        )
        assert sorted(r["id"] for r in records) == sorted(p.id for p in sample)
        assert len(sample) > 3 if by_document else len(sample) == 3
        assert all(r["task"] == task and isinstance(r["output"], str) for r in records)
        assert all(0.0 <= r["p_yes"] <= 1.0 for r in records) if task == "qasem" else True

    # a second full rerun generates nothing
    assert main(_eval_args(tiny_base, prepared_dir, out, 3)) == 0
    assert "fhsumbench: 0 generated, 3 already done" in capsys.readouterr().out

    # and the predictions score
    assert (
        main(
            [
                "score",
                "--data",
                str(prepared_dir),
                "--predictions",
                str(out / "predictions"),
                "--out",
                str(out),
                "--bootstrap",
                "10",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["run"]["model"] == str(tiny_base)
    assert set(results["tasks"]) == {"final", "qasem", "fhsumbench"}
    assert results["tasks"]["qasem"]["overall"]["n_scored_from_text"] == 0  # p_yes was used
    assert sum(results["run"]["prompts_trimmed"].values()) > 0
    assert "prompts with a trimmed grounding text" in (out / "report.md").read_text()
    # complete means listed: each finished task's file by sha256; one edited after is refused
    assert {c["eval"] for c in results["counts"].values()} == {"finished"}
    copied = tmp_path / "copied"  # the predictions alone, as another tool's: nothing to check
    copied.mkdir()
    shutil.copy2(out / "predictions" / "qasem.jsonl", copied / "qasem.jsonl")
    assert generate_predictions.eval_state(copied, "qasem") == "unknown"
    edited = out / "predictions" / "qasem.jsonl"
    edited.write_text(edited.read_text().replace('"p_yes": 0.', '"p_yes": 0.9', 1))
    rescored = ["score", "--data", str(prepared_dir), "--predictions", str(out / "predictions")]
    assert main([*rescored, "--out", str(tmp_path / "again"), "--bootstrap", "10"]) == 1
    assert "qasem.jsonl: changed since `fincheck eval` finished it" in capsys.readouterr().err


def test_adapter_changes_outputs_and_its_base_is_found(
    tiny_base, tiny_adapter, prepared_dir, tmp_path
):
    base_out, adapter_out = tmp_path / "base", tmp_path / "adapter"
    assert main(_eval_args(tiny_base, prepared_dir, base_out, 2, "--tasks", "qasem")) == 0
    args = [
        "eval",
        "--adapter",
        str(tiny_adapter),
        "--data",
        str(prepared_dir),
        "--out",
        str(adapter_out),
        "--limit",
        "2",
        "--tasks",
        "qasem",
        "--max-new-tokens",
        SHORT,
        "--max-input-tokens",
        "512",
    ]
    assert main(args) == 0  # no --model: the base comes from adapter_config.json
    config = json.loads((adapter_out / "predictions" / "eval_config.json").read_text())
    assert config["adapter"] == str(tiny_adapter) and config["model"] is None  # as asked
    assert config["base"] == str(tiny_base)  # as loaded: the run folder read once
    base_p = {r["id"]: r["p_yes"] for r in _lines(base_out / "predictions" / "qasem.jsonl")}
    tuned_p = {r["id"]: r["p_yes"] for r in _lines(adapter_out / "predictions" / "qasem.jsonl")}
    assert base_p.keys() == tuned_p.keys()
    assert any(abs(base_p[k] - tuned_p[k]) > 1e-6 for k in base_p)


def test_limit_is_a_seeded_sample_across_the_file(prepared_dir):
    pairs = list(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    sample = pairs_module.sample_pairs(pairs, 60, seed=0)
    assert [p.id for p in sample] == [p.id for p in pairs_module.sample_pairs(pairs, 60, seed=0)]
    assert len({p.meta["dataset"] for p in sample}) == 3  # not just the first sub-dataset
    assert pairs_module.sample_pairs(pairs, None, 0) == pairs


def test_limit_of_qasem_draws_whole_reference_documents(prepared_dir):
    pairs = list(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    opts = generate.EvalOptions(
        model="m", data_dir=prepared_dir, out_dir=prepared_dir, limit=100, sample_seed=4
    )
    sample = opts.sample("qasem")
    assert sample == opts.sample("qasem")  # seeded
    chosen = {p.document_key for p in sample}
    by_document = {k: [p for p in pairs if p.document_key == k] for k in chosen}
    assert sorted(p.id for p in sample) == sorted(p.id for ps in by_document.values() for p in ps)
    largest = max(len(ps) for ps in by_document.values())
    assert 100 <= len(sample) < 100 + largest  # stops at the first document past the limit
    assert [p.id for p in sample] == [p.id for p in pairs if p in sample]  # file order
    other = dataclasses.replace(opts, sample_seed=5).sample("qasem")
    assert {p.id for p in other} != {p.id for p in sample}
    # FHSumBench keeps drawing single pairs
    assert len(dataclasses.replace(opts, limit=7).sample("fhsumbench")) == 7


def test_rerun_with_another_model_into_the_same_dir_is_refused(tiny_base, prepared_dir, tmp_path):
    out = tmp_path / "run"
    (out / "predictions").mkdir(parents=True)
    (out / "predictions" / "eval_config.json").write_text(
        json.dumps({"model": "other", "adapter": None, "split": "test"})
    )
    with pytest.raises(FincheckError, match="different run"):
        generate.run_eval(
            generate.EvalOptions(model=str(tiny_base), data_dir=prepared_dir, out_dir=out)
        )


def test_missing_adapter_is_a_clear_error(tmp_path):
    with pytest.raises(FincheckError, match=r"adapter_config\.json"):
        loading.load_model(None, str(tmp_path), CPU)


def test_local_transformers_judge_records_parse_failures_and_caches(tiny_base, tmp_path):
    from fincheck.inference.llm import RequestCache
    from fincheck.models.llm_clients import TransformersChatClient
    from fincheck.tasks.final.judge import MatchingJudge

    client = TransformersChatClient(str(tiny_base), max_new_tokens=4, device="cpu")
    judge = MatchingJudge(client, RequestCache(tmp_path / "cache.jsonl"))
    result = judge.match("A summary.", ["a wrong date"], ["the date"])
    # a random-init model cannot answer in JSON: one re-ask, then parse_failed with the raw text
    assert result.status == "parse_failed" and len(result.raw) == 2 and result.calls == 2
    again = MatchingJudge(client, RequestCache(tmp_path / "cache.jsonl")).match(
        "A summary.", ["a wrong date"], ["the date"]
    )
    assert again.calls == 0 and again.raw == result.raw


def test_a_local_model_is_identified_by_its_content_not_its_path(tiny_base, tmp_path):
    """Two models at one path (a folder replaced between runs) are two identities: the request
    cache and a rerun's check tell their answers apart."""
    import json
    import shutil

    from fincheck.models.llm_clients import TransformersChatClient

    model = tmp_path / "model"
    shutil.copytree(tiny_base, model)
    first = TransformersChatClient(str(model), max_new_tokens=4, device="cpu").identity
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    second = TransformersChatClient(str(model), max_new_tokens=4, device="cpu").identity
    assert first["model"] == second["model"] and first["content"] != second["content"]


def test_long_prompts_are_trimmed_on_the_grounding_text_only(tiny_base, prepared_dir):
    _, tokenizer = _load(tiny_base)
    pair = next(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names()))
    full = render_prompt(tokenizer, pair)
    n_full = len(tokenizer(full, add_special_tokens=False)["input_ids"])
    fitter = inference.LoadedModel(None, tokenizer, "tiny")
    span = pair.meta["grounding_span"]
    fit = fitter.fit_for_answer(pair.prompt_messages, span, 0, n_full // 2)
    text, trimmed = fit.text, fit.trimmed
    assert trimmed and len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= n_full // 2
    start, end = pair.meta["grounding_span"]
    user = pair.user_content
    assert user[end:] in text and user[:start] in text  # question, answer, instructions intact
    assert text.startswith(
        full[: full.index(user[:start]) + start + 20]
    )  # grounding kept from its start
    fit = fitter.fit_for_answer(pair.prompt_messages, span, 0, n_full)
    assert (fit.text, fit.trimmed) == (full, False)


def test_generation_is_plain_greedy_whatever_the_model_config_says(tiny_base):
    model, tokenizer = _load(tiny_base)
    # an instruct model's shipped settings: sampling and a repetition penalty
    model.generation_config.do_sample = True
    model.generation_config.temperature = 5.0
    model.generation_config.repetition_penalty = 3.0
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is the sky green? Reply Yes or No."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    texts, _ = inference.generate_batch(model, tokenizer, [prompt], max_new_tokens=5)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    for _ in range(5):  # argmax, token by token
        with torch.no_grad():
            next_id = model(input_ids=ids).logits[0, -1].argmax()
        ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
        if next_id.item() == tokenizer.eos_token_id:
            break
    n_prompt = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"].shape[
        1
    ]
    expected = tokenizer.decode(ids[0, n_prompt:], skip_special_tokens=True).strip()
    assert texts == [expected]


def test_prefix_reuse_gives_the_plain_paths_p_yes(tiny_base, small_prepared, tmp_path):
    """QASem through the shared-prefix path and through plain generate: the same P(Yes) within
    1e-4 on every QA (6 QAs over 3 documents), and texts that agree."""
    fast, plain = tmp_path / "fast", tmp_path / "plain"
    assert main(_eval_args(tiny_base, small_prepared, fast, 6, "--tasks", "qasem")) == 0
    args = _eval_args(tiny_base, small_prepared, plain, 6, "--tasks", "qasem", "--no-prefix-reuse")
    assert main(args) == 0
    fast_rows = {r["id"]: r for r in _lines(fast / "predictions" / "qasem.jsonl")}
    plain_rows = {r["id"]: r for r in _lines(plain / "predictions" / "qasem.jsonl")}
    assert fast_rows.keys() == plain_rows.keys() and len(fast_rows) == 6
    for qa_id, row in fast_rows.items():
        assert row["p_yes"] == pytest.approx(plain_rows[qa_id]["p_yes"], abs=1e-4)
        assert plain_rows[qa_id]["output"].startswith(row["output"])


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_adapter_is_refused_before_anything_is_loaded(
    tiny_base, small_prepared, tmp_path, capsys
):
    import torch

    adapter = tmp_path / "pickled"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "base_model_name_or_path": str(tiny_base)})
    )
    marker = tmp_path / "code-ran"
    torch.save({"w": _RunsCode(marker)}, adapter / "adapter_model.bin")
    args = ["eval", "--adapter", str(adapter), "--data", str(small_prepared)]
    assert main([*args, "--out", str(tmp_path / "out"), "--tasks", "qasem"]) == 1
    assert "pickle files are not loaded" in capsys.readouterr().err
    assert not marker.exists()


def test_a_resumed_eval_reports_the_trimmed_prompts_of_an_uninterrupted_one(
    tiny_base, prepared_dir, tmp_path, monkeypatch
):
    from fincheck.eval.predictions import read_eval_summary

    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    args = ("--tasks", "fhsumbench")
    assert main(_eval_args(tiny_base, prepared_dir, whole, 4, *args)) == 0
    expected = read_eval_summary(whole / "predictions")["fhsumbench"]
    assert expected["trimmed"] > 0  # 512 tokens is short for FHSumBench documents

    _crash_after_first_batch(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash"):
        main(_eval_args(tiny_base, prepared_dir, resumed, 4, *args))
    monkeypatch.undo()
    assert main(_eval_args(tiny_base, prepared_dir, resumed, 4, *args)) == 0
    assert read_eval_summary(resumed / "predictions")["fhsumbench"] == expected


def test_counting_a_long_document_raises_no_sequence_length_warning(tiny_base, capfd):
    """The tiny tokenizer says model_max_length 512; prompts are fitted, never truncated, so
    transformers' "Token indices sequence length ..." warning would only be noise."""
    loaded = loading.load_model(str(tiny_base), options=CPU)
    assert len(loaded.tokenizer("word " * 2000)["input_ids"]) > 512
    assert "Token indices sequence length" not in capfd.readouterr().err


def test_a_window_gives_the_base_the_adapters_prompts_and_fits_the_answer(
    tiny_base, small_prepared, tmp_path
):
    """--window 1024: answers get at most a quarter of it (FINAL's 384 -> 256), prompts the rest."""
    out = tmp_path / "w"
    args = ["eval", "--model", str(tiny_base), "--data", str(small_prepared), "--out", str(out)]
    limit = ["--limit", "final=2,qasem=2,fhsumbench=1", "--max-new-tokens", "final=4"]
    assert main([*args, "--window", "1024", *limit]) == 0
    config = json.loads((out / "predictions" / "eval_config.json").read_text())
    assert config["window"] == 1024
    assert config["max_new_tokens"] == {"final": 4, "qasem": 8, "fhsumbench": 96}
    assert config["limit"] == {"final": 2, "qasem": 2, "fhsumbench": 1}
    assert len(_lines(out / "predictions" / "fhsumbench.jsonl")) == 1
    loaded = loading.load_model(
        str(tiny_base), options=loading.LoadOptions(device="cpu", window=1024)
    )
    assert inference.fit_answer_budget(384, loaded.window) == 256
    assert loaded.prompt_budget(256) == 768


def test_a_rerun_with_another_sample_or_window_is_refused(tiny_base, prepared_dir, tmp_path):
    """Predictions of another sample would be mixed with the new ones and scored together."""
    out = tmp_path / "run"
    (out / "predictions").mkdir(parents=True)
    before = {"model": str(tiny_base), "adapter": None, "split": "test", "sample_seed": 0}
    before |= {"requested_window": None, "max_input_tokens": None}
    before |= {"limit": {"final": 5, "qasem": 9}, "tasks": ["final", "qasem"]}
    (out / "predictions" / "eval_config.json").write_text(json.dumps(before))
    for changed, match in [
        ({"limit": {"final": 6}, "tasks": ("final",)}, "--limit of final"),
        ({"limit": {"final": 5}, "tasks": ("final",), "sample_seed": 1}, "sample_seed"),
        ({"limit": {"final": 5}, "tasks": ("final",), "window": 256}, "requested_window"),
        # a run from before whole-document sampling drew QASem's --limit as single pairs
        ({"limit": {"final": 5, "qasem": 9}, "tasks": ("final", "qasem")}, "sampling of qasem"),
    ]:
        opts = generate.EvalOptions(model=str(tiny_base), data_dir=prepared_dir, out_dir=out)
        for key, value in changed.items():
            setattr(opts, key, value)
        with pytest.raises(FincheckError, match=match):
            generate.run_eval(opts)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--limit", "-5"], "--limit: expected N or task=N,... with N >= 1"),
        (["--limit", "final=0"], "N >= 1"),
        (["--limit", "final=5,final=9"], "each task once"),
        (["--limit", "bogus=3"], "tasks: final,qasem,fhsumbench"),
        (["--tasks", "final,bogus"], "--tasks: unknown task(s) ['bogus']"),
        (["--batch-size", "four"], "--batch-size: expected an integer, got 'four'"),
        (["--dtype", "fp8"], "--dtype"),
        (["--chat-template-kwargs", "[1]"], "--chat-template-kwargs: expected a JSON object"),
        # an option the chosen backend does not read is an error, never ignored
        (["--backend", "openai", "--batch-size", "4"],
         "--batch-size: read only with --backend local, not --backend openai; leave it out"),
        (["--backend", "openai", "--no-prefix-reuse"], "--no-prefix-reuse: read only with --backend local"),
        (["--adapter", "a", "--backend", "openai"], "--adapter: read only with --backend local"),
        (["--tokenizer", "t"], "--tokenizer: read only with --backend openai, not --backend local"),
        (["--base-url", "http://x"], "--base-url: read only with --backend openai"),
        # a served detector's prompt fitting: a tokenizer to count with
        (["--backend", "openai", "--window", "512"], "--window needs --tokenizer"),
        (["--backend", "openai", "--max-input-tokens", "512"], "--max-input-tokens needs --tokenizer"),
        # a misspelt flag gets the closest one; a baseline's flag says where it went
        (["--bach-size", "4"], "--bach-size … (did you mean --batch-size?)"),
        (["--method", "e2e"], "fincheck baseline --method"),
        (["--method=e2e"], "fincheck baseline --method"),
        (["--window", "0x800"], "--window: expected an integer, got '0x800'"),
    ],
)  # fmt: skip
def test_eval_options_are_checked_never_ignored(argv, match, tmp_path, capsys):
    try:
        status = main(
            ["eval", "--model", "m", "--data", str(tmp_path), "--out", str(tmp_path), *argv]
        )
    except SystemExit as e:  # argparse's own usage error
        status = e.code
    assert status != 0
    assert re.search(re.escape(match), capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--method", "e3e"], "--method: 'e3e' is not one of e2e, e2e-fewshot"),
        (["--method", "detector"], "--method: 'detector' is not one of"),
        # another method's options, and a local model's options with an endpoint
        (["--method", "e2e", "--step1", "oracle"], "--step1: read only with --method two-step, not --method e2e"),
        (["--method", "pipeline", "--step2", "cot-hint"], "--step2: read only with --method two-step"),
        (["--method", "two-step", "--nli-model", "x"], "--nli-model: read only with --method fizz"),
        (["--method", "e2e", "--nli-labels", "a,b,c"], "--nli-labels: read only with --method fizz"),
        (["--method", "e2e", "--backend", "openai", "--window", "512"],
         "--window: read only with --backend local and --method e2e or e2e-fewshot"),
        (["--method", "e2e", "--backend", "openai", "--device", "cpu"],
         "or with --method fizz or two-step, not --backend openai, --method e2e"),
        # overlap runs no model: the LLM's options are errors there, not ignored
        (["--method", "overlap"], "--model: read only with --method e2e or e2e-fewshot"),
        (["--method", "e2e", "--timeout", "5"], "--timeout: read only with --backend openai"),
        # a plain eval's options are not a baseline's
        (["--method", "e2e", "--batch-size", "4"], "unrecognized arguments: --batch-size"),
        (["--method", "e2e", "--tokenizer", "t"], "unrecognized arguments: --tokenizer"),
        (["--method", "e2e", "--adapter", "a"], "fincheck eval --adapter"),
        (["--method", "e2e", "--sample-seed", "{"], "--sample-seed: expected an integer, got '{'"),
    ],
)  # fmt: skip
def test_baseline_options_are_checked_never_ignored(argv, match, tmp_path, capsys):
    try:
        status = main(
            ["baseline", "--model", "m", "--data", str(tmp_path), "--out", str(tmp_path), *argv]
        )
    except SystemExit as e:  # argparse's own usage error
        status = e.code
    assert status != 0
    assert re.search(re.escape(match), capsys.readouterr().err)


def test_an_fp32_adapter_is_merged_for_inference_and_computes_the_same(tiny_adapter, prepared_dir):
    """fp32: the LoRA update is added into the base weights (faster, the same logits to 1e-4);
    bf16 keeps it apart (rounding would drop part of it)."""
    from peft import PeftModel

    merged = loading.load_model(adapter=str(tiny_adapter), options=CPU_FP32)
    apart = loading.load_model(adapter=str(tiny_adapter), options=CPU_FP32, merge_adapter=False)
    assert merged.adapter_merged and not isinstance(merged.model, PeftModel)
    assert not apart.adapter_merged and isinstance(apart.model, PeftModel)
    pair = next(iter(read_pairs(prepared_dir / "qasem" / "test.jsonl", task_names())))
    ids = merged.tokenizer(render_prompt(merged.tokenizer, pair), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        a, b = merged.model(input_ids=ids).logits, apart.model(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-4) and not torch.equal(a, b)  # measured: 1.8e-5
    half = loading.load_model(
        adapter=str(tiny_adapter), options=loading.LoadOptions(device="cpu", dtype="bf16")
    )
    assert not half.adapter_merged and isinstance(half.model, PeftModel)


@pytest.mark.parametrize(
    "key, before, after",
    [
        ("data_fingerprint", "02d9a4f407e2", "77aa00000000"),
        ("requested_max_new_tokens", {"final": 64}, {"final": 128}),
        ("dtype", "auto", "bf16"),
        ("requested_template_kwargs", None, {"enable_thinking": False}),
        ("prefix_reuse", True, False),
        ("max_tokens", 512, 1024),
        ("nli_model", "tals/albert-xlarge-vitaminc-mnli", "other/nli"),
        ("nli_labels", None, ["entailment", "contradiction", "neutral"]),
        ("step1", "self", "/runs/adapter"),
    ],
)
def test_a_rerun_that_would_answer_differently_is_refused(tmp_path, key, before, after):
    """Every setting that changes an answer is part of the resume check: a rerun into the same
    --out with another value would mix two runs' predictions under one eval_config.json."""
    from fincheck.eval.predictions import check_eval_config

    predictions = tmp_path / "predictions"
    base = {"model": "m", "split": "test", "tasks": ["final"]}
    check_eval_config(predictions, {**base, key: before})
    check_eval_config(predictions, {**base, key: before})  # the same run resumes
    with pytest.raises(FincheckError, match=f"different run \\({key} differ"):
        check_eval_config(predictions, {**base, key: after})


def test_another_prepared_folder_into_the_same_out_is_refused(tmp_path, capsys):
    import shutil

    small = Path(__file__).parent / "assets" / "prepared"
    other = tmp_path / "other"
    shutil.copytree(small, other)
    # other data, prepared as `fincheck prepare` would record it: one pair fewer
    _rewrite_split(other, "final/test.jsonl", lambda lines: lines[1:])
    out = tmp_path / "run"
    args = ["baseline", "--method", "overlap", "--out", str(out), "--no-progress", "--data"]
    assert main([*args, str(small)]) == 0
    assert main([*args, str(other)]) != 0
    assert "data_fingerprint differ" in capsys.readouterr().err


def test_two_evals_into_one_out_at_once_the_second_is_refused(tmp_path, capsys):
    """Both would append to the same predictions files and each report its own counts: the
    second stops at once, naming the holder; the lock goes with the process."""
    from fincheck.io.out_lock import hold_out_dir

    small = Path(__file__).parent / "assets" / "prepared"
    out = tmp_path / "run"
    args = [
        "baseline",
        "--method",
        "overlap",
        "--data",
        str(small),
        "--out",
        str(out),
        "--no-progress",
    ]
    with hold_out_dir(out, "fincheck eval"):
        assert main(args) != 0
        assert f"{out} is in use by fincheck eval (pid" in capsys.readouterr().err
        assert not (out / "predictions").exists()
    assert main(args) == 0  # released


def test_predictions_join_the_gold_in_the_gold_splits_order():
    from fincheck.eval.predictions import join_with_gold

    gold = [Pair(f"g{i}", "qasem", "test", []) for i in range(5)]
    predictions = [Prediction(f"g{i}", "qasem", "Yes") for i in (3, 0, 4)]
    joined, missing = join_with_gold(gold, predictions, Path("p.jsonl"), Path("gold.jsonl"))
    assert [pair.id for pair, _ in joined] == ["g0", "g3", "g4"]
    assert [prediction.id for _, prediction in joined] == ["g0", "g3", "g4"]
    assert missing == ["g1", "g2"]


def test_a_bad_step1_leaves_no_out_folder_and_no_lock(tmp_path, capsys):
    """--step1 is found wrong after the output folder is taken: the failed command leaves
    neither the folder it made nor a lock file in a folder that existed."""
    small = Path(__file__).parent / "assets" / "prepared"
    args = ["baseline", "--method", "two-step", "--step1", str(tmp_path / "nowhere"), "--model",
            "m", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--tasks", "final",
            "--data", str(small), "--no-progress", "--out"]  # fmt: skip
    assert main([*args, str(tmp_path / "new")]) == 1
    assert "--step1" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    assert main([*args, str(existing)]) == 1
    assert list(existing.iterdir()) == []


def test_a_prepared_split_edited_after_prepare_is_refused(tmp_path):
    """Results name the data by the manifest's fingerprint, made of the split files' sha256:
    a label flipped by hand would change the figures under the old fingerprint."""
    import shutil

    from fincheck.errors import FincheckError
    from fincheck.tasks.prepared import read_split

    data = tmp_path / "prepared"
    shutil.copytree(Path(__file__).parent / "assets" / "prepared", data)
    path = data / "qasem" / "test.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    flipped = lines[0].replace('"content": "Yes"', '"content": "No"')
    assert flipped != lines[0]
    path.write_text(flipped + "".join(lines[1:]))
    with pytest.raises(FincheckError, match=r"test.jsonl changed after `fincheck prepare`"):
        read_split(data, "qasem", "test")


def test_a_pair_id_given_twice_is_refused_naming_both_lines(tmp_path):
    from fincheck.data.pairs import read_pairs
    from fincheck.errors import InvalidRecordError

    source = Path(__file__).parent / "assets" / "prepared" / "qasem" / "test.jsonl"
    lines = source.read_text().splitlines(keepends=True)
    path = tmp_path / "test.jsonl"
    path.write_text(lines[0] + lines[1] + lines[0])
    with pytest.raises(InvalidRecordError, match=r"test.jsonl:3: id: .* again \(first on line 1\)"):
        list(read_pairs(path, task_names()))


def test_a_served_eval_rerun_with_another_tokenizer_is_refused(tmp_path):
    """Prompts fitted with one tokenizer (or sent whole) must not be mixed with another's."""
    from fincheck.errors import FincheckError
    from fincheck.eval.predictions import check_eval_config

    config = {"model": "m", "split": "test", "tokenizer": None, "tasks": ["qasem"]}
    check_eval_config(tmp_path, config)
    with pytest.raises(FincheckError, match="tokenizer"):
        check_eval_config(tmp_path, {**config, "tokenizer": "/runs/adapter"})


def _rewrite_split(data: Path, key: str, edit) -> None:
    """Edit a prepared split and record it in the manifest as `fincheck prepare` would."""
    from fincheck.io.checksums import sha256_file

    path = data / key
    lines = edit(path.read_text().splitlines(keepends=True))
    path.write_text("".join(lines))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["files"][key] = {"pairs": len(lines), "sha256": sha256_file(path)}
    manifest["fingerprint"] = _fingerprint(manifest["files"])
    (data / "manifest.json").write_text(json.dumps(manifest))


def _fingerprint(files: dict) -> str:
    """The data fingerprint `fincheck prepare` records: the sha256 of the files' records."""
    import hashlib

    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def test_a_manifest_whose_fingerprint_is_not_its_files_is_refused(tmp_path, capsys):
    """A split edited and its sha256 updated in the manifest by hand, the fingerprint kept:
    results would name the old data. The fingerprint is recomputed from the files' records."""
    import shutil

    data = tmp_path / "prepared"
    shutil.copytree(Path(__file__).parent / "assets" / "prepared", data)
    fingerprint = json.loads((data / "manifest.json").read_text())["fingerprint"]
    _rewrite_split(data, "qasem/test.jsonl", lambda lines: lines[1:])
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["fingerprint"] = fingerprint  # the old one
    (data / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "run"
    args = ["baseline", "--method", "overlap", "--out", str(out), "--no-progress"]
    assert main([*args, "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json: its fingerprint is not the one its files' sha256 make" in err
    assert len(err.strip().splitlines()) == 1


def test_a_split_file_the_manifest_does_not_list_is_refused(tmp_path):
    """A task folder copied in from another prepare is not what the fingerprint names."""
    import shutil

    from fincheck.errors import FincheckError
    from fincheck.tasks.prepared import read_split

    data = tmp_path / "prepared"
    shutil.copytree(Path(__file__).parent / "assets" / "prepared", data)
    manifest = json.loads((data / "manifest.json").read_text())
    del manifest["files"]["qasem/test.jsonl"]
    manifest["fingerprint"] = _fingerprint(manifest["files"])
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FincheckError, match=r"test\.jsonl is not among the files .*manifest"):
        read_split(data, "qasem", "test")
    assert read_split(data, "qasem", "dev")  # the files it lists are read


def test_an_adapter_retrained_in_place_does_not_resume_an_evaluation(tmp_path):
    """The adapter's path is the same, its weights are not: predictions of the old weights
    would be scored, and published, under the new weights' sha256. Another window or answer
    budget for a task already evaluated is refused too; a new task's budget is not."""
    from fincheck.errors import FincheckError
    from fincheck.eval.predictions import read_eval_config, record_loaded

    loaded = {"adapter_sha256": "a" * 64, "window": 2048, "max_new_tokens": {"final": 256}}
    record_loaded(tmp_path, **loaded)
    record_loaded(tmp_path, **{**loaded, "adapter_sha256": "b" * 64})  # nothing predicted yet
    (tmp_path / "final.jsonl").write_text('{"id": "x"}\n')
    record_loaded(tmp_path, **{**loaded, "adapter_sha256": "b" * 64})  # the same: resumes
    for change in (
        {"adapter_sha256": "c" * 64},
        {"window": 4096},
        {"max_new_tokens": {"final": 512}},
    ):
        with pytest.raises(FincheckError, match="holds predictions of a different run") as e:
            record_loaded(tmp_path, **{**loaded, "adapter_sha256": "b" * 64, **change})
        assert next(iter(change)) in str(e.value) and "\n" not in str(e.value)
    record_loaded(
        tmp_path, **{**loaded, "adapter_sha256": "b" * 64, "max_new_tokens": {"qasem": 8}}
    )
    assert read_eval_config(tmp_path)["max_new_tokens"] == {"final": 256, "qasem": 8}


def test_an_evaluation_resumed_after_its_adapter_was_retrained_in_place_is_refused(
    tiny_adapter, tmp_path, capsys
):
    """`fincheck eval --adapter run/` stopped, the run retrained into the same folder, the eval
    rerun to finish: the old weights' predictions would be kept and scored (and published)
    under the new weights' sha256."""
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter, adapter)
    out = tmp_path / "eval"
    small = Path(__file__).parent / "assets" / "prepared"
    args = ["eval", "--adapter", str(adapter), "--data", str(small), "--out", str(out)]
    args += ["--tasks", "qasem", "--max-new-tokens", SHORT, "--max-input-tokens", "512"]
    assert main([*args, "--limit", "2"]) == 0
    predictions = out / "predictions" / "qasem.jsonl"
    first = predictions.read_text().splitlines(keepends=True)[0]
    predictions.write_text(first)  # stopped after one prediction
    weights = adapter / "adapter_model.safetensors"
    save_file({k: v * 2 for k, v in load_file(weights).items()}, weights)
    capsys.readouterr()
    assert main([*args, "--limit", "2"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("fincheck eval: error:")]
    assert len(errors) == 1 and "holds predictions of a different run (adapter_sha256" in err
    assert predictions.read_text() == first


def test_an_eval_folder_names_its_backend_endpoint_and_failures(tmp_path):
    """A rerun against another endpoint (or the model loaded here) would mix two models'
    answers; examples that failed are recorded apart, not counted as predictions."""
    from fincheck.errors import FincheckError
    from fincheck.eval.predictions import check_eval_config, read_eval_summary, record_generation

    config = {"model": "m", "split": "test", "tasks": ["qasem"], "backend": "openai"}
    check_eval_config(tmp_path, {**config, "base_url": "http://a/v1"})
    for other in ({"base_url": "http://b/v1"}, {"backend": "local", "base_url": None}):
        with pytest.raises(FincheckError, match=r"base_url|backend"):
            check_eval_config(tmp_path, {**config, "base_url": "http://a/v1", **other})
    record_generation(tmp_path, "qasem", {"total": 5, "trimmed": 1, "failed": ["q1: timeout"]})
    assert read_eval_summary(tmp_path)["qasem"] == {"n_predictions": 4, "trimmed": 1, "failed": 1}
    # either record edited into another shape: one line naming it where a resume or score reads it
    for name, edited in (("eval_summary.json", {"qasem": 5}), ("eval_config.json", {"tasks": 5})):
        (tmp_path / name).write_text(json.dumps(edited))
        with pytest.raises(FincheckError, match=rf"{name.replace('.', '[.]')}: .* is an integer"):
            read_eval_summary(tmp_path)
            check_eval_config(tmp_path, {**config, "base_url": "http://a/v1"})
        (tmp_path / name).unlink()


def test_results_name_the_base_an_adapter_only_eval_loaded(tmp_path):
    from fincheck.eval.options import ScoreOptions
    from fincheck.eval.predictions import record_loaded
    from fincheck.eval.score import _run_info, model_label

    record_loaded(tmp_path, base="/models/base", adapter_sha256="abc")
    (tmp_path / "eval_config.json").write_text(
        json.dumps({**json.loads((tmp_path / "eval_config.json").read_text()), "adapter": "/r/a"})
    )
    info = _run_info(ScoreOptions(data_dir=tmp_path, predictions_dir=tmp_path, out_dir=tmp_path))
    assert info["base"] == "/models/base" and model_label(info) == "a (on base)"


def test_a_prompt_that_cannot_fit_stops_the_eval_naming_the_pair(
    tiny_base, small_prepared, tmp_path, capsys
):
    """The one "does not fit" error (`PromptDoesNotFit`), with the example and eval's own
    options, in one line, before anything is written; the same step served and local."""
    out = tmp_path / "run"
    args = ["eval", "--model", str(tiny_base), "--data", str(small_prepared), "--out", str(out),
            "--tasks", "final", "--max-input-tokens", "20", "--no-progress"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar
    assert re.search(
        r"final/\S+ does not fit in 20 prompt tokens \(--max-input-tokens\) even with its "
        r"grounding text cut away: lower --max-new-tokens, or raise --max-input-tokens",
        err,
    )
    assert not (out / "predictions" / "final.jsonl").exists() or not _lines(
        out / "predictions" / "final.jsonl"
    )


@pytest.mark.parametrize("change", ["lora_alpha", "base weights", "base code"])
def test_an_evaluation_resumed_after_its_model_changed_in_place_is_refused(
    change, tiny_adapter, tmp_path, capsys
):
    """Identity by content: an adapter whose adapter_config.json says another lora_alpha (the
    same weights, another function), or a base whose weights changed under the same folder
    name, is another model, as is one whose own code (run with --trust-remote-code) changed;
    its answers are not mixed into the predictions made before."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter, adapter)
    config = json.loads((adapter / "adapter_config.json").read_text())
    base = tmp_path / "base"  # a base folder of its own, to change in place
    shutil.copytree(config["base_model_name_or_path"], base)
    config["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    (base / "modeling_remote.py").write_text("BOOST = 0.0\n")
    out = tmp_path / "eval"
    small = Path(__file__).parent / "assets" / "prepared"
    args = ["eval", "--adapter", str(adapter), "--data", str(small), "--out", str(out)]
    args += ["--tasks", "qasem", "--max-new-tokens", SHORT, "--max-input-tokens", "512"]
    assert main([*args, "--limit", "2"]) == 0
    predictions = out / "predictions" / "qasem.jsonl"
    first = predictions.read_text().splitlines(keepends=True)[0]
    predictions.write_text(first)  # stopped after one prediction
    if change == "lora_alpha":
        config = json.loads((adapter / "adapter_config.json").read_text())
        config["lora_alpha"] = 2 * config["lora_alpha"]
        (adapter / "adapter_config.json").write_text(json.dumps(config))
        key = "adapter_content"
    elif change == "base code":
        (base / "modeling_remote.py").write_text("BOOST = 50.0\n")
        key = "base_content"
    else:
        weights = next(base.glob("*.safetensors"))
        save_file({k: v * 1.5 for k, v in load_file(weights).items()}, weights)
        key = "base_content"
    capsys.readouterr()
    assert main([*args, "--limit", "2"]) == 1
    err = capsys.readouterr().err
    assert f"holds predictions of a different run ({key} differ" in err
    assert predictions.read_text() == first


def test_a_folder_option_is_recorded_by_its_content(tiny_adapter, tmp_path):
    """Two-step's step-1 adapter and a served eval's tokenizer are folders: recorded by what
    they hold, so the same folder changed in place is another identity (and a copy elsewhere
    the same one)."""
    import shutil

    from fincheck.eval.predictions import path_identity

    step1 = tmp_path / "step1"
    shutil.copytree(tiny_adapter, step1)
    before = path_identity(str(step1))
    assert before == path_identity(str(shutil.copytree(step1, tmp_path / "x" / "step1")))
    (step1 / "adapter_config.json").write_text((step1 / "adapter_config.json").read_text() + " ")
    assert path_identity(str(step1)) != before
    assert path_identity("self") == "self"


def test_one_model_fetched_on_two_machines_is_one_identity(tiny_base, tmp_path):
    """`fincheck models fetch` records its copy (sizes, mtimes) in fincheck_model.json: the same
    pinned weights fetched on another machine, or again, are the same model, so an evaluation
    or a multi-node run started on one copy resumes on the other; the weights still count."""
    import shutil

    from fincheck.io.checksums import FETCH_RECORD, folder_sha256

    here, there = (shutil.copytree(tiny_base, tmp_path / name) for name in ("here", "there"))
    (here / FETCH_RECORD).write_text('{"files": {"model.safetensors": [1, 111, "ab"]}}\n')
    (there / FETCH_RECORD).write_text('{"files": {"model.safetensors": [1, 222, "ab"]}}\n')
    assert folder_sha256(here) == folder_sha256(there)
    weights = next(there.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    assert folder_sha256(here) != folder_sha256(there)


def test_a_tokenizer_only_folder_fits_a_served_evals_prompts(tiny_base, tmp_path):
    """`--tokenizer` may name the tokenizer alone (what `fincheck models fetch` installs for a
    tokenizer, or a served model's tokenizer files): no config.json is asked for; the window is
    --window, else the tokenizer's own length limit."""
    import json
    import shutil

    from fincheck.models.loading import load_prompt_fitter

    folder = tmp_path / "tokenizer-only"
    folder.mkdir()
    for path in tiny_base.iterdir():
        if path.name.startswith(
            ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")
        ):
            shutil.copy(path, folder / path.name)
    assert not (folder / "config.json").exists()
    fitter = load_prompt_fitter(str(folder), window=256)
    assert fitter.model is None and fitter.tokenizer("a b c")["input_ids"]
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = 1024
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_prompt_fitter(str(folder)).position_limit == 1024


@pytest.mark.parametrize(
    "damage",
    ["weights cut", "tokenizer.json cut", "chat template", "tensors renamed", "weights NaN"],
)
def test_a_damaged_adapter_tokenizer_or_template_is_one_line_in_every_command(
    damage, tiny_adapter, tiny_base, tmp_path, capsys
):
    """eval, detect and merge load an adapter through one loader: weights cut short, a
    tokenizer file cut short, a chat template that does not render, tensors whose names match
    no module (PEFT only warns: the base alone would answer) or NaN weights (scores that score
    would refuse, a merged model that answers NaN) are one line, never a library's traceback
    and never an exit 0."""
    import json
    import shutil

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter, adapter)
    for path in tiny_base.iterdir():  # the run's own tokenizer, as training saves it
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, adapter / path.name)
    if damage == "weights cut":
        weights = adapter / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
        said = "is not a safetensors file, or is cut short"
    elif damage == "tokenizer.json cut":
        tok = adapter / "tokenizer.json"
        tok.write_bytes(tok.read_bytes()[: len(tok.read_bytes()) // 2])
        said = "its tokenizer files do not load"
    elif damage in ("tensors renamed", "weights NaN"):
        from safetensors.torch import load_file, save_file

        weights = adapter / "adapter_model.safetensors"
        tensors = load_file(weights)
        if damage == "tensors renamed":
            tensors = {f"x.{name}": t for name, t in tensors.items()}
            said = "do not name the modules its config adapts"
        else:
            tensors = {name: torch.full_like(t, float("nan")) for name, t in tensors.items()}
            said = "NaN"
        save_file(tensors, weights)
    else:
        config = json.loads((adapter / "tokenizer_config.json").read_text())
        config["chat_template"] = "{% for m in messages %}{{ m.content }"
        (adapter / "tokenizer_config.json").write_text(json.dumps(config))
        (adapter / "chat_template.jinja").unlink(missing_ok=True)
        said = "its chat template does not render"
    small = Path(__file__).parent / "assets" / "prepared"
    article, summary = tmp_path / "a.txt", tmp_path / "s.txt"
    article.write_text("The sky is blue.")
    summary.write_text("The sky is green.")
    for argv in (
        ["eval", "--adapter", str(adapter), "--data", str(small), "--out", str(tmp_path / "e")],
        ["detect", "--adapter", str(adapter), "--text", str(article), "--summary", str(summary)],
        ["merge", "--adapter", str(adapter), "--out", str(tmp_path / "m")],
    ):
        capsys.readouterr()
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "error:" in line]
        assert len(lines) == 1 and said in lines[0] and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("reuse", [True, False], ids=["prefix-tree", "generate"])
def test_nan_logits_in_a_task_scored_by_its_text_are_one_line(
    reuse, tiny_adapter, tmp_path, capsys
):
    """A task read from the answer's text alone (FHSumBench's labels) has no P(Yes) to check:
    NaN logits would still decode (argmax picks a token) into a label the model never
    computed. Both decoders refuse them, in one line, and write no predictions."""
    import shutil

    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_adapter, adapter)
    weights = adapter / "adapter_model.safetensors"
    save_file({k: torch.full_like(t, float("nan")) for k, t in load_file(weights).items()}, weights)
    small = Path(__file__).parent / "assets" / "prepared"
    argv = ["eval", "--adapter", str(adapter), "--data", str(small), "--tasks", "fhsumbench"]
    argv += ["--out", str(tmp_path / "e")] + ([] if reuse else ["--no-prefix-reuse"])
    capsys.readouterr()
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "next-token score is not a number" in lines[0], err
    assert "Traceback" not in err
    assert not [path for path in (tmp_path / "e").rglob("*.jsonl") if path.read_text().strip()]


def test_greedy_decoding_takes_only_scores_the_model_computed():
    """A row with NaN or +inf, or with no finite score at all (every token -inf), is refused
    whatever the other rows hold; -inf beside finite scores is a masked token."""
    from fincheck.inference.generation import greedy_tokens

    fine = torch.tensor([[0.0, 2.0, -math.inf], [1.0, -math.inf, 0.5]])
    assert greedy_tokens(fine).tolist() == [1, 0]
    for bad in (float("nan"), math.inf):
        with pytest.raises(FincheckError, match="not a number"):
            greedy_tokens(torch.tensor([[0.0, 2.0, 1.0], [1.0, bad, 0.5]]))
    with pytest.raises(FincheckError, match="not a number"):
        greedy_tokens(torch.tensor([[0.0, 2.0, 1.0], [-math.inf, -math.inf, -math.inf]]))


def test_a_rerun_whose_identity_holds_a_secret_is_the_same_run(tmp_path, monkeypatch):
    """The record is written redacted: a rerun compares its own identity redacted the same way
    (an endpoint deployment named like the API key it holds), never "a different run" for the
    same command; another model is still refused."""
    from fincheck.io import secrets

    monkeypatch.setattr(secrets, "_HELD", {"mymodel42secret"})
    config = {
        "backend": "openai",
        "model": "openai/mymodel42secret/http://h/v1",
        "tasks": ["qasem"],
    }
    generate_predictions.check_eval_config(tmp_path, config)
    assert "mymodel42secret" not in (tmp_path / generate_predictions.EVAL_CONFIG).read_text()
    generate_predictions.check_eval_config(tmp_path, dict(config))
    generate_predictions.record_loaded(tmp_path, base="mymodel42secret")
    generate_predictions.record_loaded(tmp_path, base="mymodel42secret")
    with pytest.raises(FincheckError, match="different run"):
        generate_predictions.check_eval_config(tmp_path, {**config, "model": "openai/other/x"})


def test_a_predictions_file_is_resumed_line_by_line_from_its_bytes(tmp_path):
    """A resumed predictions file is read as bytes, line by line: a byte-order mark an editor
    put first is no damage, a torn last line cut inside a character is dropped as any torn
    line, and a byte that is no UTF-8 further up names the file and its line."""
    from fincheck.errors import FincheckError
    from fincheck.eval.predictions import PredictionWriter

    path = tmp_path / "final.jsonl"
    lines = [json.dumps({"id": f"f{i}", "task": "final", "output": "None"}) for i in range(2)]
    path.write_bytes(
        b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n" + '{"id": "é'.encode()[:-1]
    )
    writer = PredictionWriter(path, "final")
    writer.close()
    assert writer.done == {"f0", "f1"} and path.read_text() == "\n".join(lines) + "\n"
    path.write_bytes(lines[0].encode() + b"\n" + b'{"id": "caf\xe9"}\n' + lines[1].encode() + b"\n")
    with pytest.raises(FincheckError, match=r"final\.jsonl:2: unreadable prediction"):
        PredictionWriter(path, "final")


def test_a_hub_model_is_identified_by_the_snapshot_the_cache_holds(tmp_path, monkeypatch):
    """A model named by a hub id (a baseline's --model, the judge's, FIZZ's NLI model, a
    tokenizer) is identified by the files of the snapshot its load used, not by its name: the
    repo updated since, the same name is another model."""
    import huggingface_hub.constants

    from fincheck.eval.predictions import path_identity
    from fincheck.models.loading import model_content

    cache = tmp_path / "hub"
    snapshot = cache / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (cache / "models--org--tiny" / "refs").mkdir()
    (cache / "models--org--tiny" / "refs" / "main").write_text("abc123")
    (snapshot / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    first = model_content("org/tiny")
    assert first and path_identity("org/tiny") == f"org/tiny sha256:{first}"
    (snapshot / "config.json").write_text('{"model_type": "llama", "vocab_size": 9}')
    assert model_content("org/tiny") != first
    assert model_content("org/not-cached") is None and path_identity("org/x") == "org/x"
