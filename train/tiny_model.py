"""A tiny random-init causal LM and the project's own small tokenizer: no download, ever.

CI, the tests and the demo train and evaluate this model (recipe `configs/train/tiny-cpu.yaml`).
It is a real architecture (Qwen2: 2 layers, hidden 64, grouped-query attention), so every code
path of a real run is exercised -- chat template, LoRA on all linear layers, DeepSpeed ZeRO,
save/load -- at a size a 2-core CPU trains in seconds.

The tokenizer is a byte-level BPE (every byte is a token, so any text, in any script, tokenizes)
trained on `assets/tiny_corpus.txt` and shipped as `assets/tiny_tokenizer.json`
(rebuild: `python scripts/build_tiny_tokenizer.py`). Special tokens follow ChatML:

    <|endoftext|>  pad  (never trained on: padding and loss masking need it distinct from EOS)
    <|im_start|>   opens a turn
    <|im_end|>     closes a turn = EOS (the model learns to stop after its answer)

The chat template is the file `assets/chatml.jinja`.

    from fincheck.train.tiny_model import save_tiny_base
    base = save_tiny_base("checkpoints/demo/base")      # config.json, model.safetensors, tokenizer
    model = AutoModelForCausalLM.from_pretrained(base)  # plain transformers from here on
"""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TOKENIZER_FILE = ASSETS / "tiny_tokenizer.json"
CORPUS_FILE = ASSETS / "tiny_corpus.txt"
CHAT_TEMPLATE_FILE = ASSETS / "chatml.jinja"

PAD_TOKEN = "<|endoftext|>"
BOS_OF_TURN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_OF_TURN, EOS_TOKEN)  # ids 0, 1, 2
TINY_VOCAB_SIZE = 1024
# Qwen2's pre-tokenizer split (letters, single digits, punctuation runs, whitespace).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Shape of the tiny Qwen2: ~0.2M parameters, most of them in the (untied) embeddings.
TINY_MODEL_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA, like the real Qwen2.5 / Llama-3 models
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def train_tiny_tokenizer():
    """Train the byte-level BPE from scratch (deterministic for a given corpus and version).

    Returns a `tokenizers.Tokenizer`; `scripts/build_tiny_tokenizer.py` saves it as the shipped
    `tiny_tokenizer.json`, which `build_tiny_tokenizer` loads.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # The Qwen2 pipeline exactly (NFC, its split regex, byte-level): transformers loads any
    # `model_type: qwen2` folder through Qwen2Tokenizer, which rebuilds these steps itself, so
    # training with the same steps keeps `AutoTokenizer` and `build_tiny_tokenizer` identical.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: no unknown text
        show_progress=False,
    )
    lines = CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def build_tiny_tokenizer(tokenizer_file: str | Path = TOKENIZER_FILE):
    """The shipped tiny tokenizer as a transformers fast tokenizer, with the ChatML template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tokenizer_file)),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[BOS_OF_TURN],
        model_max_length=TINY_MODEL_SHAPE["max_position_embeddings"],
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE_FILE.read_text(encoding="utf-8")  # ChatML
    return tokenizer


def build_tiny_model(seed: int = 0):
    """A random-init Qwen2ForCausalLM of `TINY_MODEL_SHAPE`; the same `seed` gives the same weights."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    tokenizer = build_tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        **TINY_MODEL_SHAPE,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # Seed a private generator state so building the model never disturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)  # generation_config: config's eos/pad ids


def save_tiny_base(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a loadable base folder (config.json, model.safetensors, tokenizer, chat template).

    `AutoModelForCausalLM.from_pretrained(out_dir)` and `AutoTokenizer.from_pretrained(out_dir)`
    load it with no network. Returns `out_dir`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_model(seed=seed).save_pretrained(out, safe_serialization=True)
    build_tiny_tokenizer().save_pretrained(out)
    return out
