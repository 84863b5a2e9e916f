"""TCP mode and the command line, as a user would run them."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from lsprotocol import types

from tests.lsp_harness import CLIENT_CAPABILITIES, HarnessClient

EXAMPLE = Path(__file__).resolve().parents[2] / "dg_lsp" / "examples" / "stack.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dg(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dg_lsp", *args], capture_output=True, text=True, timeout=timeout
    )


def test_tcp_mode_serves_on_loopback(tmp_path, tiny_model_dir):
    port = _free_port()
    log = open(tmp_path / "tcp.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dg_lsp", "--tcp", "--port", str(port), "--model", str(tiny_model_dir)],
        stdout=log,
        stderr=log,
    )

    async def scenario():
        deadline = time.monotonic() + 60
        client = HarnessClient()
        while True:
            try:
                await client.start_tcp("127.0.0.1", port)
                break
            except OSError:
                assert time.monotonic() < deadline, "server never listened"
                await asyncio.sleep(0.2)
        result = await asyncio.wait_for(
            client.initialize_async(
                types.InitializeParams(capabilities=CLIENT_CAPABILITIES, process_id=None)
            ),
            30,
        )
        assert result.server_info.name == "dg-lsp"
        client.initialized(types.InitializedParams())
        await asyncio.wait_for(client.loaded.wait(), 120)
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri="file:///t.py", language_id="python", version=1, text="def f(x):\n    return \n"
                )
            )
        )
        reply = await asyncio.wait_for(
            client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri="file:///t.py"),
                    position=types.Position(line=1, character=11),
                    context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Invoked
                    ),
                )
            ),
            60,
        )
        assert isinstance(reply, types.InlineCompletionList)
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()

    try:
        asyncio.run(scenario())
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_tcp_refuses_non_loopback_without_opt_in():
    out = _dg("--tcp", "--host", "0.0.0.0", "--port", str(_free_port()), timeout=60)
    assert out.returncode == 2
    assert "--allow-remote" in out.stderr


def test_version():
    out = _dg("--version", timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("dg-lsp ")


def test_complete_prints_an_infill_for_the_example(tiny_model_dir):
    out = _dg(
        "complete",
        str(EXAMPLE),
        "--line",
        "17",
        "--character",
        "16",
        "--model",
        str(tiny_model_dir),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["language"] == "python"
    assert data["span_kind"]
    assert data["stats"]["forward_passes"] >= 1 or data["skipped"]
    assert data["engine"]["model"] == str(tiny_model_dir)
    text = EXAMPLE.read_text()
    assert text[: data["offset"]].endswith("        return ")


def test_complete_at_a_lines_indentation_puts_whole_lines_above_it():
    """The 5M model, cursor at column 0 of `return self.items.pop()`: what comes back is whole lines that
    go in above that code, which keeps its own line, and the file still parses. (The default SmolLM2 model
    writes that very line again there, which the clean-up rightly drops as a repeat of the code below.)"""
    from dg_lsp.context import parse_snapshot

    out = _dg(
        "complete", str(EXAMPLE), "--line", "14", "--character", "1", "--json", "--model", "embedded-tiny"
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["span_kind"] == "line_above"
    assert data["candidates"], data
    src = EXAMPLE.read_text()
    for text in data["candidates"]:
        filled = src[: data["offset"]] + text + src[data["offset"] :]
        assert text.endswith("\n") and filled.endswith(src[data["offset"] :])
        assert not parse_snapshot(filled, "python").tree.root_node.has_error, filled


def test_complete_reports_unreadable_file(tmp_path):
    out = _dg("complete", str(tmp_path / "missing.py"), "--line", "1", "--character", "1", timeout=60)
    assert out.returncode == 2
    assert "cannot read" in out.stderr


def test_doctor_reports_model_and_grammars(tiny_model_dir):
    out = _dg("doctor", "--model", str(tiny_model_dir))
    assert "grammar python" in out.stdout
    assert "model" in out.stdout
    assert out.returncode == 0, out.stdout + out.stderr


def test_doctor_fails_on_missing_model(tmp_path):
    out = _dg("doctor", "--model", str(tmp_path / "nope"))
    assert out.returncode == 1
    assert "model directory not found" in out.stdout


def test_doctor_says_what_the_user_allowed_and_what_is_wrong_with_the_config(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("trust_remote_code = [\n")
    env = {**os.environ, "DG_LSP_CONFIG": str(config), "DG_LSP_TRUST_REMOTE_CODE": ""}
    command = [sys.executable, "-m", "dg_lsp", "doctor", "--model", str(tmp_path / "nope")]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert "[FAIL] config" in out.stdout and "not valid TOML" in out.stdout
    assert "[ok  ] remote code    off. To allow it" in out.stdout
    config.write_text('remote_engines = ["http://team:8765"]\n')
    out = subprocess.run(
        [*command, "--trust-remote-code"], capture_output=True, text=True, timeout=300, env=env
    )
    assert "[warn] remote code    allowed" in out.stdout
    assert "allowed: http://team:8765" in out.stdout and "[FAIL] config" not in out.stdout
