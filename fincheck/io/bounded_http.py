"""HTTP replies read with bounds: an LLM endpoint's and the model hub's in memory
(`bounded_http_client`, `bound_hub_replies`), a hub file in size, a download in time
(`copy_download`).

An OpenAI-compatible endpoint is untrusted input. A reply's body is capped as it arrives and,
when it comes compressed, as it is inflated (a 1 MB gzip reply can inflate to 1 GB): past
`MAX_REPLY_BYTES` either way the read stops with `UnreadableReply`, which the caller treats as a
malformed reply. Only the encodings asked for (gzip, deflate) are accepted; fincheck inflates
them itself, so the HTTP library never inflates anything unbounded.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpx

from fincheck.errors import FincheckError
from fincheck.io.deadline import CallDeadline, abandoned_when, past_deadline, within_deadline

# A chat completion with 20 top logprobs for each of 512 tokens is about 1.5 MB of JSON.
MAX_REPLY_BYTES = 16 * 2**20
# ... read whole within ten minutes (16 MiB at 28 kB/s): a reply dripped just above the stall
# floor would otherwise take hours. A file (`MAX_HUB_FILE_BYTES`) has the stall floor alone.
MAX_REPLY_SECONDS = 600.0
# A file the hub sends (`/resolve/`), as sent and as inflated: the hub's own ceiling for a plain
# download (huggingface_hub's MAX_HTTP_DOWNLOAD_SIZE).
MAX_HUB_FILE_BYTES = 50 * 10**9
ACCEPTED = ("identity", "gzip", "x-gzip", "deflate")
# as the openai client's own pool (its DEFAULT_CONNECTION_LIMITS)
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)


class UnreadableReply(Exception):
    """A reply not read to its end: too large, or in an encoding that was not asked for."""


class _BoundedBody(httpx.SyncByteStream):
    def __init__(self, raw: Any, compressed: bool, cap: int) -> None:
        self.raw, self.cap = raw, cap
        self.inflate = (
            zlib.decompressobj(zlib.MAX_WBITS | 32) if compressed else None
        )  # gzip or zlib

    def __iter__(self) -> Iterator[bytes]:
        received = inflated = 0
        window = _StallWindow()
        budget = MAX_REPLY_SECONDS if self.cap <= MAX_REPLY_BYTES else None  # a reply in memory
        for chunk in self.raw:
            received += len(chunk)
            if received > self.cap:
                raise UnreadableReply(f"a reply of more than {self.cap:,} bytes")
            if budget is not None and time.monotonic() - window.began > budget:
                raise UnreadableReply(f"a reply not read whole within {budget:g} s")
            if window.stalled(len(chunk)):  # a body dripped: a read timeout never trips
                raise UnreadableReply(window.said)
            if self.inflate is None:
                yield chunk
                continue
            while chunk:  # inflated a bounded piece at a time: never more than the cap + 1
                try:
                    out = self.inflate.decompress(chunk, self.cap + 1 - inflated)
                except zlib.error as e:  # not gzip or zlib data (raw deflate, a broken body)
                    raise UnreadableReply(
                        f"a compressed reply that does not inflate ({e})"
                    ) from None
                inflated += len(out)
                if inflated > self.cap:
                    raise UnreadableReply(
                        f"a compressed reply that inflates to more than {self.cap:,} bytes"
                    )
                yield out
                chunk = self.inflate.unconsumed_tail
                if self.inflate.eof and self.inflate.unused_data:  # the next gzip member
                    chunk = self.inflate.unused_data
                    self.inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)
        if self.inflate is not None and not self.inflate.eof:
            raise UnreadableReply("a compressed reply cut short")

    def close(self) -> None:
        self.raw.close()


def _not_past_deadline(request: Any) -> None:
    """A request of a call abandoned at its deadline (the openai client's own retry, in the
    call's thread) is not sent."""
    if past_deadline():
        raise httpx.TimeoutException("the call's deadline has passed", request=request)


def _ask_for_what_is_read(request: httpx.Request) -> None:
    request.headers["Accept-Encoding"] = "gzip, deflate"


def _bound(cap: int, body: type = _BoundedBody):
    def bound(response: httpx.Response) -> None:
        """Runs before the body is read (an httpx response hook): the body is then read through
        `body` (a `_BoundedBody`), and httpx no longer inflates it (its Content-Encoding is
        consumed here)."""
        coding = response.headers.get("Content-Encoding", "").strip().lower() or "identity"
        if coding not in ACCEPTED:
            response.close()
            raise UnreadableReply(f"a reply in the {coding!r} encoding, which was not asked for")
        response.stream = body(response.stream, coding != "identity", cap)
        response.headers.pop("Content-Encoding", None)

    return bound


def bounded_http_client(cap: int = MAX_REPLY_BYTES, **client_options: Any) -> httpx.Client:
    """An `httpx.Client` (the openai client takes one as `http_client`) whose replies are
    capped at `cap` bytes as received and as inflated, whatever transport or proxy carries
    them."""
    hooks = {"request": [_not_past_deadline, _ask_for_what_is_read], "response": [_bound(cap)]}
    return httpx.Client(event_hooks=hooks, limits=LIMITS, follow_redirects=True, **client_options)


# Set on a request's first hop and carried through its redirects (httpx passes a request's
# extensions on): whether it asked for a file's content.
FILE_REQUEST = "fincheck_hub_file"


def _is_file_download(request: Any) -> bool:
    """A hub request for a file's content (`/resolve/`, and wherever that redirects: the CDN's
    own paths), streamed into a file by the hub's own downloader, then checked against the
    size and hash the hub announced; every other hub reply (its API's JSON, an error) is read
    into memory. Decided at the first hop, so a redirect cannot move an API reply out of its
    cap."""
    if FILE_REQUEST not in request.extensions:
        path = request.url.path
        request.extensions[FILE_REQUEST] = "/resolve/" in path and "/api/" not in path
    return request.extensions[FILE_REQUEST]


def _ask_only_for_what_is_inflated(request: Any) -> None:
    """A download keeps the encodings its library asked for (`identity`, to learn a file's
    size), less those fincheck does not inflate itself."""
    asked = request.headers.get("Accept-Encoding", "identity").split(",")
    kept = [c.strip() for c in asked if c.split(";")[0].strip().lower() in ACCEPTED]
    request.headers["Accept-Encoding"] = ", ".join(kept) or "identity"


def hub_error(where: str, problem: UnreadableReply, cap: str) -> FincheckError:
    return FincheckError(
        f"the model hub's reply to {where}: {problem}, not read (a hub {cap}); check "
        "HF_ENDPOINT and the hub's address"
    )


def bound_hub_replies(cap: int = MAX_REPLY_BYTES) -> None:
    """The model hub's replies read as an LLM endpoint's are: capped as sent and as inflated,
    in an encoding asked for, and one line when not read. An API reply, read into memory, at
    `cap` bytes; a file's content, streamed to disk, at `MAX_HUB_FILE_BYTES`. One mechanism for
    every hub call of the process, transformers' included: huggingface_hub makes its one shared
    client (again after a fork, or a dropped connection) from a factory, which this replaces by
    one that adds the bounds to what its own client holds. Called once a process can load a
    model (on import of `fincheck.models.loading`, which every route to a model goes through:
    the commands, training's processes, `Detector`, the scripts) and by the command line for
    what else reaches the hub; once is enough.

    Every byte the hub sends passes this client: huggingface_hub's Xet client (`hf_xet`, Rust,
    its own connections) is switched off, so a repository stored on Xet is fetched over the
    hub's plain download route, bounded here, as huggingface_hub does without `hf_xet`."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants as hub_constants  # a submodule: not loaded lazily

    hub_constants.HF_HUB_DISABLE_XET = True  # read at each call (is_xet_available)
    os.environ["HF_HUB_DISABLE_XET"] = "1"  # and in the processes this one starts
    template = huggingface_hub.get_session()  # the library's own client: its hooks, settings
    if getattr(template, "bounds_hub", False):
        return

    class HubBody(_BoundedBody, httpx2.SyncByteStream):
        """The bounded body on huggingface_hub's HTTP library (httpx2)."""

        where, capped = "the model hub", ""

        def __iter__(self) -> Iterator[bytes]:
            try:
                yield from super().__iter__()
            except UnreadableReply as e:
                raise hub_error(self.where, e, self.capped) from None

    def ask(request: Any) -> None:
        if past_deadline():  # a retry of a hub call abandoned at its deadline (publish's)
            raise UnreadableReply("the call's deadline has passed")
        if _is_file_download(request):
            _ask_only_for_what_is_inflated(request)
        else:
            _ask_for_what_is_read(request)

    def bound(response: Any) -> None:
        request = response.request
        # a file's content only in a reply that carries it (2xx): an error's body is read
        if _is_file_download(request) and response.is_success:  # read now: a test may lower it
            limit, capped = MAX_HUB_FILE_BYTES, f"file is capped at {MAX_HUB_FILE_BYTES:,} bytes"
        else:
            limit, capped = cap, f"reply is capped at {cap // 2**20} MiB"
        where = f"{request.method} {request.url.copy_with(query=None)}"
        inflated = response.headers.get("Content-Encoding", "identity").lower() != "identity"
        try:
            _bound(limit, HubBody)(response)
        except UnreadableReply as e:
            raise hub_error(where, e, capped) from None
        if inflated:  # the size sent is no longer the size read: the downloader uses the hub's
            response.headers.pop("Content-Length", None)
        response.stream.where, response.stream.capped = where, capped

    hooks = template.event_hooks

    class HubClient(httpx2.Client):
        """A status line and headers dripped never trip a read timeout either: each hop's come
        within `MAX_REPLY_SECONDS` of its request's last byte (an upload's body takes what it
        takes), or the call is abandoned in one line. The body is then read here, bounded."""

        def send(self, request: Any, *, stream: bool = False, **options: Any) -> Any:
            waiting: dict[str, float] = {}
            traced = request.extensions.get("trace")

            def trace(event: str, info: dict) -> None:  # httpcore's trace, in the sending thread
                if event.endswith("receive_response_headers.started"):
                    waiting["since"] = time.monotonic()
                elif event.endswith("receive_response_headers.complete"):
                    waiting.pop("since", None)
                if traced is not None:
                    traced(event, info)

            def too_long() -> str | None:
                since = waiting.get("since")
                if since is not None and time.monotonic() - since > MAX_REPLY_SECONDS:
                    return f"no status line and headers within {MAX_REPLY_SECONDS:g} s"
                return None

            request.extensions["trace"] = trace  # carried through redirects
            send = super().send
            try:
                response = abandoned_when(lambda: send(request, stream=True, **options), too_long)
            except CallDeadline:
                if (late := too_long()) is None:  # the call's own deadline: its caller says so
                    raise
                where = f"{request.method} {request.url.copy_with(query=None)}"
                problem = UnreadableReply(late)
                raise hub_error(where, problem, "reply's head must come in time") from None
            if not stream:
                try:
                    response.read()
                except BaseException:
                    response.close()
                    raise
            return response

    def bounded_client() -> Any:
        client = HubClient(
            event_hooks={
                "request": [*hooks["request"], ask],
                "response": [*hooks["response"], bound],
            },
            follow_redirects=template.follow_redirects,
            timeout=template.timeout,
        )
        client.bounds_hub = True
        return client

    huggingface_hub.set_client_factory(bounded_client)


# A download that brings fewer than this many bytes in this many seconds has stalled (a server
# that drips a byte at a time never trips a socket's read timeout): as curl's --speed-limit.
STALLED_BYTES, STALLED_WINDOW_S = 10_000, 60.0


class DownloadStalled(OSError):
    """A download slower than `STALLED_BYTES` in `STALLED_WINDOW_S`."""


def open_download(url: str) -> Any:
    """`urllib.request.urlopen(url)` whose status line and headers come within a stall window:
    a server that drips its headers never trips a read timeout either, and `copy_download`'s
    window starts at the body."""
    import urllib.request

    try:
        return within_deadline(lambda: urllib.request.urlopen(url, timeout=60), STALLED_WINDOW_S)
    except CallDeadline:
        raise DownloadStalled(
            f"the download stalled: no status line and headers in {STALLED_WINDOW_S:.0f} s"
        ) from None


class _StallWindow:
    """Bytes counted by windows of `STALLED_WINDOW_S`: a whole window that brings fewer than
    `STALLED_BYTES` has stalled (`said` says so)."""

    def __init__(self) -> None:
        self.start, self.bytes, self.said = time.monotonic(), 0, ""
        self.began = self.start

    def stalled(self, received: int) -> bool:
        self.bytes += received
        now = time.monotonic()
        if now - self.start < STALLED_WINDOW_S:
            return False
        if self.bytes < STALLED_BYTES:
            self.said = (
                f"the download stalled: {self.bytes} bytes in the last {now - self.start:.0f} s "
                f"(fewer than {STALLED_BYTES:,})"
            )
            return True
        self.start, self.bytes = now, 0
        return False


def copy_download(response: Any, out: Any, digest: Any = None, chunk: int = 1 << 20) -> int:
    """`response` (a file-like HTTP reply) copied into `out` (and into `digest`, a hashlib
    object, if given), stopped with `DownloadStalled` when a whole window brings fewer than
    `STALLED_BYTES`: a bounded time for any download, whatever its size. Returns the bytes
    copied."""
    total, window = 0, _StallWindow()
    while True:
        data = response.read1(chunk) if hasattr(response, "read1") else response.read(chunk)
        if not data:
            return total
        if digest is not None:
            digest.update(data)
        out.write(data)
        total += len(data)
        if window.stalled(len(data)):
            raise DownloadStalled(window.said)
