"""Publish a trained adapter to the Hugging Face Hub (or, with --dry-run, to a local folder).

Stages, top to bottom:
  1. `build_upload_folder`: copy exactly what gets uploaded (adapter, tokenizer, recipe, data
     manifest, results, a random-init base when the run made one) and render README.md.
  2. `held_token`: HF_TOKEN or the user's saved login; the token is passed to the client and
     never printed, logged or written anywhere.
  3. `push_folder`: create the repo (and branch), then one `create_commit` with every file, plus
     deletions of files an earlier publish wrote that this one does not (a stale results.json).
     The hub answers which files it already has (same git/LFS oid); unchanged files are dropped
     and an all-unchanged commit is skipped, so re-publishing the same checkpoint changes nothing.
     Transient failures (5xx, 408/429, network errors) are retried with exponential backoff;
     401/403 stop at once with a message saying what to fix.
Only global rank 0 publishes when called inside a distributed job (RANK / LOCAL_RANK).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, TypeVar

from fincheck.errors import FincheckError
from fincheck.io import jsonl
from fincheck.io.config import REQUIRED, config_field
from fincheck.io.deadline import CallDeadline, within_deadline
from fincheck.io.runs import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    LISTED_FILES,
    MANIFEST_FILE,
    RECIPE_FILE,
    RUN_METADATA,
    TOKENIZER_FILES,
    RunArtifacts,
    adapter_sha256,
    files_record,
    load_run,
)
from fincheck.io.safe_files import (
    copy_file,
    new_folder,
    open_regular_file,
    write_text,
)
from fincheck.io.secrets import has_secret, hold_secret, secret_places
from fincheck.models.loading import check_weights_file
from fincheck.serve.card import (
    hub_repo_id,
    public_recipe,
    published_base,
    read_results,
    render_card,
)
from fincheck.tasks import load_prompt, task_names

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)
AUTH_FAILURES = {
    401: "the hub rejected the token (401 Unauthorized). Set HF_TOKEN to a valid token or run "
    "`hf auth login`.",
    403: "the token has no write access to this repo (403 Forbidden). Use a token with 'write' "
    "scope for this user/organization.",
}
_sleep = time.sleep  # tests replace this to retry without waiting
# One hub call (all its attempts and waits): a 30 MB adapter goes up in seconds, a shipped
# base of a few GB on a slow link may need --hub-timeout.
HUB_DEADLINE_S = 600.0
# The paths `build_upload_folder` writes (besides base/): a re-publish may replace or remove them.
MANAGED_FILES = {"README.md", "results.json", ADAPTER_WEIGHTS, ADAPTER_CONFIG, RECIPE_FILE,
                 MANIFEST_FILE, RUN_METADATA, *TOKENIZER_FILES}  # fmt: skip


@dataclass
class PublishResult:
    repo_id: str
    revision: str
    commit_url: str | None
    changed: bool  # False when the hub already had every file (no commit was made)
    files: list[str]


def is_main_process(env: dict[str, str] | None = None) -> bool:
    """True unless RANK (global) or, without it, LOCAL_RANK names a non-zero rank."""
    env = os.environ if env is None else env
    rank = env.get("RANK", env.get("LOCAL_RANK", "0"))
    try:
        return int(rank) == 0
    except ValueError:
        return True


def build_upload_folder(
    run: RunArtifacts,
    repo_id: str,
    out_dir: Path,
    results: dict[str, Any] | None = None,
    license: str = "apache-2.0",
    base_model_id: str | None = None,
) -> list[str]:
    """Write the repo's files to `out_dir` (new or empty, never a link); return their relative
    paths, sorted. They are built in a folder beside it and moved into place only when all are
    written: a refusal half-way (a symlink out of the run, a full disk) leaves nothing behind."""
    base = published_base(run, base_model_id)
    # a secret in the recorded recipe or metadata (a run trained before training refused one, a
    # file edited by hand) would go up in recipe.yaml and the card: named by place, not echoed
    for name, record in ((RECIPE_FILE, run.recipe), (RUN_METADATA, run.metadata)):
        if places := secret_places(record or {}):
            raise FincheckError(
                f"{run.path / name}: {', '.join(places)} holds a secret (a token, a password, an "
                "API key) that publishing would upload in the recipe and the model card; remove "
                "it from the run's files (and revoke it) before publishing"
            )
    if results is not None:
        check_results_provenance(run, results)
    with new_folder(out_dir, "publish", "--dry-run") as staging:
        check_weights_file(run.path / ADAPTER_WEIGHTS, "the adapter's weights")  # no pickle goes up
        copy_regular_file(run.path / ADAPTER_WEIGHTS, staging / ADAPTER_WEIGHTS, run.root)
        adapter_config = dict(run.adapter_config)
        metadata = dict(run.metadata)
        # a base that exists only in this run is shipped as base/: never a path on this machine
        named = "base" if base.shipped is not None else base.hub_id
        if base.shipped is not None:
            copy_base_files(base.shipped, staging / "base")
        adapter_config["base_model_name_or_path"] = named
        if metadata:
            metadata["base_model"] = named
            if base.shipped is None:
                metadata["base_model_id"] = named
        write_text(staging / ADAPTER_CONFIG, json.dumps(adapter_config, indent=2) + "\n")
        for path in run.tokenizer_files:
            copy_regular_file(path, staging / path.name, run.root)
        if run.recipe:
            write_text(staging / RECIPE_FILE, public_recipe(run.recipe, base.hub_id))
        if run.manifest_path is not None:
            copy_regular_file(run.manifest_path, staging / MANIFEST_FILE, run.root)
        if metadata:
            if isinstance(metadata.get(LISTED_FILES), dict):  # now of the uploaded files
                metadata[LISTED_FILES] = files_record(staging, list(metadata[LISTED_FILES]))
            write_text(
                staging / RUN_METADATA, json.dumps(jsonl.strict_json(metadata), indent=2) + "\n"
            )
        if results is not None:
            write_text(
                staging / "results.json", json.dumps(jsonl.strict_json(results), indent=2) + "\n"
            )
        # the task prompts, so the adapter can be used without fincheck (the card's snippet)
        (staging / "prompts").mkdir()
        for task in task_names():
            copy_file(load_prompt(task).path, staging / "prompts" / f"{task}.txt")
        write_text(staging / "README.md", render_card(run, repo_id, results, license, base))
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        check_upload_holds_no_secret(staging, files)
        return [p.relative_to(staging).as_posix() for p in files]


def check_upload_holds_no_secret(out_dir: Path, files: list[Path]) -> None:
    """The upload boundary: no file about to go up (the adapter's config, tokenizer files, the
    run's records, the card) holds a token shape or URL credentials anywhere in it. Named by
    file, never echoed."""
    for path in files:
        if has_secret(upload_text(path)):
            raise FincheckError(
                f"{path.relative_to(out_dir)} of the upload holds a secret (a token or URL "
                "credentials) that publishing would make public; remove it from the run's files "
                "(and revoke it) before publishing"
            )


def upload_text(path: Path) -> str:
    """What a file about to go up says, decoded as a reader would decode it: its text, plus
    every string of it parsed as JSON (a token spelled with escapes, "\\u0068f_...", is one
    once parsed); for safetensors weights, the strings of their JSON header (its
    `__metadata__` can hold any text), not the tensor bytes."""
    raw = path.read_bytes()
    if path.suffix == ".safetensors":
        size = int.from_bytes(raw[:8], "little") if len(raw) >= 8 else 0
        header = raw[8 : 8 + size].decode("utf-8", errors="replace") if size < len(raw) else ""
        return " ".join(_json_strings(header))
    text = raw.decode("utf-8", errors="replace")
    return "\n".join([text, *_json_strings(text)])


def _json_strings(text: str) -> list[str]:
    """Every JSON string literal in `text` (keys too), each decoded on its own, whatever the
    file around it: nested past what a reader takes, holding a lone surrogate escape, or no
    JSON at all (a file the one reader refuses was left unscanned)."""
    strings = []
    for literal in _JSON_STRING.finditer(text):
        with contextlib.suppress(ValueError):
            strings.append(json.loads(literal.group()))
    return strings


# A JSON string literal on one line: linear (each character is one of the two branches).
_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def copy_regular_file(source: Path, target: Path, root: Path) -> None:
    """Copy a file of the run into the upload only if it is a regular file inside the run folder:
    a symlink could pull anything on this machine (a token, a key) into a public repo."""
    if source.is_symlink() or not source.is_file():
        raise FincheckError(
            f"{source} is a symlink or not a regular file: publish uploads only regular files "
            "inside the run folder (replace the link with the file itself)"
        )
    if not source.resolve().is_relative_to(Path(root).resolve()):
        raise FincheckError(f"{source} lies outside the run folder {root}: not uploaded")
    if source.stat().st_nlink > 1:
        # a hard link is the same bytes as a file elsewhere on this machine (a key, a token)
        raise FincheckError(
            f"{source} is a hard link ({source.stat().st_nlink} names for one file): publish "
            "uploads only files with one name; replace it with a copy of its own "
            f"(cp {source} {source}.copy && mv {source}.copy {source})"
        )
    copy_file(source, target)


# What a shipped base folder may upload (an allow-list: anything else in base/, a `.env`, a
# key, a notebook, is left out and named): its config, safetensors weights and tokenizer.
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors",
              "model-*-of-*.safetensors", "model.safetensors.index.json", "fincheck_model.json",
              *TOKENIZER_FILES)  # fmt: skip


def copy_base_files(source: Path, target: Path) -> None:
    """The files of `source` that BASE_FILES allows, each a regular file with no other name on
    this machine (a hard link shares its bytes with a file elsewhere: a key, a token); the rest
    is left out, said once."""
    target.mkdir()
    left_out = []
    for path in sorted(source.iterdir()):
        allowed = any(fnmatch(path.name, pattern) for pattern in BASE_FILES)
        if not allowed or path.is_symlink() or not path.is_file() or path.stat().st_nlink > 1:
            left_out.append(path.name)
            continue
        if path.name.endswith(".safetensors"):
            check_weights_file(path, "the adapter's weights")
        copy_file(path, target / path.name)
    if left_out:
        log.warning(
            "not uploading from %s (only a model's config, safetensors weights and tokenizer "
            "files, each a regular file without hard links, are shipped): %s",
            source,
            ", ".join(left_out),
        )


def check_results_provenance(run: RunArtifacts, results: dict[str, Any]) -> None:
    """Results go up with an adapter only if they were computed with that very adapter: the
    sha256 `fincheck eval` recorded must be the sha256 of the weights being uploaded."""
    recorded = ((results.get("run") or {}).get("adapter_sha256")) or None
    actual = adapter_sha256(run.path)
    if recorded is None:
        raise FincheckError(
            "--results does not record which adapter it evaluated (an evaluation of a base model, "
            "or results from an older fincheck): evaluate this checkpoint with `fincheck eval "
            f"--adapter {run.path}` and `fincheck score`, then publish those results"
        )
    if recorded != actual:
        raise FincheckError(
            f"--results were computed with another adapter (sha256 {recorded[:12]}...) than the "
            f"one being published ({run.path / ADAPTER_WEIGHTS}: {actual[:12]}...): evaluate this "
            "checkpoint and publish its own results"
        )


def held_token() -> str | None:
    """The user's token if there is one (HF_TOKEN, else the saved `hf auth login` token), held
    to be redacted by value in every line printed and file written, and searched for in every
    file about to go up: a dry run checks what the upload it previews would check."""
    from huggingface_hub import constants, get_token

    saved = Path(constants.HF_TOKEN_PATH)
    if not os.environ.get("HF_TOKEN") and (saved.exists() or saved.is_symlink()):
        os.close(open_regular_file(saved))  # a FIFO there: one line, not a wait in the library
    token = get_token()
    if token:
        hold_secret(token)
    return token


def with_retries(
    call: Callable[[], T], what: str, attempts: int, base_delay: float, deadline_s: float
) -> T:
    """Run `call`, retrying transient hub failures (5xx, 408/429, the network) with tenacity's
    exponential backoff (base_delay, doubling); an auth failure, or the last attempt's failure,
    is one clear FincheckError. Every attempt and every wait between them end within
    `deadline_s` (a hub that accepts the connection and never answers is given up on)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    def status(e: BaseException) -> int | None:  # an HfHubHTTPError may come without a response
        return getattr(getattr(e, "response", None), "status_code", None)

    def transient(e: BaseException) -> bool:
        if isinstance(e, HfHubHTTPError):
            return status(e) in TRANSIENT_STATUS
        return isinstance(e, (OSError, httpx2.TransportError))

    def say(state: Any) -> None:
        e = state.outcome.exception()
        reason = f"HTTP {status(e)}" if isinstance(e, HfHubHTTPError) else type(e).__name__
        log.warning(
            "%s: %s, retrying in %.1fs (attempt %d/%d)",
            what,
            reason,
            state.upcoming_sleep,
            state.attempt_number,
            attempts,
        )

    end = time.monotonic() + deadline_s
    backoff = wait_exponential(multiplier=base_delay)
    retrying = Retrying(
        stop=stop_after_attempt(attempts),
        wait=lambda state: min(backoff(state), max(0.0, end - time.monotonic())),
        retry=retry_if_exception(transient),
        before_sleep=say,
        sleep=lambda seconds: _sleep(seconds),  # tests replace _sleep
        reraise=True,
    )
    try:
        return retrying(lambda: within_deadline(call, end - time.monotonic()))
    except CallDeadline:
        raise FincheckError(
            f"{what}: no answer from the hub within {deadline_s:g} s (every attempt and the "
            "waits between them); check HF_ENDPOINT and the network, or allow longer with "
            "--hub-timeout (nothing more is sent)"
        ) from None
    except HfHubHTTPError as e:
        if status(e) in AUTH_FAILURES:
            raise FincheckError(f"{what}: {AUTH_FAILURES[status(e)]}") from None
        first = (str(e).strip() or type(e).__name__).splitlines()[0]
        raise FincheckError(f"{what} failed: HTTP {status(e)}: {first}") from None
    except ValueError as e:  # the hub rejected the card's metadata (validate-yaml)
        raise FincheckError(f"{what}: {' '.join(str(e).split())}") from None
    except (OSError, httpx2.TransportError) as e:
        raise FincheckError(
            f"{what} failed after {attempts} attempts: {type(e).__name__}"
        ) from None


def push_folder(
    folder: Path, repo_id: str, token: str, private: bool, revision: str | None, hub: Callable
) -> tuple[str | None, bool]:
    """Upload every file of `folder` in one commit. Returns (commit url, whether it changed).
    Each hub call (create, read, list, the commit) goes through `hub` (`with_retries`, its
    retries and deadline bound)."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    # HF_ENDPOINT read now: huggingface_hub reads it once, when it is first imported
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    hub(lambda: api.create_repo(repo_id, private=private, exist_ok=True), "create repo")
    if revision:
        hub(lambda: api.create_branch(repo_id, branch=revision, exist_ok=True), "create branch")
    before = hub(lambda: api.repo_info(repo_id, revision=revision).sha, "read repo")
    # repo path -> local file, in path order
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    remote = hub(lambda: api.list_repo_files(repo_id, revision=revision), "list repo files")
    # A file fincheck wrote last time but not this time (results.json, a base/ folder) would
    # contradict the new card: delete it. Files the user added by hand are left alone.
    stale = sorted(
        p for p in remote if p not in files and (p in MANAGED_FILES or p.startswith("base/"))
    )

    def commit() -> Any:
        # Fresh operations each attempt: an operation object cannot be committed twice.
        ops: list[Any] = [CommitOperationAdd(name, str(p)) for name, p in files.items()]
        ops += [CommitOperationDelete(p) for p in stale]
        return api.create_commit(
            repo_id, ops, commit_message="Publish fincheck adapter", revision=revision
        )

    info = hub(commit, "upload")
    return info.commit_url, info.oid != before


@dataclass
class PublishOptions:
    """`fincheck publish`."""

    checkpoint: str = config_field(REQUIRED, "run folder (checkpoints/<run>/)")
    repo_id: str = config_field(REQUIRED, "ORG/NAME on the hub")
    private: bool = config_field(False, "create the repo as private")
    revision: str | None = config_field(None, "branch to publish to (default: main)")
    results: Path | None = config_field(
        None, "results.json from `fincheck score` (its figures go into the model card)"
    )
    license: str = config_field(
        "apache-2.0", "card license (must be compatible with the base model's)"
    )
    base_model_id: str | None = config_field(
        None,
        "the hub id of the base (default: the one training recorded; needed when the run "
        "trained on a local folder it could not name)",
    )
    dry_run: Path | None = config_field(
        None, "write the repo folder to DIR, upload nothing", metavar="DIR"
    )
    hub_timeout: float = config_field(
        HUB_DEADLINE_S,
        "seconds one hub call may take, all its retries included (the upload is one call: "
        "raise it for a shipped base on a slow link)",
        above=0,
        metavar="SECONDS",
    )


def publish(
    opts: PublishOptions, attempts: int = 5, base_delay: float = 2.0
) -> PublishResult | None:
    """Publish a run folder as `repo_id`; None when this process is not rank 0. `attempts`
    and `base_delay`: the hub calls' retries and their first pause (doubling)."""
    if not is_main_process():
        log.info("not rank 0: skipping publish")
        return None
    repo_id, license, base_id = opts.repo_id, opts.license, opts.base_model_id
    hub_repo_id(repo_id, "--repo-id")  # before anything is built or uploaded
    run = load_run(opts.checkpoint)
    results = read_results(opts.results) if opts.results else None
    rev = opts.revision or "main"
    token = held_token()  # a dry run too: its value is searched for as the upload would
    if opts.dry_run is not None:
        files = build_upload_folder(run, repo_id, Path(opts.dry_run), results, license, base_id)
        return PublishResult(repo_id, rev, None, False, files)
    if not token:
        raise FincheckError(
            "no Hugging Face token: set HF_TOKEN to a token with write access, "
            "or run `hf auth login` once"
        )
    with tempfile.TemporaryDirectory(prefix="fincheck-publish-") as tmp:
        folder = Path(tmp) / "repo"
        files = build_upload_folder(run, repo_id, folder, results, license, base_id)
        hub = functools.partial(
            with_retries, attempts=attempts, base_delay=base_delay, deadline_s=opts.hub_timeout
        )
        url, changed = push_folder(folder, repo_id, token, opts.private, opts.revision, hub)
    return PublishResult(repo_id, rev, url, changed, files)
