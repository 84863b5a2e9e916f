"""`dg-lsp serve-engine --no-ray` as a real process (the same FastAPI app the Ray ingress runs, on
uvicorn): every malformed or hostile request gets a 4xx at once, one slow request cannot hold the model
past its time limit, and a token guards it when one is set. The Ray deployment's own tests are in
tests/team/test_ray_serve.py (slow).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the team server needs fastapi and uvicorn: pip install -e '.[test]'")

from dg_lsp.engine.remote import RemoteEngine
from dg_lsp.engine.types import InfillRequest

INFILL = {"prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 8, "steps": 2}
FIM = "/v1/fim/completions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_engine(model: Path, log_path: Path, *args: str, env: dict | None = None) -> Iterator[int]:
    port = _free_port()
    log = open(log_path, "wb")
    command = [
        sys.executable,
        "-m",
        "dg_lsp",
        "serve-engine",
        "--no-ray",
        "--model",
        str(model),
        "--engine-port",
        str(port),
    ]
    proc = subprocess.Popen([*command, *args], stdout=log, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _request("GET", port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        yield port
        assert proc.poll() is None, log_path.read_text()
    finally:
        proc.kill()
        proc.wait()
        log.close()


def _request(
    method: str, port: int, path: str, body: dict | None = None, headers: dict | None = None
) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def _raw(port: int, data: bytes, timeout: float = 30) -> tuple[int, dict]:
    """Send bytes as they are; the status and JSON body of the answer (the server closes after errors)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1."), answer[:200]
    try:
        return int(head.split()[1]), json.loads(body or b"{}")
    except ValueError:  # framing errors are answered by uvicorn itself, in plain text
        return int(head.split()[1]), {"error": body.decode(errors="replace")}


def _post(body: bytes, headers: bytes = b"", length: bytes | None = None) -> bytes:
    length = b"%d" % len(body) if length is None else length
    return (
        b"POST /v1/fim/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + headers
        + (b"Content-Length: " + length + b"\r\n" if length != b"none" else b"")
        + b"\r\n"
        + body
    )


