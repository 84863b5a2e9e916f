"""The server starts the way editors start it: LSP clients append transport flags of their own.

vscode-languageclient appends `--stdio` to a command run with TransportKind.stdio (and
`--clientProcessId=N` for node servers); a server that rejects them exits before `initialize`, which
VS Code reports only as "crashed 5 times".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _frame(payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _responses(raw: bytes) -> list[dict]:
    out = []
    while b"\r\n\r\n" in raw:
        head, rest = raw.split(b"\r\n\r\n", 1)
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        out.append(json.loads(rest[:length]))
        raw = rest[length:]
    return out


@pytest.mark.parametrize(
    "flags",
    [
        ["--stdio"],
        ["--stdio", f"--clientProcessId={os.getpid()}"],
        ["serve", "--stdio"],
    ],
    ids=["stdio", "stdio+clientProcessId", "serve-stdio"],
)
def test_server_accepts_client_transport_flags(flags: list[str]) -> None:
    messages = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"processId": os.getpid(), "rootUri": None, "capabilities": {}},
        },
        {"jsonrpc": "2.0", "id": 2, "method": "shutdown"},
        {"jsonrpc": "2.0", "method": "exit"},
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "dg_lsp", *flags],
        input=b"".join(_frame(m) for m in messages),
        capture_output=True,
        timeout=120,
    )
    replies = {r.get("id"): r for r in _responses(proc.stdout)}
    assert "result" in replies.get(1, {}), proc.stderr.decode(errors="replace")[-2000:]
    assert replies[1]["result"]["serverInfo"]["name"]
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]


def test_stdio_and_tcp_together_is_a_usage_error() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dg_lsp", "--stdio", "--tcp"], capture_output=True, timeout=120
    )
    assert proc.returncode == 2
    assert b"--stdio and --tcp" in proc.stderr
