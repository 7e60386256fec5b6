"""Secrets in a recipe or a run's records, found by their place and never echoed; and the one
filter (`redact`) for what fincheck writes, uploads or prints of values it did not make.

A recipe is copied into recipe.yaml, every checkpoint's training_args.bin, the wandb config and
a published model's card: training refuses one that holds a secret, and publish refuses a run
whose recorded recipe does (a run trained before that check, a recipe.yaml edited by hand).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any

# A key named like a secret, anywhere in the recipe (`hub_token`, `model_init_kwargs: {token:
# ...}`), or a value shaped like a hub or API key: refused, named by its place, never echoed.
SECRET_KEY = re.compile(
    r"(?:^|_)(?:token|secret|password|passwd|api_?key|credentials?)$", re.IGNORECASE
)
# The shapes of hub, API and code-host tokens, searched anywhere inside a value
# (`--run_name=exp-hf_...`, `me/x:hf_...`), in whatever fincheck writes, uploads or prints.
TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
)
# Credentials a URL carries: user:password@ before the host, and keys in its query string (a
# name of at most 64 characters each side of the word: "?keykeykey…" would be rescanned from
# every "key"; a held value is redacted by value whatever its name).
# (the scheme's slashes may have been normalised away: a URL passed where a path was expected)
# (up to the last "@" before the path, as a URL reader takes it: a password may hold an "@")
# (a scheme starts only where a run of scheme characters starts, and is at most 32 long: from
# every "." of "a.a.a…" a scheme would be scanned to the run's end, quadratic on model output)
URL_USERINFO = re.compile(
    r"(?P<scheme>(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}:/{1,2})[^/\s]*@", re.IGNORECASE
)
# (a value runs to "&" or "#", as an HTTP client sends it: a ";" is part of it; never over a
# quote, a backslash or a bracket, which a URL holds only percent-encoded: the text around
# a URL written into JSON or markdown stays whole)
_QUERY_VALUE = r"[^&#\s\"'`<>\\]+"  # (not empty: "key=<redacted>" is left as it is)
URL_SECRET_QUERY = re.compile(
    r"(?P<key>[?&;][\w.~-]{0,64}(?:key|token|auth|password|passwd|secret|sig|signature|code"
    rf"|credential|session)[\w.~-]{{0,64}}=){_QUERY_VALUE}",
    re.IGNORECASE,
)
REDACTED = "<redacted>"
# Keys whose names match SECRET_KEY but hold no secret (token counts, special tokens).
NOT_SECRET_KEYS = frozenset({"pad_token", "eos_token", "bos_token", "unk_token", "sep_token",
                             "cls_token", "mask_token"})  # fmt: skip


def secret_places(value: Any, where: str = "") -> list[str]:
    """The places (`model_init_kwargs.token`) in a recipe that hold a secret."""
    if isinstance(value, dict):
        found = []
        for key, inner in value.items():
            place = f"{where}.{key}" if where else str(key)
            named = SECRET_KEY.search(str(key)) and str(key) not in NOT_SECRET_KEYS
            if named and inner not in (None, "", [], {}) and not isinstance(inner, (int, float)):
                found.append(place)
            else:
                found += secret_places(inner, place)
        return found
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in secret_places(v, f"{where}[{i}]")]
    return [where] if isinstance(value, str) and has_secret(value) else []


def has_secret(text: str) -> bool:
    """A token shape or URL credentials anywhere in `text`."""
    return redact(text) != text


# The credentials of an HTTP authorization header, whatever their length (an endpoint that
# echoes the request it refused): a scheme's value ("Authorization: Bearer k3y"), or a header
# field's whole value where the name stands as a header (a line's start, a quoted key);
# prose ("the buyback authorization: $500 million") is left alone, and so is a quoted key's
# bare number, which is JSON's, not a header's (a tokenizer's vocabulary: "Authorization": 18124).
AUTH_HEADER = re.compile(
    r"(?P<scheme>\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+"
    r"|(?:^[ \t]*(?:proxy-)?authorization[\"']?\s*[:=]\s*"
    r"|[\"'](?:proxy-)?authorization(?:[\"']\s*[:=]\s*(?!-?[0-9][0-9.eE+-]*(?:[\s,}\]]|$))"
    r"|\s*[:=]\s*))[\"']?(?:(?:bearer|basic|token)\s+)?)[^\s\"',;]+",
    re.IGNORECASE | re.MULTILINE,
)
# The secret values this process holds (an endpoint's API key, a hub token, a URL's
# credentials): redacted by value wherever they appear, whatever their shape.
_HELD: set[str] = set()
# Shorter values ("EMPTY", "none": a local server's placeholder keys) would redact ordinary
# words from every line and file; such a key is redacted where it stands as a header's value.
MIN_HELD_LENGTH = 6


def hold_secret(value: str | None) -> None:
    """Remember a secret value this run holds, so that `redact` removes it by value. The
    process's own command line is redacted too (the options were parsed already): a library
    that records it (wandb stores `sys.argv` with every run) never sees the secret, and neither
    does anyone listing the machine's processes (`hide_from_process_list`)."""
    if not value or len(value.strip()) < MIN_HELD_LENGTH:
        return
    _HELD.update({value, value.strip()})  # a server echoes a key as it read it: stripped
    sys.argv[:] = [redact(arg) for arg in sys.argv]
    hide_from_process_list()


