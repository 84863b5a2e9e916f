"""Security: loopback-only TCP, one client per server, no network at run time, no remote code unless
opted in, no file reads beyond what the client sent, and no execution of anything a model produced.
"""

from __future__ import annotations

import ast
import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import FAST, raw_server
from tests.reliability.rawlsp import change_params, code_action_params, encode, inline_params, pos

ROOT = Path(__file__).resolve().parents[2]
REMOTE_MODULE = """
import os
from pathlib import Path

Path(os.environ["DG_LSP_REMOTE_CODE_MARKER"]).write_text("remote code ran")

from transformers import Gemma4ForCausalLM


class RemoteGemma4ForCausalLM(Gemma4ForCausalLM):
    pass
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_frame(sock: socket.socket) -> dict:
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


def _listening_addresses(port: int) -> list[str]:
    """Local addresses of LISTEN sockets on `port`, from /proc/net/tcp{,6} (hex, as the kernel writes)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


def test_tcp_is_loopback_only_and_serves_one_client_at_a_time(tmp_path):
    port = _free_port()
    log = open(tmp_path / "tcp.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dg_lsp", "--tcp", "--port", str(port), "--model", str(tmp_path / "none")],
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + 60
        while not _listening_addresses(port):
            assert proc.poll() is None and time.monotonic() < deadline, "server never listened"
            time.sleep(0.1)
        assert _listening_addresses(port) == ["0100007F"]  # 127.0.0.1, nothing else
        first = socket.create_connection(("127.0.0.1", port), timeout=30)
        init = {"processId": None, "rootUri": None, "capabilities": {}}
        first.sendall(encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}))
        assert _read_frame(first)["result"]["serverInfo"]["name"] == "dg-lsp"
        # A second connection would hijack the first session: it is closed at once.
        second = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert second.recv(1) == b""
        second.close()
        first.sendall(encode({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}))
        assert _read_frame(first)["id"] == 2
        first.sendall(encode({"jsonrpc": "2.0", "method": "exit"}))
        assert proc.wait(timeout=30) == 0
        first.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_tcp_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "dg_lsp", "--tcp", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("host", ["::", "example.com"])
