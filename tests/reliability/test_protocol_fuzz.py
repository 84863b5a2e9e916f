"""Hypothesis fuzzes the protocol layer of one long-lived `dg-lsp` process with thousands of messages.

Every generated request must get exactly one answer (a result, or a JSON-RPC error other than
'internal error'), nothing may reach the user as an internal-error popup, the server's output must
stay valid LSP frames, and the process must keep serving. Numbers include what JSON allows and
Python reads as infinite (`1e400`) or arbitrarily large. Settings changes with hostile numbers must
each be named as an invalid setting, never fail. A TCP server waiting for its editor gets HTTP-shaped
requests, garbage and early disconnects on fresh connections: each is closed unanswered and the
server still serves the editor that comes last. Crashers it found are kept as explicit tests in
test_bad_input.py and test_framing.py.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dg_lsp.server.transport import _is_http
from tests.reliability.conftest import FAST
from tests.reliability.rawlsp import code_action_params, encode, frame, open_params

EXAMPLES = int(os.environ.get("DG_LSP_FUZZ_EXAMPLES", "200"))
ALLOWED_ERRORS = {-32700, -32600, -32601, -32602, -32800}
STATS = {
    "messages": 0,
    "requests": 0,
    "raw_frames": 0,
    "errors": 0,
    "results": 0,
    "batches": 0,
    "settings_changes": 0,
    "invalid_settings_named": 0,
    "tcp_connections_refused": 0,
}
_ids = itertools.count(10_000)

URIS = [
    "file:///fuzz/a.py",
    "file:///fuzz/b.js",
    "file:///fuzz/never-opened.rs",
    "untitled:Untitled-1",
    "file:///fuzz/%E2%82%AC%20x.py",
    "file:///etc/passwd",
]
SEED_DOCS = {
    "file:///fuzz/a.py": "import os\n\n\ndef add(a, b):\n    return \n\nclass K:\n    x = '😀é'\n",
    "file:///fuzz/b.js": "function f(x) {\n  return x + \n}\n",
}

huge_numbers = st.sampled_from(
    [math.inf, -math.inf, math.nan, 10**400, -(10**400), 2**64, 2**70, 1e308, -0.0]
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20), huge_numbers
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
ints = st.one_of(
    st.integers(0, 12),
    st.sampled_from([-1, 2**31 - 1, 2**31, 2**32, 2**53, -(2**63), 10**30]),
    st.integers(),
    huge_numbers,
)
tricky = st.sampled_from(
    ["\ud83d", "\ude00", "😀", "\x00", "\r", "\n", "\r\n", "é", "𝕏", "{", "(", "\t", "\u2028"]
)
texts = st.one_of(
    st.text(max_size=40),
    st.lists(tricky | st.text(max_size=3), max_size=30).map("".join),
    st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
)
uris = st.sampled_from(URIS) | st.text(max_size=30)
position = st.fixed_dictionaries({"line": ints, "character": ints})
a_range = st.fixed_dictionaries({"start": position, "end": position})
doc_id = st.fixed_dictionaries({"uri": uris})
action_data = st.fixed_dictionaries(
    {
        "action": st.sampled_from(["fill", "rewrite", "placeholder", "repair", "rm -rf", ""]),
        "start": ints,
        "end": ints,
        "uri": uris,
        "version": ints,
    }
)

PARAMS = {
    "textDocument/didOpen": st.fixed_dictionaries(
        {
            "textDocument": st.fixed_dictionaries(
                {
                    "uri": uris,
                    "languageId": st.sampled_from(["python", "javascript", "rust", "c", "weird", ""]),
                    "version": ints,
                    "text": texts,
                }
            )
        }
    ),
    "textDocument/didChange": st.fixed_dictionaries(
        {
            "textDocument": st.fixed_dictionaries({"uri": uris, "version": ints}),
            "contentChanges": st.lists(
                st.fixed_dictionaries({"range": a_range, "text": texts})
                | st.fixed_dictionaries({"text": texts}),
                max_size=3,
            ),
        }
    ),
    "textDocument/didClose": st.fixed_dictionaries({"textDocument": doc_id}),
    "textDocument/inlineCompletion": st.fixed_dictionaries(
        {
            "textDocument": doc_id,
            "position": position,
            "context": st.fixed_dictionaries({"triggerKind": st.sampled_from([1, 2, 0, 3, 99])}),
        }
    ),
    "textDocument/completion": st.fixed_dictionaries({"textDocument": doc_id, "position": position}),
    "textDocument/codeAction": st.fixed_dictionaries(
        {"textDocument": doc_id, "range": a_range, "context": st.just({"diagnostics": []})}
    ),
    "codeAction/resolve": st.fixed_dictionaries({"title": texts, "data": action_data | json_values}),
    "workspace/executeCommand": st.fixed_dictionaries(
        {
            "command": st.sampled_from(["dg-lsp.applyAction", "no.such.command"]),
            "arguments": st.lists(action_data | json_values, max_size=2),
        }
    ),
    "$/cancelRequest": st.fixed_dictionaries({"id": ints | st.text(max_size=5)}),
    "$/setTrace": st.fixed_dictionaries({"value": st.sampled_from(["off", "messages", "verbose", "x"])}),
}
REQUESTS = {
    "textDocument/inlineCompletion",
    "textDocument/completion",
    "textDocument/codeAction",
    "codeAction/resolve",
    "workspace/executeCommand",
}
LIFECYCLE = {"initialize", "initialized", "shutdown", "exit", "workspace/didChangeConfiguration"}
methods = st.sampled_from(sorted(PARAMS)) | st.text(max_size=25).filter(lambda m: m not in LIFECYCLE)


@st.composite
def messages(draw):
    """(message dict, expects_answer): mostly well-shaped LSP, sometimes with params replaced by junk."""
    method = draw(methods)
    params = draw(PARAMS[method]) if method in PARAMS and draw(st.integers(0, 9)) else draw(json_values)
    as_request = method in REQUESTS if draw(st.integers(0, 5)) else draw(st.booleans())
    message = {"jsonrpc": "2.0", "method": method}
    if draw(st.integers(0, 7)):
        message["params"] = params
    if as_request:
        message["id"] = next(_ids) if draw(st.booleans()) else f"s{next(_ids)}"
    return message, as_request


# Frame-level garbage; claimed lengths stay <= 2000 or above the server's limit, and every batch ends
# with 2100 blank lines, which either complete a pending body or are skipped as blank header lines.
raw_frames = st.one_of(
    st.binary(max_size=60).map(frame),  # body: arbitrary bytes (non-UTF-8, binary)
    json_values.map(lambda v: frame(json.dumps(v))),  # body: valid JSON, not a message
    st.builds(
        lambda n, b: b"Content-Length: %d\r\n\r\n" % n + b, st.integers(0, 2000), st.binary(max_size=80)
    ),
    st.builds(lambda n: b"Content-Length: %d\r\n\r\n" % n, st.integers(2**28 + 1, 10**15)),
    st.binary(max_size=80),  # no header at all
    st.builds(
        lambda name, b: name + b": %d\r\n\r\n" % len(b) + b,
        st.sampled_from([b"content-length", b"CONTENT-LENGTH", b"Content-Type", b"X"]),
        st.binary(max_size=40),
    ),
)
PAD = b"\r\n" * 2100


def _http_shaped(garbage: list[bytes]) -> bool:
    """Garbage in which an HTTP header can appear: random bytes ending in `sec-` before the next frame's
    `Content-Length` read as `sec-Content-Length: 2`. The transport closes the connection on those by
    design (a browser's header is never part of an LSP stream: tests/reliability/test_framing.py). Every
    start in every line is tried, since a frame's body can end anywhere in a line."""
    lines = b"".join(garbage).split(b"\n")
    return any(_is_http(line[i:]) for line in lines for i in range(len(line)))


def _seed(server) -> None:
    for uri, text in SEED_DOCS.items():
        server.notify(
            "textDocument/didOpen", open_params(uri, text, "python" if uri.endswith(".py") else "js")
        )


def dumps(message: object) -> bytes:
    """JSON as an editor could write it: infinities as `1e400` (valid JSON that Python reads as inf)."""
    text = json.dumps(message)
    return text.replace("-Infinity", "-1e400").replace("Infinity", "1e400").encode()


def _gone(server, exc: OSError, batch, garbage) -> str:
    """Everything needed to replay a lost server by hand: once the process is gone Hypothesis cannot
    shrink (every later example fails the same way), so the input is printed here, whole."""
    return (
        f"the server stopped reading ({type(exc).__name__}: {exc}); exit code {server.proc.poll()}\n"
        f"batch: {batch!r}\ngarbage: {garbage!r}\n--- server log tail ---\n{server.log_text()[-4000:]}"
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
    print_blob=True,
)
@given(batch=st.lists(messages(), min_size=10, max_size=40), garbage=st.lists(raw_frames, max_size=3))
def _fuzz_batch(server, batch, garbage) -> None:
    assume(not _http_shaped(garbage))
    expected = []
    try:
        for message, as_request in batch:
            server.send_bytes(frame(dumps(message)))
            if as_request:
                expected.append(message["id"])
        for raw in garbage:
            server.send_bytes(raw)
        if garbage:
            server.send_bytes(PAD)
    except OSError as exc:  # a broken pipe: the server exited or closed stdin mid-batch
        raise AssertionError(_gone(server, exc, batch, garbage)) from None
    # A well-formed request after the garbage proves the stream is back in sync.
    sync = server.request_async("textDocument/codeAction", code_action_params(URIS[0], (0, 0), (0, 0)))
    try:
        answers = server.responses([*expected, sync], timeout=60)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nbatch: {batch!r}\ngarbage: {garbage!r}") from None
    for msg_id, answer in answers.items():
        assert ("result" in answer) != ("error" in answer), answer
        if "error" in answer:
            assert answer["error"]["code"] in ALLOWED_ERRORS, (msg_id, answer)
            STATS["errors"] += 1
        else:
            STATS["results"] += 1
    assert "result" in answers[sync]
    internal = [m for m in server.messages() if "internal error" in m]
    assert not internal, internal
    assert server.proc.poll() is None
    STATS["messages"] += len(batch) + len(garbage) + 1
    STATS["requests"] += len(expected) + 1
    STATS["raw_frames"] += len(garbage)
    STATS["batches"] += 1
    if len(SEED_DOCS) and STATS["batches"] % 20 == 0:
        _seed(server)  # fuzzed didClose may have closed them: keep real documents in play


NUMERIC_SETTINGS = ["maxTokens", "denoisingSteps", "latencyBudgetMs", "debounceMs", "numCandidates", "seed"]
MASKED_OPTIONS = ["buckets", "threshold", "minTokens", "blockLength", "confidence", "steps", "temperature"]
setting_values = ints | huge_numbers | json_values | st.floats()
setting_changes = st.fixed_dictionaries(
    {},
    optional={
        "numbers": st.dictionaries(st.sampled_from(NUMERIC_SETTINGS), setting_values, min_size=1),
        "masked": st.dictionaries(
            st.sampled_from(MASKED_OPTIONS), setting_values | st.lists(ints, max_size=3)
        ),
    },
)
RESET = {**FAST, "numCandidates": 1, "seed": 0, "masked": {}}


@settings(max_examples=max(20, EXAMPLES // 4), deadline=None, database=None)
@given(changes=st.lists(setting_changes, min_size=1, max_size=4))
def _fuzz_settings(server, changes) -> None:
    before = len(server.messages())
    for change in changes:
        values = dict(change.get("numbers", {}))
        if "masked" in change:
            values["masked"] = change["masked"]
        body = {
            "jsonrpc": "2.0",
            "method": "workspace/didChangeConfiguration",
            "params": {"settings": values},
        }
        server.send_bytes(frame(dumps(body)))
    server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": RESET}})
    sync = server.request("textDocument/codeAction", code_action_params(URIS[0], (0, 0), (0, 0)), timeout=60)
    assert "result" in sync, sync
    new = server.messages()[before:]
    odd = [m for m in new if not (m.startswith("dg-lsp: invalid setting ") and m.endswith("(ignored)"))]
    assert not odd, odd
    assert server.proc.poll() is None
    STATS["settings_changes"] += len(changes)
    STATS["invalid_settings_named"] += len(new)


def test_fuzz_settings_numbers_are_named_never_failed(served):
    _fuzz_settings(served)
    print(f"settings fuzz: {STATS['settings_changes']} changes, {STATS['invalid_settings_named']} named")
    assert STATS["invalid_settings_named"] > 0


# -- TCP: what reaches the port before the editor ------------------------------------------------------

INIT_FRAME = encode(
    {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "capabilities": {}}}
)
HTTP_HEADERS = [
    b"Host: 127.0.0.1",
    b"Origin: https://evil.example",
    b"User-Agent: Mozilla/5.0",
    b"Accept: */*",
    b"Content-Type: text/plain;charset=UTF-8",
    b"Sec-Fetch-Mode: no-cors",
    b"Upgrade: websocket",
]


def _http(method: bytes, path: str, headers: list[bytes], newline: bytes, with_frame: bool) -> bytes:
    body = INIT_FRAME if with_frame else b""
    lines = [method + b" /" + path.encode("utf-8", "replace") + b" HTTP/1.1", *headers]
    lines.append(b"Content-Length: %d" % len(body))
    return newline.join(lines) + newline + newline + body


def _lsp_like(data: bytes) -> bool:
    head = data.lstrip(b"\r\n").lower()
    return head.startswith((b"content-length", b"content-type"))


first_bytes = st.one_of(
    st.builds(
        _http,
        st.sampled_from([b"GET", b"POST", b"PUT", b"OPTIONS", b"PRI", b"get"]),
        st.text(st.characters(codec="ascii", exclude_characters=" \r\n"), max_size=20),
        st.lists(st.sampled_from(HTTP_HEADERS), max_size=5),
        st.sampled_from([b"\r\n", b"\n"]),
        st.booleans(),
    ),
    st.builds(  # an HTTP header before a real frame (Content-Type is LSP's own header too: left out)
        lambda h, body: h + b"\r\n" + body,
        st.sampled_from([h for h in HTTP_HEADERS if not h.startswith(b"Content-Type")]),
        st.just(INIT_FRAME),
    ),
    st.binary(min_size=1, max_size=200).filter(lambda b: not _lsp_like(b)),
    # An early disconnect: any strict prefix of a real frame, then the connection closes.
    st.integers(0, len(INIT_FRAME) - 1).map(lambda n: INIT_FRAME[:n]),
)


@settings(max_examples=EXAMPLES, deadline=None, database=None)
@given(data=first_bytes)
def _fuzz_tcp(port: int, proc: subprocess.Popen, data: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # end of input: the server decides on what it has
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    assert answer == b"", (data[:200], answer[:200])
    assert proc.poll() is None, data[:200]
    STATS["tcp_connections_refused"] += 1


def test_fuzz_tcp_first_bytes_never_reach_the_server(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "tcp.log", "wb")
    command = [
        sys.executable,
        "-m",
        "dg_lsp",
        "--tcp",
        "--port",
        str(port),
        "--model",
        str(tmp_path / "none"),
    ]
    proc = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "server never listened"
                time.sleep(0.1)
        _fuzz_tcp(port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as editor:
            editor.sendall(INIT_FRAME + encode({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
            editor.sendall(encode({"jsonrpc": "2.0", "method": "exit"}))
            replies = b""
            while chunk := editor.recv(65536):
                replies += chunk
        assert b'"serverInfo"' in replies and b'"id": 2' in replies.replace(b'"id":2', b'"id": 2')
        assert proc.wait(timeout=30) == 0
    except BaseException:
        print((tmp_path / "tcp.log").read_text()[-4000:])
        raise
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    print(f"tcp fuzz: {STATS['tcp_connections_refused']} connections closed unanswered")


def test_fuzz_protocol_keeps_serving(served):
    _seed(served)
    _fuzz_batch(served)
    print(f"fuzz: {STATS}")
    assert STATS["messages"] >= EXAMPLES * 5
    report = os.environ.get("DG_LSP_FUZZ_STATS")
    if report:
        Path(report).write_text(json.dumps(STATS))
    # The whole stream leaves no user-visible error and a server that still shuts down cleanly.
    assert served.shutdown() == 0
