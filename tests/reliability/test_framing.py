"""Framing as a security boundary: only LSP header lines open a frame, over stdio and over TCP.

A web page can make the browser send HTTP to any loopback port (`fetch(url, {method: "POST", mode:
"no-cors", body})`, a `text/plain` body the page chooses). Such a request always starts with a request
line and carries headers like `Host` and `Origin`; its body can be a perfect LSP message. Each class of
input below must close the connection before anything reaches the dispatcher, and over TCP the server
must keep waiting for its real editor.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import raw_server
from tests.reliability.rawlsp import RawServer, encode, frame

INIT = {"processId": None, "rootUri": None, "capabilities": {}, "initializationOptions": {}}


def _message(method: str, msg_id: int | None = None, params: dict | None = None) -> bytes:
    body: dict = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        body["id"] = msg_id
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode()


def browser_post(body: bytes, port: int = 2087, newline: bytes = b"\r\n") -> bytes:
    """What Chrome sends for `fetch("http://127.0.0.1:PORT/", {method: "POST", mode: "no-cors", body})`."""
    lines = [
        b"POST / HTTP/1.1",
        b"Host: 127.0.0.1:%d" % port,
        b"Connection: keep-alive",
        b"Content-Length: %d" % len(body),
        b"User-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/130.0",
        b"Content-Type: text/plain;charset=UTF-8",
        b"Accept: */*",
        b"Origin: https://evil.example",
        b"Sec-Fetch-Mode: no-cors",
        b"",
        b"",
    ]
    return newline.join(lines) + body


INIT_BODY = _message("initialize", 1, INIT)
FOREIGN = {
    "http request": browser_post(INIT_BODY),
    "http request, LF only": browser_post(INIT_BODY, newline=b"\n"),
    "websocket upgrade": b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\r\n",
    "Host header first": b"Host: 127.0.0.1\r\n" + frame(INIT_BODY),
    "Origin header first": b"Origin: https://evil.example\r\n" + frame(INIT_BODY),
    "lowercase user-agent": b"user-agent: x\ncontent-length: %d\n\n" % len(INIT_BODY) + INIT_BODY,
    "unknown header": b"X-Anything: 1\r\n" + frame(INIT_BODY),
    "negative length": b"Content-Length: -1\r\n\r\n" + INIT_BODY,
    "binary garbage": b"\x00\xff\xfe garbage\r\n" + frame(INIT_BODY),
    "body without header": INIT_BODY + b"\r\n\r\n",
    "over-long line": b"A" * 70_000 + b"\r\n" + frame(INIT_BODY),
}


@pytest.mark.parametrize("data", FOREIGN.values(), ids=FOREIGN.keys())
def test_stdio_closes_on_anything_but_lsp_headers_before_the_first_frame(tmp_path, data):
    server = RawServer([], tmp_path / "server.log")
    try:
        try:
            server.send_bytes(data)
        except BrokenPipeError:  # it closed before reading everything: that is the point
            pass
        assert server.wait_exit(timeout=30) == 1
        assert server.drain() == [] and server.notifications == []  # not one byte of it was handled
        log = server.log_text()
        assert log.count("closing the connection") == 1, log
    finally:
        server.kill()


def test_lenient_lsp_headers_still_open_a_session(tmp_path):
    """Any case, LF or CRLF, Content-Type anywhere, blank lines between frames: all still LSP."""
    server = RawServer([], tmp_path / "server.log")
    try:
        init = _message("initialize", 1, dict(INIT, initializationOptions={"model": str(tmp_path / "x")}))
        server.send_bytes(b"\r\n\ncontent-type: application/vscode-jsonrpc; charset=utf-8\n")
        server.send_bytes(b"CONTENT-LENGTH: %d\n\n" % len(init) + init)
        assert server.wait_response(1, timeout=60)["result"]["serverInfo"]["name"] == "dg-lsp"
        assert server.shutdown() == 0
    finally:
        server.kill()


def test_http_header_after_the_first_frame_still_closes_but_junk_resynchronises(tmp_path):
    options = {"model": str(tmp_path / "none")}
    with raw_server(tmp_path / "server.log", options, wait_loaded=False) as server:
        # Junk between frames (a too-short frame's tail) is skipped: the next frame is served.
        server.send_bytes(b"}} leftover junk\r\n" + encode({"jsonrpc": "2.0", "id": 7, "method": "x/y"}))
        assert server.wait_response(7, timeout=30)["error"]["code"] == -32601
        request = encode({"jsonrpc": "2.0", "id": 8, "method": "x"})
        server.send_bytes(b"Origin: https://evil.example\r\n" + request)
        assert server.wait_exit(timeout=30) == 1
        assert "an HTTP header" in server.log_text()


def test_requests_after_shutdown_are_invalid_and_exit_still_exits(tmp_path):
    with raw_server(tmp_path / "server.log", {"model": str(tmp_path / "none")}, wait_loaded=False) as server:
        assert server.request("shutdown")["result"] is None
        for msg_id, method in enumerate(["textDocument/completion", "shutdown", "initialize", "x/y"], 50):
            server.send({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": {}})
            reply = server.wait_response(msg_id, timeout=30)
            assert reply["error"]["code"] == -32600, reply
            assert "after shutdown" in reply["error"]["message"]
        server.notify("textDocument/didOpen", {"bad": 1})  # a notification: ignored, no answer
        server.notify("exit")
        assert server.wait_exit(timeout=30) == 0


# -- TCP: the server waits for its editor whatever reaches the port first ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recv_all(sock: socket.socket, timeout: float = 30) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:  # closed with our unread request still in its buffer: a reset
        pass
    return data


def _read_frame(sock: socket.socket) -> dict:
    sock.settimeout(60)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, "connection closed"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = int(header.split(b"Content-Length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(4096)
    return json.loads(body[:length])


@pytest.fixture
def tcp_server(tmp_path):
    port = _free_port()
    log_path = tmp_path / "tcp.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dg_lsp", "--tcp", "--port", str(port), "--model", str(tmp_path / "none")],
        stdout=log,
        stderr=log,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()  # a probe, like a port check
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "server never listened"
            time.sleep(0.1)
    try:
        yield proc, port, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_tcp_survives_probes_browsers_and_garbage_then_serves_its_editor(tcp_server, tmp_path):
    proc, port, log_path = tcp_server
    # A trap where a browser-sent `model: remote:...` would make the server connect.
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(4)
    trap.setblocking(False)
    options = {"model": f"remote:http://127.0.0.1:{trap.getsockname()[1]}", "trustRemoteCode": True}
    attack_init = _message("initialize", 1, dict(INIT, initializationOptions=options))
    attacks = [
        browser_post(attack_init, port),
        browser_post(_message("initialized", params={}), port),
        b"Host: 127.0.0.1\r\n" + frame(attack_init),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n",  # a TLS ClientHello's first bytes
        # A real header, then half the body and silence: it would hold the only client slot for good.
        b"Content-Length: 500\r\n\r\n{",
        b"GET / HTTP/1.0\r\n\r\n",
    ]
    for data in attacks:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(data)
            assert _recv_all(sock) == b""  # closed, no answer of any kind
    for _ in range(3):  # early disconnects: connect and close, or half a header then close
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"Content-Len")
    time.sleep(0.5)
    assert proc.poll() is None, log_path.read_text()
    with pytest.raises(BlockingIOError):
        trap.accept()
    trap.close()

    # Now the editor: a real session, and only after it ends does the server exit.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as editor:
        editor.sendall(encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        assert _read_frame(editor)["result"]["serverInfo"]["name"] == "dg-lsp"
        editor.sendall(encode({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
        assert _read_frame(editor)["id"] == 2
        editor.sendall(encode({"jsonrpc": "2.0", "method": "exit"}))
        assert proc.wait(timeout=30) == 0
    log = log_path.read_text()
    assert "an HTTP request line" in log and "an HTTP header" in log and "no LSP frame within" in log


def test_tcp_editor_disconnect_after_initialize_ends_the_server(tcp_server):
    proc, port, _ = tcp_server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as editor:
        editor.sendall(encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        assert _read_frame(editor)["id"] == 1
    assert proc.wait(timeout=30) == 0


def test_tcp_half_frame_then_disconnect_keeps_listening(tcp_server):
    proc, port, log_path = tcp_server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b'Content-Length: 500\r\n\r\n{"jsonrpc"')  # the body never completes
    time.sleep(0.5)
    assert proc.poll() is None, Path(log_path).read_text()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as editor:
        editor.sendall(encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT}))
        assert _read_frame(editor)["id"] == 1
        editor.sendall(encode({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
        assert _read_frame(editor)["id"] == 2
        editor.sendall(encode({"jsonrpc": "2.0", "method": "exit"}))
        assert proc.wait(timeout=30) == 0
