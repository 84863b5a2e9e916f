"""The team server's HTTP API: the FIM convention of hosted coders, on FastAPI, whatever runs the model.

`POST /v1/fim/completions` takes Mistral Codestral's / Inception Mercury's / DeepSeek's body (`model`,
`prompt` = the code before the cursor, `suffix`, `max_tokens`, `temperature`, `stop`, `n`) and answers
`{choices: [{text, finish_reason}], usage}`, so any FIM client can use a dg-lsp server and dg-lsp's
remote backend can use any FIM server. dg-lsp's extras are optional fields a FIM client never sends:
`steps`, `seed`, `document` (the newest request per document wins, older ones answer 409), `request_id`
(for `POST /v1/fim/cancel`), `language`, `span_kind`, `blank_start`, `deadline_ms`.

The security properties of the earlier hand-written server stay, enforced here so the Ray deployment and
the in-process server share them: every field typed and bounded (4xx, never a 500), bodies capped before
they are read, requests a browser sends refused (an `Origin`, or a foreign `Host` on a loopback server:
DNS rebinding), a bearer token compared in constant time (required off loopback; `/health` is exempt so
load balancers can probe), and a time limit per request after which the engine is told to stop.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dg_lsp.engine.types import Cancelled, InfillRequest, InfillResult

log = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024
"""An editor sends windows of about 1,000 tokens (a few KB); 4 MB leaves room and bounds memory."""
MAX_PROMPT_CHARS = 512 * 1024
"""Prefix plus suffix: tokenizing 20 MB used to hold the model for a minute."""
MAX_CANDIDATES = 32
MAX_TOKENS = 1024
MAX_STOPS = 8
MAX_CONCURRENT = 64
"""Requests in progress at the ingress (waiting included); more get 503 rather than queueing unbounded."""
READ_TIMEOUT_S = 10.0
"""A client that stops sending mid-body is answered 408 and its connection closed."""
OWNER = "dg-lsp"
"""`owned_by` in `GET /v1/models`: how the client knows it may send dg-lsp's extra fields."""
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}

Short = Annotated[str, Field(max_length=4096)]


