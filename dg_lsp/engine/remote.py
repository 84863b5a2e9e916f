"""The remote backend (`model = remote:URL`): an engine reached over the FIM HTTP convention.

It talks to a team's `dg-lsp serve-engine` (dg_lsp/team/), or to any server with Mistral Codestral's /
Inception Mercury's `POST /v1/fim/completions`. `GET /v1/models` tells which: a model `owned_by`
"dg-lsp" accepts dg-lsp's extra fields (steps, seed, document, request id) and `POST /v1/fim/cancel`;
anything else gets the plain FIM body. A URL whose path ends in `/completions` is used as the endpoint
as it is (DeepSeek's `https://api.deepseek.com/beta/completions`); a `#name` after the URL names the
model to ask for (`remote:https://api.mistral.ai#codestral-latest`).

Which secret is sent is never a workspace setting's choice: a setting arrives over the editor's socket
and could aim another service's key at a server that logs it. The key is read from an environment
variable named locally: `--api-key-env NAME` on the command line (for the `--model remote:URL` given
there), `remote_api_keys = {"URL" = "NAME"}` in ~/.config/dg-lsp/config.toml, else
`DG_LSP_ENGINE_TOKEN`. Its value is read per request, sent only as `Authorization: Bearer`, and never
logged or shown (errors name the variable, not the value).

Transport: urllib3 with its `Retry` (connection failures, and 502/503 from a restarting replica or a
full queue, with backoff; a FIM completion has no side effects, so POST is retried too), no proxies (the
code and the key go to the engine named, not to whatever `HTTP_PROXY` says), no redirects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dg_lsp.engine.types import (
    Cancelled,
    Candidate,
    InfillRequest,
    InfillResult,
    InfillStats,
    ShouldCancel,
)

log = logging.getLogger(__name__)

TOKEN_ENV = "DG_LSP_ENGINE_TOKEN"
"""The default variable holding the key, and the server's own token (`dg-lsp serve-engine`)."""
KEY_ENV_ENV = "DG_LSP_API_KEY_ENV"
"""Set by `--api-key-env NAME`: which variable holds the key for the engine named on the command line."""
KEY_URL_ENV = "DG_LSP_API_KEY_URL"
"""... and that engine's URL: the named variable is sent there and nowhere else."""
TOKEN_CAP = 4096
MAX_RESPONSE = 16 * 1024 * 1024
_STATS_FIELDS = set(InfillStats.__dataclass_fields__)


class RemoteError(RuntimeError):
    """The remote server failed or could not be reached; the message is user-readable."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def fim_body(
    request: InfillRequest,
    model: str | None,
    extras: bool,
    request_id: str | None = None,
    scope: str | None = None,
) -> dict:
    """The JSON body for `request`; without `extras` only the fields every FIM server knows. A single-line
    span is `stop: ["\\n"]`, the convention's way to ask for one line.

    With `scope` (one per client), the document key is a hash of scope and key: the team server lets the
    newest request per document win, and two users whose files share a path (the same container layout,
    the same checkout path) must not cancel each other's requests or share a prompt cache. The hash also
    keeps local paths off the server."""
    body: dict[str, Any] = {
        "prompt": request.prefix,
        "suffix": request.suffix,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "n": request.num_candidates,
    }
    if model:
        body["model"] = model
    if request.single_line:
        body["stop"] = ["\n"]
    if extras:
        body.update(seed=request.seed, blank_start=request.blank_start)
        optional = {
            "steps": request.steps,
            "document": _scoped(request.doc_key, scope),
            "language": request.language,
            "deadline_ms": request.deadline_ms,
            "request_id": request_id,
            "token_healing": None if request.token_healing else False,  # sent only when turned off
        }
        body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _scoped(doc_key: str | None, scope: str | None) -> str | None:
    if doc_key is None or scope is None:
        return doc_key
    return hashlib.sha256(f"{scope}\0{doc_key}".encode()).hexdigest()[:32]


def load_token(path: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The server's shared secret: the first line of `path` (a regular file), else `$DG_LSP_ENGINE_TOKEN`."""
    from dg_lsp.files import read_regular_file

    if path:
        token = read_regular_file(Path(path), TOKEN_CAP).decode("utf-8", "replace").strip()
        if not token:
            raise ValueError(f"token file {path} is empty")
        return token
    token = (environ if environ is not None else os.environ).get(TOKEN_ENV, "").strip()
    return token or None


def api_key_env(url: str, environ: Mapping[str, str] = os.environ) -> str:
    """The name of the variable whose value is sent to `url`, from local choices only (see above)."""
    from dg_lsp.settings import _read_config, config_path

    if environ.get(KEY_ENV_ENV, "").strip() and environ.get(KEY_URL_ENV, "") == _norm(url):
        return environ[KEY_ENV_ENV].strip()
    config, _ = _read_config(config_path(environ))
    table = config.get("remote_api_keys")
    if isinstance(table, dict):
        for key, name in table.items():
            if isinstance(key, str) and isinstance(name, str) and _norm(key) == _norm(url) and name.strip():
                return name.strip()
    return TOKEN_ENV


def _norm(url: str) -> str:
    return url.removeprefix("remote:").strip().split("#", 1)[0].rstrip("/")


