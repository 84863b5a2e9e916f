"""A team inference server and its client, stdlib only (http.server + urllib, JSON bodies).

Protocol: `POST /infill` {id, request fields} → {candidates, stats} or 409 {cancelled}; `POST /cancel`
{id}; `GET /describe`. The server runs one request at a time on its resident engine; a newer request
for the same `doc_key` cancels the older one between steps, like the language server's worker.
The client polls `should_cancel` while waiting and forwards a cancel, so the `InfillEngine` contract
(cancel between steps) holds across the network.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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

MAX_BODY = 4 * 1024 * 1024
"""An editor sends windows of about 1,000 tokens (a few KB); 4 MB leaves room and bounds memory."""
MAX_PROMPT_CHARS = 512 * 1024
"""Prefix plus suffix: tokenizing 20 MB used to hold the model for a minute."""
MAX_CANDIDATES = 32
MAX_TOKENS = 1024
MAX_CONCURRENT = 16
"""Requests in progress (waiting for the model included); more get 503 instead of a thread each."""
READ_TIMEOUT_S = 10.0
TOKEN_ENV = "DG_LSP_ENGINE_TOKEN"
TOKEN_CAP = 4096
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


class BadRequest(Exception):
    """A request the server will not run: (HTTP status, reason for the client)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def load_token(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The shared secret: the first line of `path` (a regular file), else `$DG_LSP_ENGINE_TOKEN`."""
    from dg_lsp.files import read_regular_file

    if path:
        token = read_regular_file(Path(path), TOKEN_CAP).decode("utf-8", "replace").strip()
        if not token:
            raise ValueError(f"token file {path} is empty")
        return token
    token = (environ if environ is not None else os.environ).get(TOKEN_ENV, "").strip()
    return token or None


def _whole(data: dict[str, Any], name: str, lo: int, hi: int, optional: bool = False) -> None:
    value = data.get(name)
    if value is None and (optional or name not in data):
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest(400, f"{name} must be a whole number from {lo} to {hi}")


def _text(data: dict[str, Any], name: str, optional: bool = True) -> None:
    value = data.get(name)
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise BadRequest(400, f"{name} must be a string")


def validate_infill(data: Any) -> InfillRequest:
    """An `InfillRequest` from a JSON body, every field typed and bounded; `BadRequest` otherwise."""
    if not isinstance(data, dict):
        raise BadRequest(400, "the body must be a JSON object")
    _text(data, "prefix", optional=False)
    _text(data, "suffix", optional=False)
    if len(data["prefix"]) + len(data["suffix"]) > MAX_PROMPT_CHARS:
        raise BadRequest(413, f"prefix and suffix exceed {MAX_PROMPT_CHARS} characters")
    _whole(data, "max_tokens", 1, MAX_TOKENS)
    _whole(data, "num_candidates", 1, MAX_CANDIDATES)
    _whole(data, "steps", 0, 100_000, optional=True)  # time, not steps, is what the server caps
    _whole(data, "seed", 0, 2**63 - 1)
    for name in ("language", "doc_key"):
        _text(data, name)
        if isinstance(data.get(name), str) and len(data[name]) > 4096:
            raise BadRequest(400, f"{name} is too long")
    for name in ("single_line", "blank_start"):
        if name in data and not isinstance(data[name], bool):
            raise BadRequest(400, f"{name} must be true or false")
    deadline = data.get("deadline_ms")
    if deadline is not None and (
        isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 <= deadline <= 3.6e6
    ):
        raise BadRequest(400, "deadline_ms must be a number of milliseconds")
    return request_from_json(data)


class _State:
    def __init__(self, engine: InfillEngine, token: str | None, request_timeout_s: float):
        self.engine = engine
        self.token = token
        self.request_timeout_s = request_timeout_s
        self.model_lock = threading.Lock()  # one request on the model at a time
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT)
        self.lock = threading.Lock()
        self.cancelled: set[str] = set()
        self.latest: dict[str, str] = {}  # doc_key -> newest request id

    def should_cancel(self, rid: str, doc_key: str | None) -> bool:
        with self.lock:
            superseded = doc_key is not None and self.latest.get(doc_key) != rid
            return rid in self.cancelled or superseded


def make_server(
    engine: InfillEngine,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    request_timeout_s: float = 30.0,
) -> ThreadingHTTPServer:
    """A ready (not yet serving) HTTP server around `engine`; port 0 picks a free port.

    Every request is bounded (body, prompt, candidates, time on the model), refused when a browser sent
    it (an `Origin` header, or a `Host` that is not loopback on a loopback server: DNS rebinding), and
    needs `Authorization: Bearer TOKEN` when a token is set.
    """
    state = _State(engine, token, request_timeout_s)
    loopback = _is_loopback_host(host)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S  # a client that stops sending mid-body frees its thread

        def log_message(self, fmt, *args):  # route through logging, not stderr
            log.debug("remote: " + fmt, *args)

        def _send(self, code: int, body: dict[str, Any], close: bool = False) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(raw)

        def _gate(self) -> None:
            """Who may ask at all: not a browser, and the token holder when there is a token."""
            if self.headers.get("Origin") is not None:
                raise BadRequest(403, "cross-origin requests are refused")
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0] if self.headers.get("Host") else ""
            if loopback and host and host.lower() not in _LOOPBACK_NAMES:
                raise BadRequest(403, "this server answers loopback host names only")
            if state.token is not None and self.path != "/health":  # liveness checks need no secret
                given = self.headers.get("Authorization") or ""
                if not hmac.compare_digest(given.encode(), f"Bearer {state.token}".encode()):
                    raise BadRequest(401, "a valid bearer token is required")

        def _body(self) -> dict[str, Any]:
            if self.headers.get("Transfer-Encoding"):
                raise BadRequest(411, "send a Content-Length, not a chunked body")
            raw_length = self.headers.get("Content-Length")
            if raw_length is None:
                raise BadRequest(411, "Content-Length required")
            if not raw_length.strip().isdigit() or len(raw_length.strip()) > 15:
                raise BadRequest(400, "bad Content-Length")
            length = int(raw_length)
            if length > MAX_BODY:
                raise BadRequest(413, f"body over {MAX_BODY} bytes")
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if content_type != "application/json":
                raise BadRequest(415, "Content-Type must be application/json")
            try:
                raw = self.rfile.read(length)
            except TimeoutError:
                raise BadRequest(408, "the body did not arrive in time") from None
            if len(raw) < length:
                raise BadRequest(400, "the body is shorter than its Content-Length")
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError):
                raise BadRequest(400, "the body is not valid JSON") from None
            if not isinstance(data, dict):
                raise BadRequest(400, "the body must be a JSON object")
            return data

        def _answer(self, work) -> None:
            if not state.slots.acquire(blocking=False):
                self._send(503, {"error": "too many requests in progress"}, close=True)
                return
            try:
                self._gate()
                work()
            except BadRequest as exc:
                # The body may be unread (refused before reading): this connection cannot be reused.
                self._send(exc.status, {"error": exc.reason}, close=True)
            except Exception as exc:  # the server keeps serving whatever one request did
                log.exception("remote request failed")
                self._send(500, {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}, close=True)
            finally:
                state.slots.release()

        def do_GET(self):
            self._answer(self._get)

        def do_POST(self):
            self._answer(self._post)

        def _get(self) -> None:
            if self.path == "/describe":
                self._send(200, dict(state.engine.describe()))
            elif self.path == "/health":
                self._send(200, {"ok": True})
            else:
                self._send(404, {"error": "not found"})

        def _post(self) -> None:
            if self.path not in ("/cancel", "/infill"):
                raise BadRequest(404, "not found")
            body = self._body()
            if self.path == "/cancel":
                with state.lock:
                    if len(state.cancelled) < 10_000:
                        state.cancelled.add(str(body.get("id"))[:100])
                self._send(200, {"ok": True})
                return
            rid = str(body.pop("id", None) or uuid.uuid4().hex)[:100]
            request = validate_infill(body)
            self._infill(rid, request)

        def _infill(self, rid: str, request: InfillRequest) -> None:
            limit = state.request_timeout_s
            budget = limit * 1000 if request.deadline_ms is None else min(request.deadline_ms, limit * 1000)
            request = dataclasses.replace(request, deadline_ms=budget)
            with state.lock:
                if request.doc_key is not None:
                    state.latest[request.doc_key] = rid
            if not state.model_lock.acquire(timeout=limit):
                raise BadRequest(503, f"the model was busy for {limit:g} s")
            deadline = time.monotonic() + limit
            expired = False

            def should_cancel() -> bool:
                nonlocal expired
                expired = time.monotonic() > deadline
                return expired or state.should_cancel(rid, request.doc_key)

            try:
                result = state.engine.infill(request, should_cancel)
            except Cancelled:
                if expired:
                    raise BadRequest(504, f"the request took longer than {limit:g} s") from None
                self._send(409, {"cancelled": True})
                return
            finally:
                state.model_lock.release()
                with state.lock:
                    state.cancelled.discard(rid)
                    if request.doc_key is not None and state.latest.get(request.doc_key) == rid:
                        del state.latest[request.doc_key]
            self._send(200, result_to_json(result))

    return ThreadingHTTPServer((host, port), Handler)


def _is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    engine: InfillEngine,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    request_timeout_s: float = 30.0,
) -> None:
    """Serve `engine` until interrupted (what `dg-lsp serve-engine` runs)."""
    server = make_server(engine, host, port, token, request_timeout_s)
    auth = "bearer token required" if token else "no token (loopback only)"
    log.info("serving %s on http://%s:%d (%s)", engine.name, *server.server_address[:2], auth)
    try:
        server.serve_forever()
    finally:
        server.server_close()


# -- client ---------------------------------------------------------------------------------------


class RemoteError(RuntimeError):
    """The remote server failed or could not be reached; the message is user-readable."""


MAX_RESPONSE = 16 * 1024 * 1024


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect would carry the request (and its token) to a server nobody allowed."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl} refused", headers, fp)


# No proxies: the bearer token and the user's code go to the engine named, not to whatever
# HTTP_PROXY says.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


class RemoteEngine:
    """`InfillEngine` over HTTP; polls `should_cancel` every `poll_s` while the server works.

    Sends `Authorization: Bearer $DG_LSP_ENGINE_TOKEN` when that variable is set (it is never logged).
    """

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
        token = os.environ.get(TOKEN_ENV, "").strip()
        if token:
            req.add_unredirected_header("Authorization", f"Bearer {token}")
        try:
            with _OPENER.open(req, timeout=self.timeout_s) as resp:
                return _json_object(resp.read(MAX_RESPONSE + 1))
        except urllib.error.HTTPError as exc:
            try:
                payload = _json_object(exc.read(64 * 1024) or b"{}")
            except RemoteError:
                payload = {}
            if exc.code == 409 and payload.get("cancelled"):
                raise Cancelled() from None
            raise RemoteError(str(payload.get("error") or f"HTTP {exc.code}")) from None
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


def _json_object(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_RESPONSE:
        raise RemoteError(f"the engine's answer is over {MAX_RESPONSE} bytes")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise RemoteError("the engine's answer is not JSON") from None
    if not isinstance(data, dict):
        raise RemoteError("the engine's answer is not a JSON object")
    return data
