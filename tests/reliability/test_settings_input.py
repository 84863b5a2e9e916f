"""Numbers in settings, as a real server gets them: raw JSON, including values Python's json reads as
infinite (`1e400`) or NaN. Each bad value is one "invalid setting NAME: why" warning and is ignored;
`initialize` succeeds, completions keep working, and nothing internal reaches the client.
"""

from __future__ import annotations

import json
import time

from tests.reliability.conftest import FAST
from tests.reliability.rawlsp import RawServer, frame, inline_params, open_params

URI = "file:///settings/doc.py"


def _initialize_raw(server: RawServer, options: str) -> dict:
    """`initialize` whose initializationOptions are spliced in as raw JSON text."""
    params = '{"processId": null, "rootUri": null, "capabilities": {"window": {"workDoneProgress": true}}, '
    body = '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": ' + params
    body += '"initializationOptions": ' + options + "}}"
    server.send_bytes(frame(body))
    reply = server.wait_response(1, timeout=60)
    server.notify("initialized", {})
    return reply


def _no_internals(server: RawServer, replies: list[dict]) -> None:
    text = json.dumps(server.notifications) + json.dumps(replies)
    for leak in ("Traceback", "dg_lsp/", '.py\\", line', "internal error"):
        assert leak not in text, (leak, text[:2000])


def test_infinite_and_out_of_range_numbers_are_named_and_ignored(tmp_path, tiny_model_dir):
    server = RawServer([], tmp_path / "server.log")
    try:
        fast = json.dumps(FAST)[1:-1]
        options = (
            '{"dgLsp": {"model": ' + json.dumps(str(tiny_model_dir)) + ", " + fast + ', "maxTokens": 1e400, '
            '"seed": -1e400, "numCandidates": NaN}}'
        )
        reply = _initialize_raw(server, options)
        assert reply["result"]["serverInfo"]["name"] == "dg-lsp"
        assert server.wait_loaded() == "ready"
        warnings = server.messages(kind=2)
        assert len(warnings) == 3, warnings
        for name in ("maxTokens", "seed", "numCandidates"):
            assert sum(f"invalid setting {name}: " in w for w in warnings) == 1, warnings

        # The same through didChangeConfiguration, raw, with more of each kind.
        bad = (
            '{"dgLsp": {"seed": 1180591620717411303424, "debounceMs": 1e9, "latencyBudgetMs": -5, '
            '"denoisingSteps": Infinity, "masked": {"buckets": [1000000000], "threshold": NaN, '
            '"freezFront": true}}}'
        )
        server.send_bytes(
            frame(
                '{"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration", '
                '"params": {"settings": ' + bad + "}}"
            )
        )
        server.notify("textDocument/didOpen", open_params(URI, "def add(a, b):\n    return \n"))
        started = time.monotonic()
        # An automatic request is answered: debounceMs 1e9 was not taken.
        automatic = server.request("textDocument/inlineCompletion", inline_params(URI, 1, 11, automatic=True))
        assert "items" in automatic["result"] and time.monotonic() - started < 30
        invoked = server.request("textDocument/inlineCompletion", inline_params(URI, 1, 11))
        assert "items" in invoked["result"]
        warnings = server.messages(kind=2)[3:]
        for name in (
            "seed",
            "debounceMs",
            "latencyBudgetMs",
            "denoisingSteps",
            "masked.buckets",
            "masked.threshold",
            "masked.freezFront",  # misspelled: said, with the name it was probably meant to be
        ):
            assert sum(f"invalid setting {name}: " in w for w in warnings) == 1, (name, warnings)
        assert len(warnings) == 7, warnings
        assert any(w.endswith("did you mean freezeFront? (ignored)") for w in warnings), warnings
        # Sending the same bad value again does not repeat the message.
        server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": {"debounceMs": 1e9}}})
        assert server.request("textDocument/codeAction", {"bad": 1})["error"]["code"] == -32602
        assert len(server.messages(kind=2)) == 10
        assert server.messages(kind=1) == []
        _no_internals(server, [reply, automatic, invoked])
        assert server.shutdown() == 0
    except BaseException:
        print(server.log_text()[-6000:])
        raise
    finally:
        server.kill()


def test_settings_that_are_not_an_object_are_reported_not_failed(tmp_path):
    server = RawServer([], tmp_path / "server.log")
    try:
        reply = _initialize_raw(server, "[1e400, null]")
        assert reply["result"]["serverInfo"]["name"] == "dg-lsp"
        server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": {"masked": 5, "model": 3}}})
        assert server.request("textDocument/codeAction", {"bad": 1})["error"]["code"] == -32602
        messages = server.messages()
        assert any("not an object" in m for m in messages), messages
        assert any("invalid setting masked: must be an object" in m for m in messages), messages
        assert any("invalid setting model: must be a string" in m for m in messages), messages
        _no_internals(server, [reply])
        assert server.shutdown() == 0
    finally:
        server.kill()
