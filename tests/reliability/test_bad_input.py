"""Bad input to one real server process: each gets a proper JSON-RPC error or an empty result.

The first group are the crashers and hangs the fuzzer and hand probes found in the stock pygls
transport (no answer at all, so the editor waits forever; a lost frame after a short length; an
allocation sized by a lying header); they stay here as regressions.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.reliability.probes import offset_of, todo_line, utf16_position
from tests.reliability.rawlsp import change_params, encode, frame, inline_params, open_params, pos, rng

URI = "file:///bad/input.py"


def _alive(server) -> None:
    server.notify("textDocument/didOpen", open_params(URI, "def f(x):\n    return \n"))
    assert offset_of(server, URI, 1, 11) == len("def f(x):\n    return ")
    assert server.proc.poll() is None
    assert not [m for m in server.messages() if "internal error" in m], server.messages()


def _error(server, msg_id, data: bytes, code: int) -> dict:
    server.drain()  # answers with id null from earlier tests must not be mistaken for this one
    server.send_bytes(data)
    reply = server.wait_response(msg_id, timeout=30)
    assert reply["error"]["code"] == code, reply
    return reply


# -- framing and envelope: formerly no answer at all ------------------------------------------------


def test_malformed_json_gets_parse_error_with_null_id(served):
    _error(served, None, frame(b'{"jsonrpc": "2.0", "id": 1, "method":'), -32700)
    _alive(served)


def test_non_utf8_body_gets_parse_error(served):
    _error(served, None, frame(b'{"jsonrpc":"2.0","id":2,"method":"x","params":"\xff\xfe"}'), -32700)
    _alive(served)


def test_deeply_nested_json_gets_parse_error(served):
    _error(served, None, frame(b"[" * 100_000 + b"]" * 100_000), -32700)
    _alive(served)


@pytest.mark.parametrize("body", [b"[1, 2]", b"5", b'"text"', b"null", b"{}"])
def test_json_that_is_not_a_message_is_an_invalid_request(served, body):
    _error(served, None, frame(body), -32600)
    _alive(served)


def test_missing_jsonrpc_version_is_answered(served):
    _error(served, "v", frame(b'{"id": "v", "method": "shutdown"}'), -32600)
    _alive(served)  # ...and it did not shut the server down


def test_unknown_methods_get_method_not_found(served):
    _error(served, 3, encode({"jsonrpc": "2.0", "id": 3, "method": "foo/bar"}), -32601)
    _error(served, 4, encode({"jsonrpc": "2.0", "id": 4, "method": "foo/bar", "params": {"a": 1}}), -32601)
    served.notify("$/unknownNotification", {"x": 1})  # ignored, as the spec says for $/ notifications
    _alive(served)


def test_invalid_params_name_the_field(served):
    reply = _error(
        served,
        5,
        encode({"jsonrpc": "2.0", "id": 5, "method": "textDocument/inlineCompletion", "params": {"x": 1}}),
        -32602,
    )
    assert "position" in reply["error"]["message"]
    _alive(served)


def test_negative_position_is_invalid_params(served):
    params = {"textDocument": {"uri": URI}, "position": pos(-1, -5)}
    data = encode({"jsonrpc": "2.0", "id": 6, "method": "textDocument/completion", "params": params})
    _error(served, 6, data, -32602)
    _alive(served)


def test_notification_method_sent_as_request_is_answered(served):
    data = encode({"jsonrpc": "2.0", "id": 7, "method": "$/cancelRequest", "params": {"id": 1}})
    _error(served, 7, data, -32600)
    _alive(served)


def test_short_content_length_loses_only_that_frame(served):
    served.notify("textDocument/didOpen", open_params(URI, "x = 1\n"))
    body = encode({"jsonrpc": "2.0", "id": 8, "method": "shutdown"})[len("Content-Length: 46\r\n\r\n") :]
    # The stock reader merged the leftover bytes with the next header and dropped the next request.
    served.drain()
    served.send_bytes(b"Content-Length: 10\r\n\r\n" + body)
    assert offset_of(served, URI, 0, 5) == 5
    assert served.wait_response(None)["error"]["code"] == -32700  # the truncated frame itself
    _alive(served)


def test_huge_content_length_is_refused_not_allocated(served):
    rss_before = _rss_kib(served.pid)
    _error(served, None, b"Content-Length: 999999999999\r\n\r\n", -32600)
    _alive(served)
    assert _rss_kib(served.pid) - rss_before < 512 * 1024


def test_lenient_headers(served):
    body = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "foo/lenient"}).encode()
    served.send_bytes(b"content-length: %d\ncontent-type: application/vscode-jsonrpc\n\n" % len(body) + body)
    assert served.wait_response(9, timeout=30)["error"]["code"] == -32601
    _alive(served)


def _rss_kib(pid: int) -> int:
    from tests.reliability.rawlsp import vm_rss_kib

    return vm_rss_kib(pid)


# -- documents: positions, encodings and contents ----------------------------------------------------


def test_emoji_and_surrogate_pairs_use_utf16_positions(served):
    uri = "file:///bad/emoji.py"
    text = "x = '😀😀'\n# TODO 𝕏y\n"
    served.notify("textDocument/didOpen", open_params(uri, text))
    assert offset_of(served, uri, 0, 7) == 6  # after one emoji: 5 ASCII units + a surrogate pair
    assert offset_of(served, uri, 0, 6) == 5  # inside a pair: clamped to its start, never split
    assert offset_of(served, uri, 0, 99) == len("x = '😀😀'")  # past the end of the line
    assert offset_of(served, uri, 1, 9) == text.index("y")
    # Type between the emoji and check the server's text, not only its offsets.
    edit = {"range": rng((1, 9), (1, 9)), "text": "é😀"}
    served.notify("textDocument/didChange", change_params(uri, 2, [edit]))
    assert todo_line(served, uri, 1) == "# TODO 𝕏é😀y"
    expected = text.replace("𝕏y", "𝕏é😀y")
    line, character = utf16_position(expected, expected.index("y\n"))
    assert offset_of(served, uri, line, character) == expected.index("y\n")


def test_lone_surrogates_and_binary_content_do_not_break_the_document(served):
    uri = "file:///bad/binary.py"
    binary = bytes(range(256)).decode("latin-1").replace("\n", "").replace("\r", "")
    text = "a = '\ud83d'\n# TODO \udc00z\n" + binary + "\n# TODO end\n"
    served.notify("textDocument/didOpen", open_params(uri, text))
    reply = served.request("textDocument/inlineCompletion", inline_params(uri, 0, 4), timeout=60)
    assert "items" in reply["result"]
    assert todo_line(served, uri, 1) == "# TODO \ufffdz"  # same width in UTF-16: positions still hold
    assert offset_of(served, uri, 2, 300) == text.index(binary) + len(binary)
    assert todo_line(served, uri, 3) == "# TODO end"
    _alive(served)


def test_edit_past_the_end_of_the_last_line_appends(served):
    uri = "file:///bad/eof.py"
    served.notify("textDocument/didOpen", open_params(uri, "x = 1"))
    edit = {"range": rng((0, 40), (0, 40)), "text": "\n# TODO tail"}  # pygls put it before the last char
    served.notify("textDocument/didChange", change_params(uri, 2, [edit]))
    assert todo_line(served, uri, 1) == "# TODO tail"
    assert offset_of(served, uri, 0, 99) == len("x = 1")


def test_positions_far_outside_the_document_are_clamped(served):
    uri = "file:///bad/clamp.py"
    served.notify("textDocument/didOpen", open_params(uri, "def f():\n    pass\n"))
    for line, character in [(2**31 - 1, 0), (0, 2**31 - 1), (10**6, 10**6)]:
        reply = served.request("textDocument/inlineCompletion", inline_params(uri, line, character))
        assert "items" in reply["result"]
        reply = served.request(
            "textDocument/completion", {"textDocument": {"uri": uri}, "position": pos(line, character)}
        )
        assert "items" in reply["result"]
    assert offset_of(served, uri, 10**6, 0) == len("def f():\n    pass\n")


def test_did_change_for_a_document_never_opened_is_ignored_quietly(served):
    uri = "file:///bad/never-opened.py"
    served.notify(
        "textDocument/didChange", change_params(uri, 2, [{"range": rng((0, 0), (0, 0)), "text": "x"}])
    )
    reply = served.request("textDocument/inlineCompletion", inline_params(uri, 0, 0))
    assert reply["result"] == {"items": []}
    _alive(served)


def test_unknown_language_is_served(served):
    uri = "file:///bad/notes.klingon"
    served.notify("textDocument/didOpen", open_params(uri, "qapla' batlh\n# TODO x\n", language="klingon"))
    reply = served.request("textDocument/inlineCompletion", inline_params(uri, 0, 6), timeout=60)
    assert "items" in reply["result"]
    _alive(served)


@pytest.mark.parametrize(
    ("language", "text"),
    [
        pytest.param("python", "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n", id="python"),
        pytest.param("javascript", "function f() {\n" + "{" * 5000 + "\n" + "}" * 5000 + "\n}\n", id="js"),
        pytest.param("c", "int f() { return " + "(" * 5000 + "\n", id="c-unclosed"),
    ],
)
def test_deeply_nested_code(served, language, text):
    uri = f"file:///bad/nested.{language}"
    served.notify("textDocument/didOpen", open_params(uri, text, language=language))
    line, character = utf16_position(text, len(text) // 2)
    reply = served.request("textDocument/inlineCompletion", inline_params(uri, line, character), timeout=60)
    assert "items" in reply["result"]
    assert offset_of(served, uri, line, character) == len(text) // 2
    _alive(served)


def test_ten_megabyte_file(served):
    uri = "file:///bad/big.py"
    block = "def f{i}(a, b):\n    '''😀 doc'''\n    return a + b * {i}\n\n\n"
    text = "".join(block.format(i=i) for i in range(200_000))
    text = text[: 10 * 1024 * 1024] + "\n# TODO end\n"
    assert len(text.encode()) > 10 * 1024 * 1024
    started = time.monotonic()
    served.notify("textDocument/didOpen", open_params(uri, text))
    last = text.count("\n") - 1
    assert todo_line(served, uri, last) == "# TODO end"
    reply = served.request("textDocument/inlineCompletion", inline_params(uri, last - 3, 4), timeout=120)
    assert "items" in reply["result"]
    edit = {"range": rng((last, 10), (last, 10)), "text": " here"}
    served.notify("textDocument/didChange", change_params(uri, 2, [edit]))
    assert todo_line(served, uri, last) == "# TODO end here"
    served.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    print(f"10 MB file: open, complete, edit, check in {time.monotonic() - started:.1f}s")
    _alive(served)


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"NaN", b"2.5", b"1" + b"0" * 400, b'"3"', b"true"])
def test_numbers_that_are_not_integers_in_echoed_action_data(served, number):
    """Code-action data comes back from the client; 1e400 (infinite) used to be an internal error."""
    served.notify("textDocument/didOpen", open_params(URI, "def f(x):\n    return \n"))
    data = b'{"action": "fill", "start": %s, "end": 5, "uri": "%s", "version": 1}' % (number, URI.encode())
    resolve = (
        b'{"jsonrpc": "2.0", "id": 71, "method": "codeAction/resolve", "params": {"title": "t", "data": %s}}'
    )
    served.send_bytes(frame(resolve % data))
    assert "edit" not in served.wait_response(71, timeout=30)["result"]
    command = b'{"jsonrpc": "2.0", "id": 72, "method": "workspace/executeCommand", "params": '
    command += b'{"command": "dg-lsp.applyAction", "arguments": [%s]}}' % data
    served.send_bytes(frame(command))
    assert served.wait_response(72, timeout=30)["result"]["applied"] is False
    _alive(served)