GOOD = json.dumps(INFILL).encode()
MALFORMED = {
    "negative length": (_post(b"", length=b"-1"), 400),
    "length 10^12": (_post(b"", length=b"1000000000000"), 413),
    "length not a number": (_post(b"", length=b"abc"), 400),
    "no length": (_post(b"", length=b"none"), 411),
    "chunked": (_post(b"", b"Transfer-Encoding: chunked\r\n", b"none") + b"0\r\n\r\n", 411),
    "array": (_post(b"[1, 2]"), 400),
    "null": (_post(b"null"), 400),
    "string": (_post(b'"x"'), 400),
    "deep nesting": (_post(b"[" * 100_000 + b"]" * 100_000), 400),
    "not json": (_post(b"{oops"), 400),
    "not utf-8": (_post(b'{"prompt": "\xff"}'), 400),
    "text/plain": (_post(GOOD).replace(b"application/json", b"text/plain;charset=UTF-8"), 415),
    "foreign origin": (_post(GOOD, b"Origin: https://evil.example\r\n"), 403),
    "foreign host": (_post(GOOD).replace(b"Host: 127.0.0.1", b"Host: evil.example"), 403),
    "origin on GET": (b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: null\r\n\r\n", 403),
    "100k candidates": (_post(json.dumps({**INFILL, "n": 100_000}).encode()), 400),
    "10^9 tokens": (_post(json.dumps({**INFILL, "max_tokens": 10**9}).encode()), 400),
    "seed 2^70": (_post(json.dumps({**INFILL, "seed": 2**70}).encode()), 400),
    "prompt not a string": (_post(json.dumps({**INFILL, "prompt": 5}).encode()), 400),
    "no prompt": (_post(json.dumps({"suffix": "x"}).encode()), 400),
    "stream": (_post(json.dumps({**INFILL, "stream": True}).encode()), 400),
    "1 MB prompt": (
        _post(json.dumps({**INFILL, "prompt": "x = 1\n" * 50_000, "suffix": "y\n" * 120_000}).encode()),
        413,
    ),
    "20 MB body, unsent": (_post(b"", length=b"20000000"), 413),
    "unknown path": (_post(GOOD).replace(b"/v1/fim/completions", b"/admin"), 404),
}


def test_every_malformed_or_hostile_request_gets_a_4xx_at_once(tmp_path, tiny_model_dir):
    with serve_engine(tiny_model_dir, tmp_path / "engine.log") as port:
        for name, (data, status) in MALFORMED.items():
            started = time.monotonic()
            got, body = _raw(port, data)
            assert (got, name) == (status, name), body
            assert isinstance(body.get("error"), str) and body["error"], (name, body)
            assert time.monotonic() - started < 10, name
            assert _request("GET", port, "/health")[0] == 200, name
        # A body that stops arriving frees its thread after the read timeout, with an answer.
        got, body = _raw(port, _post(b'{"prompt": ', length=b"100"), timeout=30)
        assert got == 408, body
        status, result = _request("POST", port, FIM, INFILL)
        assert status == 200 and result["dg_lsp"]["stats"]["forward_passes"] == 2
        log = (tmp_path / "engine.log").read_text()
        assert "Traceback" not in log


@pytest.mark.parametrize("scheduling", [[], ["--continuous-batching"]], ids=["static", "continuous"])
def test_one_slow_request_cannot_hold_the_model_past_its_limit(tmp_path, tiny_model_dir, scheduling):
    """100,000 steps on every block of 1,024 tokens would run for hours; the server's limit (its deadline
    caps the steps, and a hard stop between steps backs it) ends it within about a second, with static
    batches and with continuous batching."""
    with serve_engine(tiny_model_dir, tmp_path / "engine.log", "--request-timeout", "1", *scheduling) as port:
        _request("POST", port, FIM, INFILL)  # warm
        slow = {**INFILL, "max_tokens": 1024, "steps": 100_000, "n": 32, "deadline_ms": 3.6e6}
        started = time.monotonic()
        status, body = _request("POST", port, FIM, slow)
        assert time.monotonic() - started < 5
        assert status == 200 or (status == 504 and "longer than 1 s" in body["error"]), body
        started = time.monotonic()
        assert _request("POST", port, FIM, INFILL)[0] == 200
        assert time.monotonic() - started < 5


def test_a_token_guards_the_engine_and_the_client_sends_it(tmp_path, tiny_model_dir, monkeypatch):
    secret = "s3cret-" + "x" * 20
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    log = tmp_path / "engine.log"
    with serve_engine(tiny_model_dir, log, "--token-file", str(token_file)) as port:
        assert _request("POST", port, FIM, INFILL)[0] == 401
        assert _request("POST", port, FIM, INFILL, {"Authorization": "Bearer wrong"})[0] == 401
        assert _request("GET", port, "/v1/models")[0] == 401
        status, _ = _request("POST", port, FIM, INFILL, {"Authorization": f"Bearer {secret}"})
        assert status == 200
        monkeypatch.setenv("DG_LSP_ENGINE_TOKEN", secret)
        client = RemoteEngine(f"http://127.0.0.1:{port}")
        assert (
            client.infill(InfillRequest(INFILL["prompt"], "\n", max_tokens=8, steps=2)).stats.forward_passes
            == 2
        )
    assert secret not in log.read_text()


def test_off_loopback_a_token_is_required(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "dg_lsp", "--host", "0.0.0.0", "--allow-remote", "serve-engine"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.returncode == 2 and "--token-file" in out.stderr, out.stderr


@pytest.mark.parametrize("content", ["", "\n"])
def test_an_empty_token_file_is_an_error(tmp_path, content):
    token_file = tmp_path / "token"
    token_file.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "dg_lsp", "serve-engine", "--token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "empty" in out.stderr and "Traceback" not in out.stderr
