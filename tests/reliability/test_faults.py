"""Faults: broken model files, a model that raises in forward, a real out-of-memory, dying clients.

Each must produce one clear message (never one per keystroke), no hang, no process left behind, and
a document state that is still right once the fault is gone.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import FAST, raw_server
from tests.reliability.probes import todo_line
from tests.reliability.rawlsp import change_params, inline_params, open_params, rng

URI = "file:///faults/doc.py"
TEXT = "def add(a, b):\n    return \n# TODO one\n"


def _copy(model_dir: Path, dest: Path) -> Path:
    shutil.copytree(model_dir, dest)
    return dest


def _truncated(model_dir: Path, dest: Path) -> Path:
    path = _copy(model_dir, dest) / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return dest


def _corrupt(model_dir: Path, dest: Path) -> Path:
    path = _copy(model_dir, dest) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:64] = b"\xff" * 56  # inside the JSON header
    path.write_bytes(bytes(data))
    return dest


def _garbage_config(model_dir: Path, dest: Path) -> Path:
    (_copy(model_dir, dest) / "config.json").write_text("{this is not json")
    return dest


def _missing_weights(model_dir: Path, dest: Path) -> Path:
    (_copy(model_dir, dest) / "model.safetensors").unlink()
    return dest


def _fifo_config(model_dir: Path, dest: Path) -> Path:
    """Opening a FIFO to read blocks until a writer comes: this one never gets a writer."""
    config = _copy(model_dir, dest) / "config.json"
    config.unlink()
    os.mkfifo(config)
    return dest


def _endless_tokenizer(model_dir: Path, dest: Path) -> Path:
    tokenizer = _copy(model_dir, dest) / "tokenizer.json"
    tokenizer.unlink()
    tokenizer.symlink_to("/dev/zero")
    return dest


def _fifo_weights(model_dir: Path, dest: Path) -> Path:
    weights = _copy(model_dir, dest) / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    return dest


def _huge_config(model_dir: Path, dest: Path) -> Path:
    """A 20 MB config.json (valid JSON): refused by size before it is read."""
    config = _copy(model_dir, dest) / "config.json"
    data = json.loads(config.read_text())
    data["padding"] = "x" * 20_000_000
    config.write_text(json.dumps(data))
    return dest


def _exploding_tokenizer(model_dir: Path, dest: Path) -> Path:
    """Tokenizer and weights disagree: one extra token whose id is past the embedding table."""
    path = _copy(model_dir, dest) / "tokenizer.json"
    tok = json.loads(path.read_text())
    tok["added_tokens"].append(
        {
            "id": max(t["id"] for t in tok["added_tokens"]) + 10_000,
            "content": "ZZBOOM",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": False,
        }
    )
    path.write_text(json.dumps(tok))
    return dest


def _configure(server, **settings) -> None:
    server.notify("workspace/didChangeConfiguration", {"settings": {"dgLsp": settings}})


def _inline(server, uri=URI, line=1, character=11) -> dict:
    reply = server.request("textDocument/inlineCompletion", inline_params(uri, line, character), timeout=60)
    assert "result" in reply, reply
    return reply["result"]


BREAKERS = [_truncated, _corrupt, _garbage_config, _missing_weights]
# Files that are not regular files or are too big: each used to hang the worker or read without end.
HOSTILE = {
    _fifo_config: "config.json is a FIFO",
    _endless_tokenizer: "tokenizer.json is a device",
    _fifo_weights: "model.safetensors is a FIFO",
    _huge_config: "over the 8,388,608-byte limit",
}


def test_broken_model_files_are_reported_once_and_the_server_recovers(tmp_path, tiny_model_dir):
    broken = [breaker(tiny_model_dir, tmp_path / breaker.__name__) for breaker in BREAKERS]
    with raw_server(tmp_path / "server.log", {"dgLsp": {"model": str(broken[0]), **FAST}}) as server:
        server.notify("textDocument/didOpen", open_params(URI, TEXT))
        version = 1
        for count, model in enumerate(broken, start=1):
            if count > 1:
                _configure(server, model=str(model))
            assert server.wait_loaded(count=count).startswith("failed")
            for _ in range(3):  # keep typing while the model is broken
                assert _inline(server) == {"items": []}
                version += 1
                edit = {"range": rng((2, 99), (2, 99)), "text": "x"}
                server.notify("textDocument/didChange", change_params(URI, version, [edit]))
            errors = server.messages(kind=1)
            assert len(errors) == count, errors  # once per broken model, not once per keystroke
            assert str(model) in errors[-1]
        # Point it at a good model: it loads, completes, and the text typed meanwhile is all there.
        _configure(server, model=str(tiny_model_dir))
        assert server.wait_loaded(count=len(broken) + 1) == "ready"
        assert "items" in _inline(server)
        assert todo_line(server, URI, 2) == "# TODO one" + "x" * 3 * len(broken)
        assert len(server.messages(kind=1)) == len(broken)


def test_fifos_devices_and_huge_files_in_a_model_are_refused_with_text_and_the_server_recovers(
    tmp_path, tiny_model_dir
):
    hostile = {breaker(tiny_model_dir, tmp_path / breaker.__name__): why for breaker, why in HOSTILE.items()}
    models = list(hostile)
    with raw_server(tmp_path / "server.log", {"dgLsp": {"model": str(models[0]), **FAST}}) as server:
        server.notify("textDocument/didOpen", open_params(URI, TEXT))
        for count, model in enumerate(models, start=1):
            if count > 1:
                _configure(server, model=str(model))
            result = server.wait_loaded(count=count, timeout=60)
            assert result.startswith("failed: refusing model file") and hostile[model] in result, result
            assert _inline(server) == {"items": []}
        errors = server.messages(kind=1)
        assert len(errors) == len(models) and all(
            hostile[m] in e for m, e in zip(models, errors, strict=True)
        )
        for fifo in (models[0] / "config.json", models[2] / "model.safetensors"):
            with pytest.raises(OSError) as info:  # succeeds only if some process has it open to read
                os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            assert info.value.errno == errno.ENXIO
        _configure(server, model=str(tiny_model_dir))
        assert server.wait_loaded(count=len(models) + 1) == "ready"
        assert "items" in _inline(server)
        assert server.shutdown() == 0


def test_exception_inside_the_model_fails_the_request_not_the_server(tmp_path, tiny_model_dir):
    model = _exploding_tokenizer(tiny_model_dir, tmp_path / "boom")
    with raw_server(tmp_path / "server.log", {"dgLsp": {"model": str(model), **FAST}}) as server:
        assert server.wait_loaded() == "ready"
        boom = "file:///faults/boom.py"
        server.notify("textDocument/didOpen", open_params(boom, "x = ZZBOOM\ny = \n"))
        server.notify("textDocument/didOpen", open_params(URI, TEXT))
        for _ in range(3):
            assert _inline(server, boom, 1, 4) == {"items": []}
            assert "items" in _inline(server)  # other documents keep completing
        errors = server.messages(kind=1)
        assert len(errors) == 1, errors
        assert "IndexError" in errors[0]
        assert server.shutdown() == 0
    assert "model worker:" in server.log_text() and "3 failed" in server.log_text()


def test_out_of_memory_during_a_step_then_stdin_closed(tmp_path, tiny_model_dir):
    """A real allocation failure: the server's memory is capped, then a step needs more than is left."""
    options = {"dgLsp": {"model": str(tiny_model_dir), **FAST}}
    with raw_server(tmp_path / "server.log", options) as server:
        server.notify("textDocument/didOpen", open_params(URI, TEXT))
        assert "items" in _inline(server)
        status = Path(f"/proc/{server.pid}/status").read_text()
        vm_data = int(next(ln for ln in status.splitlines() if ln.startswith("VmData:")).split()[1]) * 1024
        _, hard = resource.prlimit(server.pid, resource.RLIMIT_DATA)
        # The settings are bounded (numCandidates <= 32), so the cap is tight instead. RLIMIT_DATA, not
        # RLIMIT_AS: it also counts memory committed inside arenas glibc reserved earlier. A 32-candidate,
        # 64-step request on the whole canvas needs about 60 MB more than idle.
        resource.prlimit(server.pid, resource.RLIMIT_DATA, (vm_data + 24 * 2**20, hard))
        _configure(server, numCandidates=32, maxTokens=1024, denoisingSteps=64, latencyBudgetMs=0)
        assert _inline(server) == {"items": []}
        assert _inline(server) == {"items": []}
        errors = server.messages(kind=1)
        assert len(errors) == 1, errors
        assert "out of memory during a completion" in errors[0], errors
        _configure(server, numCandidates=1, maxTokens=8, denoisingSteps=2)
        assert "items" in _inline(server)
        edit = {"range": rng((2, 10), (2, 10)), "text": " two"}
        server.notify("textDocument/didChange", change_params(URI, 2, [edit]))
        assert todo_line(server, URI, 2) == "# TODO one two"
        # Then the editor closes our stdin in the middle of a long request: exit promptly, code 0.
        _configure(server, maxTokens=256, denoisingSteps=64)
        server.request_async("textDocument/inlineCompletion", inline_params(URI, 1, 11))
        time.sleep(0.2)
        server.proc.stdin.close()
        assert server.wait_exit(timeout=20) == 0
        assert "end of input" in server.log_text()


