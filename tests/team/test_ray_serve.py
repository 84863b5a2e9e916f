"""The team server on a real local Ray (CPU, the embedded 5M model, 2 engine replicas, a bearer token).

Slow (Ray and two replicas take about half a minute to come up on 2 cores), so `-m slow` runs them;
skipped with a reason where Ray Serve is not installed (`pip install -e '.[team]'`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install -e '.[team]'")

from lsprotocol import types

from dg_lsp.engine.loader import ModelLoadError
from dg_lsp.engine.remote import RemoteEngine, RemoteError
from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.settings import Settings
from tests.lsp_harness import lsp_session, open_doc, wait_loaded

pytestmark = pytest.mark.slow

TOKEN = "team-secret-" + "k" * 24
PREFIX = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        "
SUFFIX = "\n\n\nprint(read('x'))\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(method: str, url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict]:
    import urllib3

    data = None if body is None else json.dumps(body).encode()
    resp = urllib3.request(
        method, url, body=data, headers={"Content-Type": "application/json", **(headers or {})}, retries=False
    )
    return resp.status, json.loads(resp.data or b"{}")


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    """Ray (2 CPUs, no dashboard) in this process, Serve on a free port, 2 engine replicas."""
    from ray import serve

    from dg_lsp.team import ray_serve

    port = _free_port()
    cfg = ray_serve.TeamConfig(
        settings=Settings(model="embedded-tiny"),
        replicas=2,
        cpus_per_replica=0.5,
        token=TOKEN,
        port=port,
        request_timeout_s=60,
    )
    old = os.environ.get("DG_LSP_ENGINE_TOKEN")
    os.environ["DG_LSP_ENGINE_TOKEN"] = TOKEN
    try:
        ray_serve.start(cfg, num_cpus=2)
        handle = serve.get_deployment_handle("EngineReplica", app_name=ray_serve.APP_NAME)
        yield f"http://127.0.0.1:{port}", handle
    finally:
        ray_serve.stop()
        if old is None:
            os.environ.pop("DG_LSP_ENGINE_TOKEN", None)
        else:
            os.environ["DG_LSP_ENGINE_TOKEN"] = old


def _replica_stats(handle, want: int = 2, tries: int = 40) -> dict[str, dict]:
    """Each replica's counters, keyed by replica id (calls land on replicas at random)."""
    seen: dict[str, dict] = {}
    for _ in range(tries):
        stats = handle.stats.remote().result(timeout_s=30)
        seen[stats["replica"]] = stats
        if len(seen) >= want:
            break
    return seen


def test_a_busy_replica_runs_what_queued_behind_it_as_one_batch(team):
    """Requests reach a busy replica 40 ms apart (far more than the 5 ms batch wait): they still run as one
    batch once it is free. Under `@serve.batch` each was cut into a batch of its own on arrival, so at 16
    typists the shipped model's replica ran batches of 1-2 (benchmarks/results/team_serve/shipped/)."""
    _, handle = team
    before = _replica_stats(handle)
    long = [
        handle.infill.remote(f"long{i}", InfillRequest(PREFIX, SUFFIX, 128, steps=128, doc_key=f"L{i}"))
        for i in range(4)
    ]
    time.sleep(0.3)
    short = []
    for i in range(8):
        request = InfillRequest(PREFIX + f"x{i} = ", SUFFIX, max_tokens=8, doc_key=f"S{i}")
        short.append(handle.infill.remote(f"short{i}", request))
        time.sleep(0.04)
    outcomes = [r.result(timeout_s=120) for r in long + short]
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    after = _replica_stats(handle)
    new: dict[int, int] = {}  # batches run since `before`, by size, over both replicas
    for r, s in after.items():
        for size, count in s["batch_sizes"].items():
            new[size] = new.get(size, 0) + count - before.get(r, {}).get("batch_sizes", {}).get(size, 0)
    sizes = [size for size, count in new.items() if count > 0]
    assert sum(n * count for n, count in new.items()) == 12 and max(sizes) >= 3, new