class FimRequest(BaseModel):
    """A FIM completion request; strict types, so `"5"` is not a number and `true` is not 1."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: Annotated[str, Field(max_length=256)] | None = None
    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
    suffix: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] = ""
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)] = 48
    temperature: Annotated[float, Field(ge=0, le=10)] = 0.0
    stop: (
        Annotated[str, Field(max_length=64)] | Annotated[list[Short], Field(max_length=MAX_STOPS)] | None
    ) = None
    n: Annotated[int, Field(ge=1, le=MAX_CANDIDATES)] = 1
    stream: bool = False
    # dg-lsp's extras
    steps: Annotated[int, Field(ge=0, le=100_000)] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] = 0
    document: Short | None = None
    request_id: Annotated[str, Field(max_length=100)] | None = None
    language: Annotated[str, Field(max_length=64)] | None = None
    span_kind: Annotated[str, Field(max_length=64)] | None = None
    blank_start: bool = True
    deadline_ms: Annotated[float, Field(ge=0, le=3.6e6)] | None = None
    token_healing: bool = True

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def infill_request(self) -> InfillRequest:
        """The engine's request. A stop of exactly "\\n" is a single-line completion, which the engine
        can end early; other stops cut the text afterwards."""
        return InfillRequest(
            prefix=self.prompt,
            suffix=self.suffix,
            max_tokens=self.max_tokens,
            single_line="\n" in self.stops(),
            language=self.language,
            blank_start=self.blank_start,
            num_candidates=self.n,
            steps=self.steps or None,
            seed=self.seed,
            doc_key=self.document,
            deadline_ms=self.deadline_ms,
            token_healing=self.token_healing,
        )


def cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to its first stop string (not included), and whether one was found."""
    cut = min((i for s in stops if s and (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def fim_response(
    result: InfillResult, body: FimRequest, model: str, rid: str, prompt_tokens: int | None = None
) -> dict[str, Any]:
    choices = []
    stops = [s for s in body.stops() if s != "\n"]
    for i, cand in enumerate(result.candidates):
        text, stopped = cut_at_stops(cand.text, stops)
        n_tokens = len(cand.token_ids) if cand.token_ids is not None else result.stats.generated_tokens
        if body.stops() == ["\n"] or "\n" in body.stops():
            text, nl = cut_at_stops(text, ["\n"])
            stopped = stopped or nl
        ended = cand.stopped if cand.stopped is not None else n_tokens < body.max_tokens  # the model stopped
        finish = "stop" if stopped or ended else "length"
        choices.append({"index": i, "text": text, "finish_reason": finish, "mean_logprob": cand.mean_logprob})
    completion = result.stats.generated_tokens
    prompt = result.stats.prompt_tokens if prompt_tokens is None else prompt_tokens
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        "dg_lsp": {"stats": result.stats.as_dict()},
    }


class Backend(Protocol):
    """What the HTTP layer needs from whatever runs the model (Ray deployment, in-process engine)."""

    async def complete(self, rid: str, request: InfillRequest) -> InfillResult:
        """The result, or `Cancelled` once `cancel(rid)` was called (or the caller's task is cancelled)."""
        ...

    async def cancel(self, rid: str) -> None: ...

    async def describe(self) -> dict[str, str]: ...


class _Refused(Exception):
    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


def is_loopback_host(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_app(
    get_backend: Callable[[], Backend],
    *,
    token: str | None,
    host: str = "127.0.0.1",
    request_timeout_s: float = 30.0,
    model_name: str = "dg-lsp",
    watch_disconnect: bool = True,
):
    """The FastAPI app. `get_backend` is called per request: under Ray the backend is made in the
    ingress replica after this app was pickled there. `watch_disconnect` polls for a client that hung
    up (uvicorn in process); Ray Serve's proxy cancels such a request by itself, so it passes False."""
    if token is None and not is_loopback_host(host):
        raise ValueError("off loopback the server needs a bearer token")
    loopback = is_loopback_host(host)
    app = FastAPI(title="dg-lsp team server", docs_url=None, redoc_url=None, openapi_url=None)
    state: dict[str, Any] = {"latest": {}, "running": 0}

    def gate(request: Request) -> None:
        if request.headers.get("origin") is not None:
            raise _Refused(403, "cross-origin requests are refused")
        name = (request.headers.get("host") or "").rsplit(":", 1)[0].lower()
        if loopback and name and name not in _LOOPBACK_NAMES:
            raise _Refused(403, "this server answers loopback host names only")
        if token is not None and request.url.path != "/health":
            given = request.headers.get("authorization") or ""
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise _Refused(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})

    async def read_json(request: Request) -> bytes:
        if request.headers.get("transfer-encoding"):
            raise _Refused(411, "send a Content-Length, not a chunked body")
        raw_length = request.headers.get("content-length")
        if raw_length is None:
            raise _Refused(411, "Content-Length required")
        if not raw_length.strip().isdigit() or len(raw_length.strip()) > 15:
            raise _Refused(400, "bad Content-Length")
        if int(raw_length) > MAX_BODY:
            raise _Refused(413, f"body over {MAX_BODY} bytes")
        kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _Refused(415, "Content-Type must be application/json")
        try:
            return await asyncio.wait_for(request.body(), READ_TIMEOUT_S)
        except TimeoutError:
            raise _Refused(408, "the body did not arrive in time") from None

    def guarded(handler: Callable[[Request], Awaitable[Any]]):
        async def endpoint(request: Request):
            try:
                gate(request)
                return await handler(request)
            except _Refused as exc:
                # The body may be unread: this connection cannot be reused.
                headers = {"Connection": "close", **exc.headers}
                return JSONResponse({"error": exc.reason}, exc.status, headers=headers)
            except Exception as exc:  # the server keeps serving whatever one request did
                status = getattr(exc, "http_status", 500)
                if status == 500:
                    log.exception("team server: request failed")
                return JSONResponse({"error": f"{type(exc).__name__}: {str(exc)[:300]}"}, status)

        return endpoint

    async def health(request: Request):
        return JSONResponse({"ok": True})

    async def models(request: Request):
        described = await get_backend().describe()
        entry = {"id": model_name, "object": "model", "owned_by": OWNER, "dg_lsp": described}
        return JSONResponse({"object": "list", "data": [entry]})

    async def cancel(request: Request):
        raw = await read_json(request)
        try:
            rid = str(_json_object(raw).get("request_id"))[:100]
        except ValueError as exc:
            raise _Refused(400, str(exc)) from None
        await get_backend().cancel(rid)
        return JSONResponse({"ok": True})

    async def completions(request: Request):
        raw = await read_json(request)
        try:
            body = FimRequest.model_validate_json(raw)
        except ValidationError as exc:
            raise _Refused(400, _first_error(exc)) from None
        if body.stream:
            raise _Refused(400, "stream is not supported: completions are a few dozen tokens")
        if len(body.prompt) + len(body.suffix) > MAX_PROMPT_CHARS:
            raise _Refused(413, f"prompt and suffix exceed {MAX_PROMPT_CHARS} characters")
        if state["running"] >= MAX_CONCURRENT:
            raise _Refused(503, "too many requests in progress")
        rid = body.request_id or f"cmpl-{uuid.uuid4().hex}"
        limit_ms = request_timeout_s * 1000
        infill = body.infill_request()
        deadline = limit_ms if infill.deadline_ms is None else min(infill.deadline_ms, limit_ms)
        import dataclasses

        infill = dataclasses.replace(infill, deadline_ms=deadline)
        backend = get_backend()
        previous = state["latest"].get(body.document) if body.document else None
        if body.document:
            state["latest"][body.document] = rid
        if previous is not None:
            await backend.cancel(previous)  # the newest request per document wins
        state["running"] += 1
        started = time.monotonic()
        work = asyncio.ensure_future(backend.complete(rid, infill))
        watch = asyncio.ensure_future(_disconnected(request) if watch_disconnect else asyncio.Event().wait())
        try:
            done, _ = await asyncio.wait(
                {work, watch}, timeout=request_timeout_s, return_when="FIRST_COMPLETED"
            )
            if work not in done:
                work.cancel()
                await backend.cancel(rid)
                if watch in done:  # nobody is listening any more
                    return JSONResponse({"error": "client went away", "cancelled": True}, 499)
                raise _Refused(504, f"the request took longer than {request_timeout_s:g} s")
            try:
                result = work.result()
            except Cancelled:
                if time.monotonic() - started >= deadline / 1000:  # stopped by its time limit
                    raise _Refused(504, f"the request took longer than {deadline / 1000:g} s") from None
                return JSONResponse({"error": "cancelled (superseded or asked to)", "cancelled": True}, 409)
        finally:
            watch.cancel()
            state["running"] -= 1
            if body.document and state["latest"].get(body.document) == rid:
                del state["latest"][body.document]
        return JSONResponse(fim_response(result, body, body.model or model_name, rid))

    app.add_api_route("/health", guarded(health), methods=["GET"])
    app.add_api_route("/v1/models", guarded(models), methods=["GET"])
    app.add_api_route("/v1/fim/completions", guarded(completions), methods=["POST"])
    app.add_api_route("/v1/fim/cancel", guarded(cancel), methods=["POST"])

    @app.exception_handler(404)
    async def not_found(request: Request, exc):
        return JSONResponse({"error": "not found"}, 404, headers={"Connection": "close"})

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc):
        return JSONResponse({"error": "method not allowed"}, 405, headers={"Connection": "close"})

    return app


async def _disconnected(request) -> None:
    """Returns once the client hung up: its answer is no longer wanted, so the engine should stop."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.1)


def _json_object(raw: bytes) -> dict[str, Any]:
    import json

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    if not errors:
        return "invalid request"
    err = errors[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
    if err.get("type", "").startswith("json") or where == "body":
        return f"the body is not a valid JSON object: {err.get('msg', '')}"[:300]
    return f"{where}: {err.get('msg', 'invalid')}"[:300]
