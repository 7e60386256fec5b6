"""A fake OpenAI-compatible chat-completions server on 127.0.0.1 for judge tests (real HTTP).

`script[trigger]` is a list of actions for requests whose messages contain `trigger`, used in
order (the last one repeats):
  ("ok", text)                   200 with `text` as the assistant message
  ("status", code, headers)      an error status with the given headers
  ("sleep", seconds, text)       answer `text` after sleeping (to trip client timeouts)
  ("drip", seconds)              a 200 whose body arrives one byte every `seconds`, for ever
                                 (each read is quick: only a deadline on the call stops it)
  ("html", body)                 200 with an HTML page (a login wall, a wrong URL)
  ("logprobs", text, {tok: lp})  `text`, and those top logprobs at the first token when the
                                 request asks for logprobs
  ("raw", body, when[, headers])  200 with `body` (bytes or str) as application/json, for requests
                                 that ask for logprobs when `when` is "logprobs", for all when
                                 "always"; else as ("ok", "Yes"). `headers`: sent with it
                                 (Content-Encoding: gzip for a body compressed here)
  ("refuse", param, error, text) a 400 with `error` as the body's error object when the request
                                 carries `param`, else 200 with `text` (a server that does not
                                 support an option)
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeJudgeServer:
    def __init__(self) -> None:
        self.script: dict[str, list[tuple]] = {}
        self.stopping = False  # ends the dripping answers
        self.requests: list[dict] = []  # every request body received, in order
        self.paths: list[str] = []  # ... and the path (with its query) it was sent to
        self.auth_headers: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests being handled at once
        self.openapi: dict | None = None  # served at /openapi.json when set (else 404)
        self.openapi_drip_s: float = 0.0  # > 0: the schema sent one byte every that many seconds
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_GET(self) -> None:  # a FastAPI server's schema, when the test gives one
                if self.path != "/openapi.json" or server.openapi is None:
                    self.send_error(404)
                    return
                data = json.dumps(server.openapi).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not server.openapi_drip_s:
                    self.wfile.write(data)
                    return
                for byte in data[:60]:  # each read in time, the reply never
                    try:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(server.openapi_drip_s)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server._lock:
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                    server.requests.append(body)
                    server.paths.append(self.path)
                    server.auth_headers.append(self.headers.get("Authorization", ""))
                    action = server._next_action(body)
                try:
                    self._answer(action, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1

            def _answer(self, action: tuple, body: dict) -> None:
                kind = action[0]
                if kind == "refuse":
                    if action[1] in body:
                        self._send(400, {"error": action[2]}, {})
                        return
                    action = ("ok", action[3])
                    kind = "ok"
                if kind == "status":
                    self._send(action[1], {"error": {"message": "scripted failure"}}, action[2])
                    return
                if kind == "raw" and (action[2] == "always" or body.get("logprobs")):
                    data = action[1] if isinstance(action[1], bytes) else action[1].encode()
                    headers = action[3] if len(action) > 3 else {}
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self._send_bytes(200, data, "application/json", headers)
                    return
                if kind == "raw":
                    action, kind = ("ok", "Yes"), "ok"
                if kind == "drip":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
                        while not server.stopping:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(action[1])
                    return
                if kind == "html":
                    self._send_bytes(200, action[1].encode(), "text/html", {})
                    return
                if kind == "sleep":
                    time.sleep(action[1])
                text = action[1] if kind == "logprobs" else action[-1]
                completion = {
                    "id": "cmpl-fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "fake"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                if kind == "logprobs" and body.get("logprobs"):
                    top = [
                        {"token": token, "logprob": lp, "bytes": None}
                        for token, lp in action[2].items()
                    ]
                    first = {**top[0], "top_logprobs": top}
                    completion["choices"][0]["logprobs"] = {"content": [first]}
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(200, completion, {})  # the client may have timed out and gone

            def _send(self, code: int, payload: dict, headers: dict) -> None:
                self._send_bytes(code, json.dumps(payload).encode(), "application/json", headers)

            def _send_bytes(self, code: int, data: bytes, content_type: str, headers: dict) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # poll often: shutdown() waits up to one poll interval (0.5 s by default)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def _next_action(self, body: dict) -> tuple:
        text = "\n".join(m["content"] for m in body["messages"])
        for trigger, actions in self.script.items():
            if trigger in text:
                return actions.pop(0) if len(actions) > 1 else actions[0]
        return ("status", 400, {})

    def calls_for(self, trigger: str) -> int:
        return sum(trigger in "\n".join(m["content"] for m in r["messages"]) for r in self.requests)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> FakeJudgeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping = True
        self.httpd.shutdown()
        self.httpd.server_close()
