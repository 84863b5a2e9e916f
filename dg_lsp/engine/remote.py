"""A team inference server and its client, stdlib only (http.server + urllib, JSON bodies).

Protocol: `POST /infill` {id, request fields} → {candidates, stats} or 409 {cancelled}; `POST /cancel`
{id}; `GET /describe`. The server runs one request at a time on its resident engine; a newer request
for the same `doc_key` cancels the older one between steps, like the language server's worker.
The client polls `should_cancel` while waiting and forwards a cancel, so the `InfillEngine` contract
(cancel between steps) holds across the network.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dg_lsp.engine.types import (
    Cancelled,
    Candidate,
    InfillEngine,
    InfillRequest,
    InfillResult,
    InfillStats,
    ShouldCancel,
)

log = logging.getLogger(__name__)

_REQUEST_FIELDS = [f.name for f in fields(InfillRequest) if f.name != "syntax_ok"]
_STATS_FIELDS = [f.name for f in fields(InfillStats)]


def request_to_json(request: InfillRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in _REQUEST_FIELDS}


def request_from_json(data: dict[str, Any]) -> InfillRequest:
    return InfillRequest(**{k: v for k, v in data.items() if k in _REQUEST_FIELDS})


def result_to_json(result: InfillResult) -> dict[str, Any]:
    return {
        "candidates": [{"text": c.text, "mean_logprob": c.mean_logprob} for c in result.candidates],
        "stats": asdict(result.stats),
    }


def result_from_json(data: dict[str, Any]) -> InfillResult:
    cands = [
        Candidate(text=c["text"], mean_logprob=float(c.get("mean_logprob", 0.0))) for c in data["candidates"]
    ]
    stats = InfillStats(**{k: v for k, v in data.get("stats", {}).items() if k in _STATS_FIELDS})
    return InfillResult(cands, stats)


# -- server ---------------------------------------------------------------------------------------


class _State:
    def __init__(self, engine: InfillEngine):
        self.engine = engine
        self.model_lock = threading.Lock()  # one request on the model at a time
        self.lock = threading.Lock()
        self.cancelled: set[str] = set()
        self.latest: dict[str, str] = {}  # doc_key -> newest request id

    def should_cancel(self, rid: str, doc_key: str | None) -> bool:
        with self.lock:
            superseded = doc_key is not None and self.latest.get(doc_key) != rid
            return rid in self.cancelled or superseded


def make_server(engine: InfillEngine, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A ready (not yet serving) HTTP server around `engine`; port 0 picks a free port."""
    state = _State(engine)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # route through logging, not stderr
            log.debug("remote: " + fmt, *args)

        def _send(self, code: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):
            if self.path == "/describe":
                self._send(200, dict(state.engine.describe()))
            elif self.path == "/health":
                self._send(200, {"ok": True})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            try:
                body = self._body()
            except (ValueError, json.JSONDecodeError) as exc:
                self._send(400, {"error": f"bad JSON: {exc}"})
                return
            if self.path == "/cancel":
                with state.lock:
                    state.cancelled.add(str(body.get("id")))
                self._send(200, {"ok": True})
                return
            if self.path != "/infill":
                self._send(404, {"error": "not found"})
                return
            rid = str(body.pop("id", uuid.uuid4().hex))
            try:
                request = request_from_json(body)
            except TypeError as exc:
                self._send(400, {"error": str(exc)})
                return
            with state.lock:
                if request.doc_key is not None:
                    state.latest[request.doc_key] = rid
            try:
                with state.model_lock:
                    result = state.engine.infill(request, lambda: state.should_cancel(rid, request.doc_key))
                self._send(200, result_to_json(result))
            except Cancelled:
                self._send(409, {"cancelled": True})
            except Exception as exc:  # the client shows the reason; the server keeps serving
                log.exception("remote infill failed")
                self._send(500, {"error": f"{type(exc).__name__}: {exc}"})
            finally:
                with state.lock:
                    state.cancelled.discard(rid)

    return ThreadingHTTPServer((host, port), Handler)


def serve(engine: InfillEngine, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve `engine` until interrupted (what `dg-lsp serve-engine` runs)."""
    server = make_server(engine, host, port)
    log.info("serving %s on http://%s:%d", engine.name, *server.server_address[:2])
    try:
        server.serve_forever()
    finally:
        server.server_close()


# -- client ---------------------------------------------------------------------------------------


class RemoteError(RuntimeError):
    """The remote server failed or could not be reached; the message is user-readable."""


class RemoteEngine:
    """`InfillEngine` over HTTP; polls `should_cancel` every `poll_s` while the server works."""

    name = "remote"

    def __init__(self, url: str, timeout_s: float = 30.0, poll_s: float = 0.01, check: bool = True):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dg-lsp-remote")
        self._remote: dict[str, str] = {}
        if check:
            from dg_lsp.engine.loader import ModelLoadError

            try:
                self._remote = self._call("GET", "/describe")
            except RemoteError as exc:
                raise ModelLoadError(f"remote engine at {self.url} is not reachable: {exc}") from exc

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            payload = json.loads(exc.read() or b"{}")
            if exc.code == 409 and payload.get("cancelled"):
                raise Cancelled() from None
            raise RemoteError(payload.get("error") or f"HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise RemoteError(str(getattr(exc, "reason", exc))) from None

    def infill(self, request: InfillRequest, should_cancel: ShouldCancel | None = None) -> InfillResult:
        rid = uuid.uuid4().hex
        if should_cancel is not None and should_cancel():
            raise Cancelled()
        future = self._pool.submit(self._call, "POST", "/infill", {"id": rid, **request_to_json(request)})
        while True:
            try:
                data = future.result(timeout=self.poll_s)
                return result_from_json(data)
            except TimeoutError:
                if should_cancel is not None and should_cancel():
                    try:
                        self._call("POST", "/cancel", {"id": rid})
                    except RemoteError:
                        pass
                    raise Cancelled() from None

    def warmup(self) -> None:
        self._call("GET", "/health")

    def describe(self) -> dict[str, str]:
        remote = {f"remote_{k}": str(v) for k, v in self._remote.items()}
        return {"backend": self.name, "model": self.url, **remote}
