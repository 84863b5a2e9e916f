"""What an unexpected exception in a handler sends the client: a code and a type name, nothing else.

pygls answers with the exception's text and a `data.traceback` (file paths, source lines); the server's
protocol keeps both in its log.
"""

from __future__ import annotations

import io
import json
import sys

from pygls.exceptions import JsonRpcInternalError, JsonRpcInvalidParams

from dg_lsp.server.app import create_server


class _Sink(io.BytesIO):
    def write(self, data):  # pygls's writer interface
        return super().write(data if isinstance(data, bytes) else data.encode())


def _answer(error) -> dict:
    server = create_server()
    sink = _Sink()
    server.protocol.set_writer(sink)
    server.protocol._send_response(1, error=error)
    body = sink.getvalue().split(b"\r\n\r\n", 1)[1]
    return json.loads(body)["error"]


def test_internal_errors_carry_no_traceback_path_or_exception_text():
    try:
        open("/nonexistent/secret/path.txt")
    except OSError:
        error = JsonRpcInternalError.of(sys.exc_info()).to_response_error()
    assert "traceback" in json.dumps(error.data)  # what pygls would have sent
    answer = _answer(error)
    assert answer == {"code": -32603, "message": "Internal error (FileNotFoundError); see the server log"}


def test_other_errors_keep_their_message_but_lose_data():
    error = JsonRpcInvalidParams("position is missing").to_response_error()
    error.data = {"traceback": ["File x.py"]}
    assert _answer(error) == {"code": -32602, "message": "position is missing"}


class _Exploding:
    """A protocol whose dispatch fails outside any handler: pygls catches handler errors itself, so only
    a stand-in reaches the transport's last-resort path."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def structure_message(self, data):
        return type("Request", (), {"id": data["id"]})()

    def handle_message(self, message):
        raise RuntimeError("/home/user/secret.py exploded")

    def _send_data(self, payload):
        self.sent.append(dict(payload.__dict__))


def test_the_transports_last_resort_answers_without_the_exception_text():
    from dg_lsp.server import transport

    protocol = _Exploding()
    transport.dispatch(protocol, b'{"jsonrpc": "2.0", "id": 3, "method": "x/y"}')
    assert protocol.sent == [
        {
            "jsonrpc": "2.0",
            "id": 3,
            "error": {"code": -32603, "message": "Internal error (RuntimeError); see the server log"},
        }
    ]
