"""Hypothesis fuzzes the protocol layer of one long-lived `dg-lsp` process with thousands of messages.

Every generated request must get exactly one answer (a result, or a JSON-RPC error other than
'internal error'), nothing may reach the user as an internal-error popup, the server's output must
stay valid LSP frames, and the process must keep serving. Crashers it found are kept as explicit
tests in test_bad_input.py.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.rawlsp import code_action_params, frame, open_params

EXAMPLES = int(os.environ.get("DG_LSP_FUZZ_EXAMPLES", "200"))
ALLOWED_ERRORS = {-32700, -32600, -32601, -32602, -32800}
STATS = {"messages": 0, "requests": 0, "raw_frames": 0, "errors": 0, "results": 0, "batches": 0}
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

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
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


def _seed(server) -> None:
    for uri, text in SEED_DOCS.items():
        server.notify(
            "textDocument/didOpen", open_params(uri, text, "python" if uri.endswith(".py") else "js")
        )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
@given(batch=st.lists(messages(), min_size=10, max_size=40), garbage=st.lists(raw_frames, max_size=3))
def _fuzz_batch(server, batch, garbage) -> None:
    expected = []
    for message, as_request in batch:
        server.send(message)
        if as_request:
            expected.append(message["id"])
    for raw in garbage:
        server.send_bytes(raw)
    if garbage:
        server.send_bytes(PAD)
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
