"""A fake Hugging Face Hub on 127.0.0.1 speaking the HTTP API that huggingface_hub 2.x uses to
publish: create repo, create branch, repo info, file tree, validate-yaml, preupload, commit
(regular files and deletions); and to download a file (`resolve`: its metadata, its content).

It keeps repos in memory, checks the bearer token (401 otherwise), can be told to fail the next
N requests to an endpoint with a given status (to test retries) or to answer nothing at all on
an endpoint (`silent`: a hub that hangs), or to send a raw reply (`raw`), and records every request
(method, path, headers, body) so tests can check what was sent.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import yaml
from huggingface_hub.utils.sha import git_hash

REPO = r"(?P<repo>[^/]+/[^/]+)"


@dataclass
class FakeRepo:
    private: bool
    branches: dict[str, dict[str, bytes]] = field(default_factory=lambda: {"main": {}})
    shas: dict[str, str] = field(default_factory=lambda: {"main": "0" * 40})
    commits: int = 0


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeHub:
    def __init__(self, token: str) -> None:
        self.token = token
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[Recorded] = []
        self.failures: dict[str, list[int]] = {}  # endpoint name -> statuses to answer first
        self.silent: set[str] = set()  # endpoints that accept the request and never answer
        self.dripped: set[str] = set()  # endpoints whose status line comes a byte at a time
        # endpoint name -> (body, headers) sent as its reply, as is (a reply too large)
        self.raw: dict[str, tuple[bytes, dict[str, str]]] = {}
        # a file's content sent from a path of its own ("/cdn/..."), as the hub redirects
        # large files to its CDN: `resolve` then answers 302
        self.redirect_files = False
        self.moved: set[str] = set()  # endpoint names answered by a redirect out of /api/
        # files stored on Xet: their metadata names a Xet hash and token route, as the hub's does
        # (huggingface_hub then fetches them with hf_xet unless told not to)
        self.xet = False
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        # poll often: shutdown() waits up to one poll interval (0.5 s by default)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stopping.set()  # the silent handlers return
        self._server.shutdown()
        self._server.server_close()

    def fail_next(self, endpoint: str, *statuses: int) -> None:
        self.failures.setdefault(endpoint, []).extend(statuses)

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id].branches[branch]

    # -- request handling -------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                hub._dispatch(self, "GET")

            def do_POST(self) -> None:
                hub._dispatch(self, "POST")

            def do_HEAD(self) -> None:
                hub._dispatch(self, "HEAD")

        return Handler

    def _dispatch(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        path = h.path.split("?")[0]
        self.requests.append(Recorded(method, path, dict(h.headers.items()), body))
        routes = [
            ("POST", r"/api/repos/create", "create", self._create),
            ("POST", rf"/api/models/{REPO}/branch/(?P<rev>[^/]+)", "branch", self._branch),
            ("GET", rf"/api/models/{REPO}(?:/revision/(?P<rev>[^/]+))?", "info", self._info),
            ("GET", rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)", "tree", self._tree),
            ("POST", r"/api/validate-yaml", "validate", self._validate),
            ("POST", rf"/api/models/{REPO}/preupload/(?P<rev>[^/]+)", "preupload", self._preupload),
            ("POST", rf"/api/models/{REPO}/commit/(?P<rev>[^/]+)", "commit", self._commit),
            ("HEAD", rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "metadata", self._metadata),
            ("GET", rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve", self._resolve),
        ]
        if method == "GET" and path.startswith("/moved/"):
            body, headers = self.raw["moved"]
            return self._send(h, 200, (body, {"content-length": str(len(body)), **headers}))
        if method == "GET" and path.startswith("/cdn/"):  # no token: a signed CDN URL
            owner, name, rev, file = path.removeprefix("/cdn/").split("/", 3)
            if "cdn" in self.raw:
                body, headers = self.raw["cdn"]
                return self._send(h, 200, (body, {"content-length": str(len(body)), **headers}))
            return self._send(h, *self._file(f"{owner}/{name}", rev, file))
        for verb, pattern, name, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb != method or not match:
                continue
            if h.headers.get("authorization") != f"Bearer {self.token}":
                return self._send(h, 401, {"error": "Invalid credentials in Authorization header"})
            if name in self.silent:
                self._stopping.wait(120)
                return None
            if name in self.dripped:  # never a whole line: a read timeout never trips
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    for byte in b"HTTP/1.1 200 OK\r\n" * 1000:
                        if self._stopping.wait(0.05):
                            break
                        h.wfile.write(bytes([byte]))
                        h.wfile.flush()
                return None
            if name in self.moved:  # answered elsewhere, out of /api/: "/moved/..." sends raw
                return self._send(h, 302, (b"", {"Location": f"/moved{path}"}))
            if name in self.raw:
                body, headers = self.raw[name]
                headers = dict(headers)
                h.send_response(int(headers.pop(":status", 200)))
                for key, value in {"content-length": str(len(body)), **headers}.items():
                    h.send_header(key, value)
                h.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    h.wfile.write(body)  # the client may stop reading, as it should
                return None
            if self.failures.get(name):
                return self._send(h, self.failures[name].pop(0), {"error": "temporary failure"})
            params = {k: v.replace("%2F", "/") for k, v in match.groupdict().items() if v}
            status, payload = handler(body, **params)
            return self._send(h, status, payload)
        self._send(h, 404, {"error": f"no route {method} {path}"})

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        if isinstance(payload, tuple):  # a file: (its bytes, its headers)
            data, headers = payload
            h.send_response(status)
            for key, value in headers.items():
                h.send_header(key, value)
            h.end_headers()
            if h.command != "HEAD":
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    h.wfile.write(data)  # the client may stop reading, as it should
            return
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        if status == 404 and "repo" in json.dumps(payload):
            h.send_header("x-error-code", "RepoNotFound")
        h.end_headers()
        h.wfile.write(data)

    def _create(self, body: bytes) -> tuple[int, dict]:
        req = json.loads(body)
        repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
        if repo_id in self.repos:
            return 409, {
                "error": "You already created this model repo",
                "url": f"{self.endpoint}/{repo_id}",
            }
        self.repos[repo_id] = FakeRepo(private=req.get("visibility") == "private")
        return 200, {"url": f"{self.endpoint}/{repo_id}"}

    def _branch(self, body: bytes, repo: str, rev: str) -> tuple[int, dict]:
        r = self.repos.get(repo)
        if r is None:
            return 404, {"error": "repo not found"}
        if rev in r.branches:
            return 409, {"error": "branch exists"}
        r.branches[rev] = dict(r.branches["main"])
        r.shas[rev] = r.shas["main"]
        return 200, {}

    def _info(self, body: bytes, repo: str, rev: str = "main") -> tuple[int, dict]:
        r = self.repos.get(repo)
        if r is None or rev not in r.branches:
            return 404, {"error": "repo not found"}
        siblings = [{"rfilename": p} for p in sorted(r.branches[rev])]
        return 200, {"id": repo, "sha": r.shas[rev], "private": r.private, "siblings": siblings}

    def _tree(self, body: bytes, repo: str, rev: str) -> tuple[int, Any]:
        r = self.repos.get(repo)
        rev = next((branch for branch, sha in r.shas.items() if sha == rev), rev) if r else rev
        if r is None or rev not in r.branches:
            return 404, {"error": "repo not found"}
        files = r.branches[rev]
        return 200, [
            {"type": "file", "path": p, "oid": git_hash(files[p]), "size": len(files[p])}
            for p in sorted(files)
        ]

    def _metadata(self, body: bytes, repo: str, rev: str, path: str) -> tuple[int, Any]:
        """A file's metadata, as the hub's HEAD gives it: commit, etag, size."""
        r = self.repos.get(repo)
        rev = next((branch for branch, sha in r.shas.items() if sha == rev), rev) if r else rev
        if r is None or path not in r.branches.get(rev, {}):
            return 404, {"error": "entry not found"}
        data = r.branches[rev][path]
        headers = {
            "X-Repo-Commit": r.shas[rev],
            "ETag": f'"{git_hash(data)}"',
            "Content-Length": str(len(data)),
        }
        if self.xet:
            headers["X-Xet-Hash"] = hashlib.sha256(data).hexdigest()
            headers["X-Xet-Refresh-Route"] = f"/api/models/{repo}/xet-read-token/{r.shas[rev]}"
        return 200, (b"", headers)

    def _resolve(self, body: bytes, repo: str, rev: str, path: str) -> tuple[int, Any]:
        status, meta = self._metadata(body, repo, rev, path)
        if status != 200:
            return status, meta
        if self.redirect_files:
            return 302, (b"", {"Location": f"/cdn/{repo}/{rev}/{path}"})  # no /resolve/
        return self._file(repo, rev, path)

    def _file(self, repo: str, rev: str, path: str) -> tuple[int, Any]:
        r = self.repos[repo]
        branch = next((name for name, sha in r.shas.items() if sha == rev), rev)
        data = r.branches[branch][path]
        return 200, (data, {"Content-Length": str(len(data))})

    def _validate(self, body: bytes) -> tuple[int, dict]:
        content = json.loads(body)["content"]
        match = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        try:
            meta = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as e:
            return 400, {"errors": [{"message": f"YAML: {e}"}]}
        if not isinstance(meta, dict):
            return 400, {"errors": [{"message": "metadata must be a YAML mapping"}]}
        return 200, {"errors": [], "warnings": []}

    def _preupload(self, body: bytes, repo: str, rev: str) -> tuple[int, dict]:
        r = self.repos.get(repo)
        if r is None:
            return 404, {"error": "repo not found"}
        existing = r.branches.get(rev, {})
        files = []
        for f in json.loads(body)["files"]:
            oid = git_hash(existing[f["path"]]) if f["path"] in existing else None
            files.append(
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": oid}
            )
        return 200, {"files": files}

    def _commit(self, body: bytes, repo: str, rev: str) -> tuple[int, dict]:
        r = self.repos.get(repo)
        if r is None or rev not in r.branches:
            return 404, {"error": "repo not found"}
        for line in body.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                value = item["value"]
                r.branches[rev][value["path"]] = base64.b64decode(value["content"])
            elif item["key"] == "deletedFile":
                r.branches[rev].pop(item["value"]["path"], None)
        r.commits += 1
        sha = hashlib.sha1(f"{repo}{rev}{r.commits}".encode()).hexdigest()
        r.shas[rev] = sha
        return 200, {"commitUrl": f"{self.endpoint}/{repo}/commit/{sha}", "commitOid": sha}
