"""Remote backend: the FIM client against real HTTP servers on loopback — the team server in process
(uvicorn, no Ray) around real engines, and a stand-in for a hosted FIM coder."""

from __future__ import annotations

import logging
import threading
import time

import pytest

pytest.importorskip("uvicorn", reason="the team server needs fastapi and uvicorn: pip install -e '.[test]'")

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse

from dg_lsp.engine.loader import ModelLoadError, load_engine
from dg_lsp.engine.remote import RemoteEngine, RemoteError, api_key_env
from dg_lsp.engine.types import Cancelled, InfillRequest, ended_by_model
from dg_lsp.settings import Settings
from dg_lsp.team.local import InProcessServer

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n"


@pytest.fixture
def served(dg_engine):
    dg_engine.use_continuation_cache = False
    passes = []
    handle = dg_engine.model.model.decoder.register_forward_hook(lambda *_: passes.append(1))
    server = InProcessServer(dg_engine).start()
    try:
        yield server.url, passes
    finally:
        server.stop()
        handle.remove()


def test_remote_equals_local(dg_engine, served):
    url, _ = served
    client = load_engine(Settings(model=f"remote:{url}"))
    assert client.name == "remote" and client.describe()["remote_backend"] == "diffusion-gemma"
    assert client.describe()["api"] == "dg-lsp FIM"
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=3, seed=5, num_candidates=2)
    remote = client.infill(request)
    dg_engine.reset_caches()
    local = dg_engine.infill(request)
    assert [c.text for c in remote.candidates] == [c.text for c in local.candidates]
    assert [c.mean_logprob for c in remote.candidates] == [c.mean_logprob for c in local.candidates]
    assert remote.stats.forward_passes == local.stats.forward_passes == 3
    # the server's finish_reason says whether each candidate ended where its model stopped
    ended = [[ended_by_model(c, request.max_tokens) for c in r.candidates] for r in (remote, local)]
    assert ended[0] == ended[1]
    client.warmup()


def test_client_cancel_reaches_server(served):
    url, passes = served
    client = RemoteEngine(url)
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        client.infill(
            InfillRequest(PREFIX, SUFFIX, steps=5000), should_cancel=lambda: time.monotonic() - t0 > 0.2
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server stops at its next step boundary
        before = len(passes)
        time.sleep(0.2)
        if len(passes) == before:
            break
    assert 0 < len(passes) < 5000
    assert client.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=2)).stats.forward_passes == 2


def test_newer_request_for_same_document_supersedes(served):
    url, _ = served
    client = RemoteEngine(url)
    outcome = {}

    def old():
        try:
            client.infill(InfillRequest(PREFIX, SUFFIX, steps=5000, doc_key="d"))
            outcome["old"] = "finished"
        except Cancelled:
            outcome["old"] = "cancelled"

    thread = threading.Thread(target=old)
    thread.start()
    time.sleep(0.3)
    newer = client.infill(InfillRequest(PREFIX + "a", SUFFIX, max_tokens=32, steps=2, doc_key="d"))
    thread.join(30)
    assert outcome["old"] == "cancelled" and newer.stats.forward_passes == 2


def test_two_clients_editing_the_same_path_do_not_supersede_each_other(served):
    """Two users whose files share a path (same container layout) each keep their own request: the
    second one waits its turn instead of cancelling the first (the newest per document wins only within
    one client)."""
    url, _ = served
    first, second = RemoteEngine(url), RemoteEngine(url)
    outcome = {}
    stop = threading.Event()

    def long_one():
        try:
            first.infill(InfillRequest(PREFIX, SUFFIX, steps=5000, doc_key="file:///app.py"), stop.is_set)
            outcome["first"] = "finished"
        except Cancelled:
            outcome["first"] = "stopped by its own client" if stop.is_set() else "superseded"

    def short_one():
        request = InfillRequest(PREFIX + "a", SUFFIX, max_tokens=32, steps=2, doc_key="file:///app.py")
        outcome["second"] = second.infill(request).stats.forward_passes

    threads = [threading.Thread(target=long_one), threading.Thread(target=short_one)]
    threads[0].start()
    time.sleep(0.3)
    threads[1].start()
    time.sleep(1.0)
    assert threads[0].is_alive(), outcome
    stop.set()
    for thread in threads:
        thread.join(30)
    assert outcome == {"first": "stopped by its own client", "second": 2}