def hide_from_process_list() -> None:
    """The command line the system shows for this process (`/proc/<pid>/cmdline`, `ps`)
    rewritten with its secrets redacted: setproctitle writes over the process's own copy of its
    arguments. Until then (the start-up, about a second) `ps` shows them; an API key given by
    its environment variable (`--api-key-env`) never is on the command line."""
    shown = [redact(arg) for arg in sys.orig_argv]
    if shown != sys.orig_argv:
        import shlex

        import setproctitle

        setproctitle.setproctitle(shlex.join(shown))
        sys.orig_argv[:] = shown


def hold_url_secrets(url: str | None) -> None:
    """Hold a URL's credentials in every form they travel in: its userinfo as written, its
    password and user as sent (percent-decoded) and as a Basic authorization header (HTTP
    clients send a URL's userinfo so), and every value of its query string and fragment."""
    if not url:
        return
    import base64
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        user, _, password = userinfo.partition(":")
        for part in (userinfo, password, unquote(password), user, unquote(user)):
            hold_secret(part)
        basic = f"{unquote(user)}:{unquote(password)}".encode()
        hold_secret(base64.b64encode(basic).decode())
    # and path parameters (`;k=v`); a component without "=" is a key given bare (`?Zq8Xv2…`)
    components = [c for c in f"{parts.query}&{parts.fragment}".split("&") if c]  # ";" is a value's
    components += [p for segment in parts.path.split("/") for p in segment.split(";")[1:] if p]
    for name, eq, value in (c.partition("=") for c in components):
        for form in url_value_forms(value if eq else name):
            hold_secret(form)


def url_value_forms(value: str) -> set[str]:
    """A URL value in every form it travels in: as written, decoded (as a server reads it:
    "+" a space), and encoded again as a client sends it (escapes in either case)."""
    from urllib.parse import quote, quote_plus, unquote, unquote_plus

    decoded = {unquote(value), unquote_plus(value)}
    sent = {quote(d, safe="") for d in decoded} | {quote_plus(d, safe="") for d in decoded}
    forms = {value, *decoded, *sent}
    for form in list(forms):  # "%2f" and "%2F" are one character
        forms.add(re.sub(r"%[0-9a-fA-F]{2}", lambda m: m.group().upper(), form))
        forms.add(re.sub(r"%[0-9a-fA-F]{2}", lambda m: m.group().lower(), form))
    return forms


def redact(text: str) -> str:
    """`text` with every secret value this run holds, every token shape, every authorization
    header's value and every URL's credentials replaced by <redacted>: what fincheck writes to
    a file, uploads or prints of a value it did not make."""
    for value in sorted(_HELD, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    text = TOKEN.sub(REDACTED, text)
    text = AUTH_HEADER.sub(lambda m: f"{m.group('scheme')}{REDACTED}", text)
    text = URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return URL_SECRET_QUERY.sub(lambda m: f"{m.group('key')}{REDACTED}", text)


def redacted_value(value: Any) -> Any:
    """A JSON-able record with every string in it (keys too) redacted before it is serialised:
    a secret is found as the run holds it, not in its escaped form (a quote or backslash in
    it, non-ASCII under `ensure_ascii`), and no redaction can cut the JSON around it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redacted_value(k): redacted_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted_value(v) for v in value]
    return value


def public_url(url: str | None) -> str | None:
    """An endpoint URL as it may be recorded and shown: without its credentials, without any
    value of its query string (an API key may sit under any name there), and without its
    fragment (which no request sends)."""
    if url is None:
        return None
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(redact(str(url)))
    components = (c.partition("=") for c in parts.query.split("&") if c)
    query = "&".join(f"{name}={REDACTED}" if eq else REDACTED for name, eq, _ in components)
    path = re.sub(r";[^/]*", f";{REDACTED}", parts.path)  # a path segment's parameters too
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


class RedactingStream:
    """A text stream (stdout, stderr) whose every write goes through `redact`: one sink for
    every line a command prints, its libraries' and progress bars' included."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """stdout and stderr through `redact` while a command runs, from its first line (a usage
    error quoting an option's value included): `sys.stdout` and `sys.stderr`, and every logging
    handler already holding one of them (a library's own handler, such as huggingface_hub's,
    keeps the stream of the moment it was imported, and would print around the filter)."""
    raw = sys.stdout, sys.stderr
    wrapped = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
    rebound = []
    for handler in handlers:
        stream = getattr(handler, "stream", None)
        dynamic = isinstance(getattr(type(handler), "stream", None), property)  # reads sys.stderr
        if isinstance(handler, logging.StreamHandler) and not dynamic and stream in raw:
            handler.setStream(wrapped[raw.index(stream)])
            rebound.append((handler, stream))
    sys.stdout, sys.stderr = wrapped
    try:
        yield
    finally:
        sys.stdout, sys.stderr = raw
        for handler, stream in rebound:
            handler.setStream(stream)
