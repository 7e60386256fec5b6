"""Base model, tokenizer and LoRA config for a recipe."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError
from fincheck.inference.generation import parse_dtype, torch_dtype
from fincheck.io.jsonl import read_utf8_text
from fincheck.io.runs import looks_like_hub_id
from fincheck.models.known import read_model_info
from fincheck.models.loading import (
    base_config,
    check_template_renders,
    remote_code_explained,
    resolve_model,
)
from fincheck.models.loading import load_tokenizer as load_tokenizer_files
from fincheck.train.recipe import TINY_RANDOM, SFTRecipe
from fincheck.train.tiny_model import ASSETS, CHAT_TEMPLATE_FILE, save_tiny_base

log = logging.getLogger(__name__)

# Reserved tokens that real chat models ship unused and that make a safe pad (never EOS).
RESERVED_PAD_TOKENS = ("<|finetune_right_pad_id|>", "<|endoftext|>", "<pad>", "<|pad|>")


def resolve_base_path(recipe: SFTRecipe, output_dir: Path) -> str:
    """Where the base weights come from: the hub id or folder, a name `fincheck models` knows
    (its fetched folder), or <output_dir>/base for tiny."""
    if recipe.model_name_or_path == TINY_RANDOM:
        return str((output_dir / "base").resolve())
    return resolve_model(recipe.model_name_or_path, log=log.info)


def base_identity(recipe: SFTRecipe, base_path: str, model: Any) -> dict[str, Any]:
    """Who the base is, for fincheck_run.json and the model card: its hub id and revision where
    known (the recipe's base_model_id, a fetched folder's origin record, a hub id's commit),
    and where the weights came from."""
    if recipe.model_name_or_path == TINY_RANDOM:
        return {
            "base_model_id": None,
            "base_model_revision": None,
            "base_origin": "random-init tiny Qwen2 built by fincheck (saved in the run as base/)",
        }
    hub_id, revision, origin = None, None, f"local folder {base_path}"
    info = read_model_info(base_path)
    if info is not None:
        hub_id, origin = info.hub_id, f"{info.package} from the package index: {info.note}"
    elif looks_like_hub_id(recipe.model_name_or_path):
        hub_id, origin = recipe.model_name_or_path, "Hugging Face Hub"
        revision = getattr(model.config, "_commit_hash", None)
    if recipe.base_model_id:
        hub_id = recipe.base_model_id
    if hub_id is None:
        log.warning(
            "the base %s has no known hub id: the model card will not name it "
            "(set --base_model_id=ORG/NAME if it is a copy of a hub model)",
            base_path,
        )
    return {"base_model_id": hub_id, "base_model_revision": revision, "base_origin": origin}


def ensure_tiny_base(base_path: str) -> None:
    """Write the tiny random-init base once, before DeepSpeed is configured (ZeRO-3 would
    partition the fresh model). Every process builds the same seeded weights into its own temp
    folder and renames it into place; the first rename wins, so no process reads a half-written
    base and no barrier is needed before torch.distributed exists."""
    target = Path(base_path)
    if (target / "config.json").is_file():
        return
    # a fresh folder made by this process (mkdtemp: exclusive, unguessable), never one planted
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # as a folder made by mkdir (mkdtemp's is private to this user)
    save_tiny_base(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process got there first
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(recipe: SFTRecipe, base_path: str):
    """The base's tokenizer with a pad token distinct from EOS, and the recipe's chat template."""

    source = recipe.tokenizer_name_or_path or base_path
    for folder in dict.fromkeys([base_path, source]):  # the tokenizer reads their configs too
        if not Path(folder).is_dir() or (Path(folder) / "config.json").is_file():
            base_config(folder, folder, recipe.trust_remote_code)
    with remote_code_explained(source):  # the one loader: every failure one line naming it
        tokenizer = load_tokenizer_files(source, recipe.trust_remote_code)
    if recipe.chat_template_path:
        tokenizer.chat_template = read_utf8_text(recipe.chat_template_path)
        check_template_renders(tokenizer, recipe.chat_template_path)
    if not tokenizer.chat_template:
        raise FincheckError(
            f"{base_path}: the tokenizer has no chat template; set chat_template_path to the "
            f"template of its model family ({suggest_chat_template(tokenizer)})"
        )
    if recipe.eos_token:  # the token that ends the assistant's turn, when not the tokenizer's EOS
        if recipe.eos_token not in tokenizer.get_vocab():
            raise FincheckError(
                f"eos_token {recipe.eos_token!r} is not in the tokenizer's vocabulary"
            )
        tokenizer.eos_token = recipe.eos_token
    if tokenizer.eos_token is None:
        raise FincheckError(f"{base_path}: the tokenizer has no EOS token")
    pad = choose_pad_token(tokenizer, recipe.pad_token)
    if pad not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"pad_token": pad})
        log.warning("added a new pad token %r: the embeddings are resized", pad)
    tokenizer.pad_token = pad
    tokenizer.padding_side = "right"
    return tokenizer


def suggest_chat_template(tokenizer: Any) -> str:
    """The project's template file for the tokenizer's family, from its special tokens."""
    vocab = tokenizer.get_vocab()
    if "<|start_header_id|>" in vocab:
        return f"Llama 3.x: {ASSETS / 'llama-3.2-instruct.jinja'} with eos_token: <|eot_id|>"
    if "<|im_start|>" in vocab:
        return f"ChatML: {CHAT_TEMPLATE_FILE}"
    return "the instruct template its model card names; ChatML fits only <|im_start|> vocabularies"


def choose_pad_token(tokenizer: Any, requested: str | None) -> str:
    """A pad token that is not EOS: padding with EOS would mask EOS out of the loss."""
    if requested:
        if requested == tokenizer.eos_token:
            raise FincheckError(f"pad_token {requested!r} is the EOS token; choose another")
        return requested
    if tokenizer.pad_token and tokenizer.pad_token != tokenizer.eos_token:
        return tokenizer.pad_token
    vocab = tokenizer.get_vocab()
    for candidate in RESERVED_PAD_TOKENS:
        if candidate in vocab and candidate != tokenizer.eos_token:
            return candidate
    return "<|pad|>"


def load_base_model(recipe: SFTRecipe, base_path: str, tokenizer: Any):
    """The base causal LM (4-bit for QLoRA), embeddings resized if a pad token was added. Its
    dtype is the recipe's `torch_dtype`, or auto = the training precision's (fp16 training keeps
    the LoRA weights in fp32: PEFT's autocast_adapter_dtype)."""
    from transformers import AutoModelForCausalLM

    dtype = parse_dtype(recipe.torch_dtype)
    if dtype == "auto":
        dtype = "bf16" if recipe.bf16 else "fp16" if recipe.fp16 else "fp32"
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(dtype),
        "trust_remote_code": recipe.trust_remote_code,
    }
    if recipe.attn_implementation:
        kwargs["attn_implementation"] = recipe.attn_implementation
    if recipe.load_in_4bit:
        kwargs["quantization_config"] = build_4bit_config(kwargs["dtype"])
    with remote_code_explained(base_path):
        try:
            model = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
        except ValueError as e:  # raised before any weight is read
            if kwargs.get("attn_implementation") != "flex_attention" or "flex" not in str(e):
                raise
            log.info("this architecture has no flex_attention in transformers: sdpa instead")
            kwargs["attn_implementation"] = "sdpa"  # tree packing: the chunked SDPA tree path
            model = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def build_4bit_config(compute_dtype: Any):
    import torch

    if not torch.cuda.is_available():
        raise FincheckError("load_in_4bit (QLoRA) needs a CUDA GPU; set load_in_4bit: false")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise FincheckError("load_in_4bit needs bitsandbytes: pip install bitsandbytes") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
        bnb_4bit_quant_storage=compute_dtype,  # lets ZeRO-3 shard the 4-bit weights
    )