def test_exit_without_shutdown_is_code_1_and_after_shutdown_0(tmp_path, tiny_model_dir):
    with raw_server(tmp_path / "a.log", {"dgLsp": {"model": str(tmp_path / "none")}}, wait_loaded=False) as s:
        s.notify("exit")
        assert s.wait_exit(timeout=20) == 1
    with raw_server(tmp_path / "b.log", {"dgLsp": {"model": str(tmp_path / "none")}}, wait_loaded=False) as s:
        assert s.shutdown() == 0


def test_client_killed_mid_request_leaves_no_process(tmp_path, tiny_model_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.orphan",
            "reaper",
            str(tiny_model_dir),
            str(tmp_path / "s.log"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["exit"] is not None, (report, (tmp_path / "s.log").read_text()[-3000:])
    assert report["leftover"] == []


def test_server_exits_when_the_client_process_dies(tmp_path):
    """LSP `processId`: the editor is gone even though something still holds our stdin open."""
    editor = subprocess.Popen(["sleep", "60"])
    opts = {"dgLsp": {"model": str(tmp_path / "none")}}
    try:
        with raw_server(tmp_path / "server.log", opts, wait_loaded=False, process_id=editor.pid) as server:
            assert server.request("textDocument/codeAction", {"bad": 1})["error"]["code"] == -32602
            editor.kill()
            editor.wait()
            assert server.wait_exit(timeout=20) == 1
            assert "client process" in server.log_text()
    finally:
        if editor.poll() is None:
            editor.kill()