def test_tcp_refuses_other_hosts_without_opt_in(host):
    out = subprocess.run(
        [sys.executable, "-m", "dg_lsp", "--tcp", "--host", host, "--port", str(_free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "--allow-remote" in out.stderr


@pytest.fixture
def remote_code_model(tmp_path) -> Path:
    """A tiny causal LM whose config asks for custom code; importing that code leaves a marker file."""
    import torch

    from dg_lsp.models.tiny_extra import make_tiny_causal_lm

    torch.set_num_threads(1)
    path = make_tiny_causal_lm(tmp_path / "remote-code-model")
    (path / "remote_model.py").write_text(REMOTE_MODULE)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "remote_model.RemoteGemma4ForCausalLM"}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _no_opt_in(tmp_path: Path) -> dict[str, str]:
    """An environment where the person at the keyboard allowed nothing (no user config file either)."""
    return {"DG_LSP_CONFIG": str(tmp_path / "no-config.toml"), "DG_LSP_TRUST_REMOTE_CODE": ""}


def test_no_network_no_remote_code_and_no_reads_beyond_sent_documents(tmp_path, remote_code_model):
    # Every way a download could leave the process points at this loopback trap.
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(16)
    trap.setblocking(False)
    url = f"http://127.0.0.1:{trap.getsockname()[1]}"
    marker = tmp_path / "remote-code-ran"
    env = {
        "HF_HUB_OFFLINE": "0",  # the user's environment says downloads are fine: the server disagrees
        "TRANSFORMERS_OFFLINE": "0",
        "HF_ENDPOINT": url,
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_MODULES_CACHE": str(tmp_path / "hf-modules"),
        "DG_LSP_REMOTE_CODE_MARKER": str(marker),
        **_no_opt_in(tmp_path),
    }
    options = {"dgLsp": {"model": "some-org/some-hub-model", **FAST}}
    with raw_server(tmp_path / "server.log", options, env=env) as server:
        # A hub id is not fetched: it is a missing local directory, reported once.
        assert "model directory not found" in server.load_results()[0]
        server.notify(
            "workspace/didChangeConfiguration", {"settings": {"dgLsp": {"model": str(remote_code_model)}}}
        )
        assert server.wait_loaded(count=2) == "ready"
        assert not marker.exists()  # the config asked for custom code; trust_remote_code is off

        _check_unopened_file_is_never_read(server, tmp_path)

        # A setting that arrives over the socket is no proof the user opted in: ignored, said once.
        settings = {"model": str(remote_code_model), "trustRemoteCode": True}
        server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": settings}})
        assert server.wait_loaded(count=3) == "ready"
        assert not marker.exists()
        warnings = [m for m in server.messages(kind=2) if "trustRemoteCode" in m]
        assert len(warnings) == 1 and "--trust-remote-code" in warnings[0], server.messages()

        # Nor may a setting name a remote engine: it would send the user's code to that address.
        remote = {"model": f"remote:{url}"}
        server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": remote}})
        assert "refused" in server.wait_loaded(count=4)
        assert any("--model remote:" in m for m in server.messages(kind=1)), server.messages()
        server.notify("workspace/didChangeConfiguration", {"settings": {"backend": "remote", "model": url}})
        assert "refused" in server.wait_loaded(count=5)
        assert server.shutdown() == 0
    assert "Traceback" not in json.dumps(server.notifications)
    with pytest.raises(BlockingIOError):
        trap.accept()  # nobody ever connected
    trap.close()


@pytest.mark.parametrize("opt_in", ["flag", "environment", "config file"])
def test_remote_code_runs_only_on_a_local_opt_in_which_the_setting_can_narrow(
    tmp_path, remote_code_model, opt_in
):
    marker = tmp_path / "remote-code-ran"
    env = {**_no_opt_in(tmp_path), "DG_LSP_REMOTE_CODE_MARKER": str(marker)}
    args = []
    if opt_in == "flag":
        args = ["--trust-remote-code"]
    elif opt_in == "environment":
        env["DG_LSP_TRUST_REMOTE_CODE"] = "1"
    else:
        (tmp_path / "config.toml").write_text("trust_remote_code = true\n")
        env["DG_LSP_CONFIG"] = str(tmp_path / "config.toml")
    # The editor turns it off: narrowing is always allowed.
    options = {"dgLsp": {"model": str(remote_code_model), "trustRemoteCode": False, **FAST}}
    with raw_server(tmp_path / "server.log", options, args=args, env=env) as server:
        assert server.load_results() == ["ready"]
        assert not marker.exists()
        server.notify("workspace/didChangeConfiguration", {"settings": {"trustRemoteCode": True}})
        assert server.wait_loaded(count=2) == "ready"
        assert marker.read_text() == "remote code ran"
        assert server.messages() == []
        assert server.shutdown() == 0


def test_a_remote_engine_named_on_the_command_line_is_allowed(tmp_path):
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(4)
    trap.settimeout(60)
    url = f"http://127.0.0.1:{trap.getsockname()[1]}"
    args = ["--model", f"remote:{url}"]
    with raw_server(
        tmp_path / "server.log", {}, args=args, env=_no_opt_in(tmp_path), wait_loaded=False
    ) as server:
        connection, _ = trap.accept()  # the server asks the engine to describe itself
        connection.close()
        assert "not reachable" in server.wait_loaded()
        assert server.shutdown() == 0
    trap.close()


def _check_unopened_file_is_never_read(server, tmp_path: Path) -> None:
    """A FIFO stands in for /etc/passwd: opening it to read would block, so any read attempt hangs."""
    fifo = tmp_path / "secret.py"
    os.mkfifo(fifo)
    uri = fifo.as_uri()
    data = {"action": "fill", "start": 0, "end": 0, "uri": uri, "version": 1}
    server.notify("textDocument/didChange", change_params(uri, 2, [{"text": "x"}]))
    empty = {
        "textDocument/inlineCompletion": {"items": []},
        "textDocument/completion": {"isIncomplete": True, "items": []},
        "textDocument/codeAction": [],
    }
    for method, params in [
        ("textDocument/inlineCompletion", inline_params(uri, 0, 0)),
        ("textDocument/completion", {"textDocument": {"uri": uri}, "position": pos(0, 0)}),
        ("textDocument/codeAction", code_action_params(uri, (0, 0), (0, 0))),
    ]:
        assert server.request(method, params, timeout=30)["result"] == empty[method], method
    resolved = server.request("codeAction/resolve", {"title": "Fill in here (dg-lsp)", "data": data})
    assert "edit" not in resolved["result"]
    command = {"command": "dg-lsp.applyAction", "arguments": [data]}
    assert server.request("workspace/executeCommand", command)["result"]["applied"] is False
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    assert server.request("textDocument/codeAction", code_action_params(uri, (0, 0), (0, 0)))["result"] == []
    with pytest.raises(OSError) as info:
        os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # succeeds only if some process opened it to read
    assert info.value.errno == errno.ENXIO
    fds = [os.readlink(p) for p in Path(f"/proc/{server.pid}/fd").iterdir() if p.is_symlink()]
    assert str(fifo) not in fds
    assert all(r["method"] != "workspace/applyEdit" for r in server.server_requests)


RISKY_CALLS = {"eval", "exec", "compile", "__import__"}
RISKY_ATTRS = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "run"),
    ("subprocess", "Popen"),
    ("subprocess", "call"),
    ("subprocess", "check_output"),
    ("pickle", "loads"),
    ("pickle", "load"),
    ("marshal", "loads"),
    ("torch", "load"),
}


def test_nothing_on_the_model_output_path_can_execute_code():
    """Model output only ever becomes text in a response: no eval/exec/shell/pickle anywhere it flows."""
    files = [ROOT / "dg_lsp" / "pipeline.py"]
    for package in ("server", "context", "engine"):
        files += sorted((ROOT / "dg_lsp" / package).rglob("*.py"))
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                found += [
                    f"{path.name}: import {n}" for n in names if n.split(".")[0] in {"subprocess", "pickle"}
                ]
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Name) and func.id in RISKY_CALLS:
                found.append(f"{path.name}:{node.lineno} {func.id}()")
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if (func.value.id, func.attr) in RISKY_ATTRS:
                    found.append(f"{path.name}:{node.lineno} {func.value.id}.{func.attr}()")
    assert len(files) > 20
    assert found == []