class RemoteEngine:
    """`InfillEngine` over the FIM HTTP API; polls `should_cancel` every `poll_s` while the server works."""

    name = "remote"

    def __init__(
        self,
        url: str,
        timeout_s: float = 30.0,
        poll_s: float = 0.05,
        check: bool = True,
        retries: int = 3,
        environ: Mapping[str, str] | None = None,
    ):
        import urllib3

        base, _, model = url.strip().partition("#")
        self.url = base.rstrip("/")
        self.model: str | None = model or None
        path = urlsplit(self.url).path
        if path.endswith("/completions"):
            self.endpoint, self.root = self.url, self.url.rsplit("/", 1)[0]
        else:
            self.endpoint, self.root = self.url + "/v1/fim/completions", self.url
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._environ = os.environ if environ is None else environ
        self.key_env = api_key_env(self.url, self._environ)
        self.extras = False
        self.scope = uuid.uuid4().hex  # this client's documents, apart from other clients' (fim_body)
        retry = urllib3.Retry(
            total=retries,
            connect=retries,
            read=0,  # a read timeout means the server is working on it: do not start it twice
            status=retries,
            status_forcelist=(502, 503),
            allowed_methods=None,  # POST too: a completion changes nothing on the server
            backoff_factor=0.1,
            backoff_max=2.0,
            raise_on_status=False,
            respect_retry_after_header=True,
            redirect=0,
            raise_on_redirect=False,
        )
        self._http = urllib3.PoolManager(num_pools=4, maxsize=8, retries=retry)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="dg-lsp-remote")
        self._remote: dict[str, str] = {}
        if check:
            from dg_lsp.engine.loader import ModelLoadError

            try:
                self._discover()
            except RemoteError as exc:
                raise ModelLoadError(f"remote engine at {self.url} is not reachable: {exc}") from exc

    def _discover(self) -> None:
        """Ask `GET /v1/models` which model to name and whether the server is a dg-lsp one."""
        try:
            data = self._call("GET", self.root + "/v1/models")
        except RemoteError as exc:
            if exc.status != 404:
                raise
            data = {}  # a FIM server without a model list: plain FIM, the model from `#name` or none
        entries = [e for e in data.get("data") or [] if isinstance(e, dict)]
        ours = [e for e in entries if e.get("owned_by") == "dg-lsp"]
        self.extras = bool(ours)
        if self.model is None and entries:
            self.model = str((ours or entries)[0].get("id") or "") or None
        described = (ours[0].get("dg_lsp") if ours else None) or {}
        self._remote = {str(k): str(v) for k, v in described.items()} if isinstance(described, dict) else {}

    def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import urllib3

        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = self._environ.get(self.key_env, "").strip()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        try:
            resp = self._http.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=urllib3.Timeout(connect=min(5.0, self.timeout_s), read=self.timeout_s),
                redirect=False,
                preload_content=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            raise RemoteError(_scrub(str(reason), key)) from None
        try:
            raw = resp.read(MAX_RESPONSE + 1)
        finally:
            resp.release_conn()
        if 300 <= resp.status < 400:
            raise RemoteError(f"redirect to {resp.headers.get('Location', '?')} refused")
        payload = _json_object(raw) if raw else {}
        if resp.status == 409 and payload.get("cancelled"):
            raise Cancelled()
        if resp.status == 401:
            raise RemoteError(f"the engine refused the key (HTTP 401): set ${self.key_env}", 401)
        if resp.status >= 400:
            error = payload.get("error") or payload.get("message") or payload.get("detail") or ""
            raise RemoteError(_scrub(f"HTTP {resp.status}: {str(error)[:300]}", key), resp.status)
        return payload

    def infill(self, request: InfillRequest, should_cancel: ShouldCancel | None = None) -> InfillResult:
        rid = f"cmpl-{uuid.uuid4().hex}"
        if should_cancel is not None and should_cancel():
            raise Cancelled()
        body = fim_body(request, self.model, self.extras, rid, scope=self.scope)
        future = self._pool.submit(self._call, "POST", self.endpoint, body)
        while True:
            try:
                return self._result(future.result(timeout=self.poll_s), request)
            except FutureTimeout:
                if should_cancel is not None and should_cancel():
                    if self.extras:
                        try:
                            self._call("POST", self.root + "/v1/fim/cancel", {"request_id": rid})
                        except (RemoteError, Cancelled):
                            pass
                    raise Cancelled() from None

    def _result(self, data: dict[str, Any], request: InfillRequest) -> InfillResult:
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise RemoteError("the engine's answer has no choices")
        cands = []
        for choice in choices[: max(1, request.num_candidates)]:
            if not isinstance(choice, dict) or not isinstance(choice.get("text"), str):
                raise RemoteError("the engine's answer has a choice without text")
            score = choice.get("mean_logprob")
            score = float(score) if isinstance(score, int | float) and not isinstance(score, bool) else 0.0
            finish = choice.get("finish_reason")
            stopped = finish == "stop" if finish in ("stop", "length") else None
            cands.append(Candidate(text=choice["text"], mean_logprob=score, stopped=stopped))
        raw_stats = (data.get("dg_lsp") or {}).get("stats") if isinstance(data.get("dg_lsp"), dict) else None
        if isinstance(raw_stats, dict):
            stats = InfillStats(**{k: v for k, v in raw_stats.items() if k in _STATS_FIELDS})
        else:
            usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
            stats = InfillStats(
                generated_tokens=int(usage.get("completion_tokens") or 0),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
            )
        return InfillResult(cands, stats)

    def warmup(self) -> None:
        if self.extras:  # a hosted FIM server may have no /health; its model list was already asked
            self._call("GET", self.root + "/health")

    def describe(self) -> dict[str, str]:
        remote = {f"remote_{k}": v for k, v in self._remote.items()}
        return {
            "backend": self.name,
            "model": self.url,
            "fim_model": str(self.model),
            "api": "dg-lsp FIM" if self.extras else "FIM",
            "key_from": f"${self.key_env}",
            **remote,
        }


def _scrub(text: str, key: str) -> str:
    """Error text with the key removed, whatever a server or library put in it."""
    return text.replace(key, "***") if key else text


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