def build_lora_config(recipe: SFTRecipe, base: Any):
    """The recipe's LoRA. With `lora_last_layers`, adapters in the top layers only; PEFT takes
    `layers_to_transform` with module names only, so 'all-linear' is spelled out as the names of
    the base's linear layers under the LM head (what PEFT's own 'all-linear' selects)."""
    import torch
    from peft import LoraConfig

    targets: Any = recipe.lora_target_modules
    targets = targets[0] if targets == ["all-linear"] else list(targets)
    layers = None
    if recipe.lora_last_layers is not None:
        config = getattr(base.config, "text_config", None) or base.config
        total, last = config.num_hidden_layers, recipe.lora_last_layers
        if last > total:
            raise FincheckError(f"lora_last_layers={last}: the base has only {total} layers")
        layers = list(range(total - last, total))
        if targets == "all-linear":
            head = base.get_output_embeddings()
            targets = sorted(
                {
                    name.rsplit(".", 1)[-1]
                    for name, module in base.named_modules()
                    if isinstance(module, torch.nn.Linear) and module is not head
                }
            )
    return LoraConfig(
        r=recipe.lora_r,
        lora_alpha=recipe.lora_alpha,
        lora_dropout=recipe.lora_dropout,
        target_modules=targets,
        layers_to_transform=layers,
        bias="none",
        task_type="CAUSAL_LM",
    )


def run_metadata(
    recipe: SFTRecipe,
    base_path: str,
    base_fp: str,
    output_dir: Path,
    base: Any,
    tokenizer: Any,
    manifest: dict[str, Any],
    stats: dict[str, Any],
    tasks: list[str],
) -> dict[str, Any]:
    """fincheck_run.json: what the run trained (base, recipe, data, prompts, chat template),
    read back by eval, detect, merge, publish and a resume."""
    from fincheck import __version__
    from fincheck.inference.generation import template_fingerprint
    from fincheck.io.runs import relative_base
    from fincheck.models.known import KNOWN
    from fincheck.tasks import prompt_hashes
    from fincheck.train.resume import recipe_files, recipe_fingerprint

    return {
        "fincheck_version": __version__,
        # a known name (fetched wherever the adapter goes) rather than this machine's folder
        "base_model": recipe.model_name_or_path
        if recipe.model_name_or_path in KNOWN
        else relative_base(base_path, output_dir),
        **base_identity(recipe, base_path, base),
        "base_fingerprint": base_fp,
        "recipe_fingerprint": recipe_fingerprint(recipe),
        "recipe_files": recipe_files(recipe),  # what a resume compares by content
        "data_fingerprint": manifest.get("fingerprint"),
        # the mixture's tasks, not every task of the prepared folder: the card and eval read them
        "tasks": list(tasks),
        "max_length": recipe.max_length,  # the window eval fits prompts to
        "prompt_hashes": {
            t: h
            for t, h in (manifest.get("prompt_hashes") or prompt_hashes(tasks)).items()
            if t in tasks
        },
        "chat_template_hash": template_fingerprint(tokenizer, recipe.chat_template_kwargs),
        "chat_template_kwargs": recipe.chat_template_kwargs,
        "data": stats,
        # config._attn_implementation: transformers has a public setter, no getter, of the kernel
        "attn_implementation": base.config._attn_implementation,
        "world_size": recipe.world_size,
    }