def test_no_token_is_401_and_a_bad_one_too(team):
    url, _ = team
    body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8}
    assert _http("POST", url + "/v1/fim/completions", body)[0] == 401
    assert _http("POST", url + "/v1/fim/completions", body, {"Authorization": "Bearer nope"})[0] == 401
    assert _http("GET", url + "/v1/models")[0] == 401
    assert _http("GET", url + "/health")[0] == 200  # probes need no secret
    status, answer = _http("POST", url + "/v1/fim/completions", body, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and answer["choices"][0]["finish_reason"] in ("stop", "length"), answer
    assert answer["usage"]["completion_tokens"] >= 1
    assert (
        _http(
            "POST", url + "/v1/fim/completions", {**body, "n": 10**6}, {"Authorization": f"Bearer {TOKEN}"}
        )[0]
        == 400
    )
    env = {k: v for k, v in os.environ.items() if k != "DG_LSP_ENGINE_TOKEN"}
    with pytest.raises(ModelLoadError, match=r"HTTP 401.*\$DG_LSP_ENGINE_TOKEN"):
        RemoteEngine(url, environ=env)


def test_cancellation_crosses_the_network(team):
    url, handle = team
    client = RemoteEngine(url)
    before = sum(s["cancelled"] for s in _replica_stats(handle).values())
    long = InfillRequest(PREFIX, SUFFIX, max_tokens=128, steps=128)
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        client.infill(long, should_cancel=lambda: time.monotonic() - t0 > 1.0)
    # The replica dropped the row between two steps: the counter moves within seconds, not after the
    # 128 steps the request asked for.
    deadline = time.monotonic() + 15
    while sum(s["cancelled"] for s in _replica_stats(handle).values()) == before:
        assert time.monotonic() < deadline, "the cancelled request kept running on its replica"
        time.sleep(0.2)
    # The newest request per document wins: the older one is answered as cancelled.
    outcome: dict[str, object] = {}

    def older() -> None:
        try:
            outcome["old"] = client.infill(
                InfillRequest(PREFIX, SUFFIX, max_tokens=128, steps=128, doc_key="d")
            )
        except Cancelled:
            outcome["old"] = "cancelled"

    thread = threading.Thread(target=older)
    thread.start()
    time.sleep(1.0)
    newer = client.infill(InfillRequest(PREFIX + "d", SUFFIX, max_tokens=16, steps=4, doc_key="d"))
    thread.join(60)
    assert outcome["old"] == "cancelled" and newer.stats.forward_passes == 4


def test_a_replica_killed_mid_load_loses_no_request(team):
    import ray

    url, handle = team
    client = RemoteEngine(url, timeout_s=120)
    results: dict[int, object] = {}

    def one(i: int) -> None:
        try:
            r = client.infill(InfillRequest(PREFIX + f"x{i}", SUFFIX, max_tokens=32, steps=16, seed=i))
            results[i] = r.best
        except RemoteError as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # requests are running on both replicas
    names = [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if "EngineReplica" in a["name"] and a["name"].startswith("SERVE_REPLICA")
    ]
    assert len(names) == 2, names
    ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
    for t in threads:
        t.join(180)
    assert len(results) == 12
    # Every request was answered: retried on the other replica, or a clear error saying what happened.
    for value in results.values():
        assert isinstance(value, str) or "replica was lost" in str(value), value
    assert sum(isinstance(v, str) for v in results.values()) >= 10, results
    # Serve replaced the killed replica (health checks) and both serve again.
    deadline = time.monotonic() + 120
    while (
        len(_replica_stats(handle)) < 2
        or len([a for a in ray.util.list_named_actors(all_namespaces=True) if "EngineReplica" in a["name"]])
        != 2
    ):
        assert time.monotonic() < deadline, "the killed replica was not replaced"
        time.sleep(1)
    assert client.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=8, steps=2)).stats.forward_passes == 2


def test_several_language_servers_typing_at_once(team, tmp_path):
    url, handle = team
    uri = "file:///tmp/team_example.py"
    source = PREFIX + SUFFIX
    line, col = 5, 8  # the cursor after "        " in read()

    async def typist(n: int) -> list[int]:
        folder = tmp_path / f"lsp{n}"
        folder.mkdir()
        opts = {"dgLsp": {"model": f"remote:{url}", "debounceMs": 0, "maxTokens": 16, "denoisingSteps": 4}}
        shown = []
        async with lsp_session(folder, opts, server_args=["--model", f"remote:{url}"]) as client:
            open_doc(client, uri, source)
            await wait_loaded(client)
            text = ""
            for version, ch in enumerate("return", start=2):
                pos = types.Position(line=line, character=col + len(text))
                client.text_document_did_change(
                    types.DidChangeTextDocumentParams(
                        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                        content_changes=[
                            types.TextDocumentContentChangePartial(
                                range=types.Range(start=pos, end=pos), text=ch
                            )
                        ],
                    )
                )
                text += ch
                params = types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri=uri),
                    position=types.Position(line=line, character=col + len(text)),
                    context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Invoked
                    ),
                )
                result = await asyncio.wait_for(client.text_document_inline_completion_async(params), 120)
                assert isinstance(result, types.InlineCompletionList)
                shown.append(len(result.items))
            assert not [m for m in client.messages if m.type == types.MessageType.Error], client.messages
        log_text = (folder / "server.log").read_text()
        assert TOKEN not in log_text
        # each typist waited for every answer: nothing of theirs was superseded, least of all by another
        # typist's requests for a file at the same path
        assert re.search(r"model worker: \d+ completed, 0 cancelled", log_text), log_text
        return shown

    async def everyone() -> list[list[int]]:
        return await asyncio.gather(*(typist(n) for n in range(3)))

    before = sum(s["requests"] for s in _replica_stats(handle).values())
    shown = asyncio.run(everyone())
    assert all(len(s) == 6 for s in shown) and sum(map(sum, shown)) > 0, shown
    after = _replica_stats(handle)
    # every server reached the engine (fewer than 18 requests: typing into a shown suggestion reuses it)
    assert sum(s["requests"] for s in after.values()) - before >= 3
    # both replicas took part, and some requests shared a forward pass
    assert all(s["requests"] > 0 for s in after.values())


def test_the_command_starts_ray_serves_and_takes_ray_down(tmp_path):
    """`dg-lsp serve-engine` as a real process (its own local Ray), interrupted like a user would."""
    port = _free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    log_path = tmp_path / "engine.log"
    command = [sys.executable, "-m", "dg_lsp", "serve-engine", "--engine-port", str(port)]
    command += ["--num-cpus", "2", "--cpus-per-replica", "0.5", "--token-file", str(token_file)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if (
                    _http(
                        "GET",
                        f"http://127.0.0.1:{port}/v1/models",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    )[0]
                    == 200
                ):
                    break
            except Exception:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(1)
        body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8, "stop": ["\n"]}
        status, answer = _http(
            "POST", f"http://127.0.0.1:{port}/v1/fim/completions", body, {"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 200 and "\n" not in answer["choices"][0]["text"], answer
        assert _http("POST", f"http://127.0.0.1:{port}/v1/fim/completions", body)[0] == 401
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError("running 90 s after Ctrl-C:\n" + log_path.read_text()[-4000:]) from None
        assert code == 0, log_path.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert TOKEN not in log_path.read_text()
    leftover = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert leftover == [], f"processes of the server's session still running: {leftover}"
