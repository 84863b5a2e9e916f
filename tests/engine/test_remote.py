"""Remote backend: a real HTTP server on loopback around the tiny DiffusionGemma engine."""

from __future__ import annotations

import threading
import time

import pytest

from dg_lsp.engine.loader import ModelLoadError, load_engine
from dg_lsp.engine.remote import RemoteEngine, make_server
from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.settings import Settings

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n"


@pytest.fixture
def served(dg_engine):
    dg_engine.use_continuation_cache = False
    passes = []
    handle = dg_engine.model.model.decoder.register_forward_hook(lambda *_: passes.append(1))
    server = make_server(dg_engine, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    try:
        yield f"http://{host}:{port}", passes
    finally:
        server.shutdown()
        server.server_close()
        handle.remove()


def test_remote_equals_local(dg_engine, served):
    url, _ = served
    client = load_engine(Settings(model=f"remote:{url}"))
    assert client.name == "remote" and client.describe()["remote_backend"] == "diffusion-gemma"
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=3, seed=5, num_candidates=2)
    remote = client.infill(request)
    dg_engine.reset_caches()
    local = dg_engine.infill(request)
    assert [c.text for c in remote.candidates] == [c.text for c in local.candidates]
    assert [c.mean_logprob for c in remote.candidates] == [c.mean_logprob for c in local.candidates]
    assert remote.stats.forward_passes == local.stats.forward_passes == 3
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


def test_unreachable_server_is_a_load_error():
    with pytest.raises(ModelLoadError, match="not reachable"):
        RemoteEngine("http://127.0.0.1:9", timeout_s=2)