def test_requests_waiting_together_share_forward_passes():
    """embedded-tiny has a batched path: 6 concurrent requests take far fewer forwards than 6 x 8."""
    engine = load_engine(Settings(model="embedded-tiny"))
    server = InProcessServer(engine).start()
    try:
        client = RemoteEngine(server.url)
        results = {}

        def one(i: int) -> None:
            results[i] = client.infill(InfillRequest(f"x{i} = ", SUFFIX, max_tokens=16, steps=8))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(r.stats.forward_passes == 8 for r in results.values()), results
        runner = server.backend.runner
        assert runner.requests == 6 and runner.batcher.forwards < 6 * 8
        assert max(server.backend.batch_sizes) > 1
    finally:
        server.stop()


def test_unreachable_server_is_a_load_error():
    with pytest.raises(ModelLoadError, match="not reachable"):
        RemoteEngine("http://127.0.0.1:9", timeout_s=2, retries=0)


class _HostedCoder:
    """A stand-in for a hosted FIM API: records what it was sent; answers 503 `fail_first` times."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        self.fail_first = fail_first
        app = FastAPI()

        @app.get("/v1/models")
        async def models(request: Request):
            return {"data": [{"id": "codestral-2508", "owned_by": "mistralai"}]}

        @app.post("/v1/fim/completions")
        async def fim(request: Request):
            self.bodies.append(await request.json())
            self.auth.append(request.headers.get("authorization"))
            if len(self.bodies) <= self.fail_first:
                return JSONResponse({"message": "overloaded"}, 503)
            return {"choices": [{"index": 0, "text": "a + b", "finish_reason": "stop"}], "usage": {}}

        @app.post("/elsewhere/v1/fim/completions")
        async def moved(request: Request):
            return RedirectResponse("http://127.0.0.1:9/steal", 307)

        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, port=0, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def test_a_hosted_fim_server_gets_the_plain_body_the_locally_named_key_and_retries(
    tmp_path, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    secret = "sk-hosted-" + "z" * 30
    coder = _HostedCoder(fail_first=2)
    with coder as url:
        config = tmp_path / "config.toml"
        config.write_text(f'remote_api_keys = {{ "{url}" = "MY_CODER_KEY" }}\n')
        monkeypatch.setenv("DG_LSP_CONFIG", str(config))
        monkeypatch.setenv("MY_CODER_KEY", secret)
        monkeypatch.setenv("DG_LSP_ENGINE_TOKEN", "not-for-this-server")
        assert api_key_env(url) == "MY_CODER_KEY"
        client = RemoteEngine(url + "#codestral-latest")
        assert client.describe()["api"] == "FIM" and secret not in str(client.describe())
        result = client.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=8, single_line=True, doc_key="d"))
        assert result.best == "a + b"
        assert ended_by_model(result.candidates[0], 8)  # finish_reason "stop", though it has no ids
        # A redirect would carry the code and the key to a server nobody named.
        moved = RemoteEngine(url + "/elsewhere/v1/fim/completions", check=False)
        with pytest.raises(RemoteError, match="redirect"):
            moved.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=8))
    # two 503s, then the answer: urllib3's Retry resent the same body
    assert len(coder.bodies) == 3 and coder.bodies[0] == coder.bodies[2]
    body = coder.bodies[-1]
    assert set(body) == {"model", "prompt", "suffix", "max_tokens", "temperature", "n", "stop"}
    assert body["model"] == "codestral-latest" and body["stop"] == ["\n"]
    assert coder.auth == [f"Bearer {secret}"] * 3
    assert secret not in caplog.text


def test_without_a_local_choice_the_key_is_the_engine_token(tmp_path, monkeypatch):
    monkeypatch.setenv("DG_LSP_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("DG_LSP_API_KEY_ENV", raising=False)
    assert api_key_env("http://team:8765") == "DG_LSP_ENGINE_TOKEN"
    # --api-key-env binds a variable to the engine named on the command line, and to no other
    monkeypatch.setenv("DG_LSP_API_KEY_ENV", "TEAM_KEY")
    monkeypatch.setenv("DG_LSP_API_KEY_URL", "http://team:8765")
    assert api_key_env("http://team:8765/") == "TEAM_KEY"
    assert api_key_env("http://other:8765") == "DG_LSP_ENGINE_TOKEN"
