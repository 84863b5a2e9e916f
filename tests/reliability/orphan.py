"""An editor killed mid-request: does its `dg-lsp` exit, and is nothing left behind?

`python -m tests.reliability.orphan reaper MODEL_DIR LOG` becomes a child subreaper (so orphans are
reparented to it and can be waited for), starts an `editor` process that runs dg-lsp and sends a slow
request, SIGKILLs the editor while the request is in flight, then waits for the server and prints
one JSON line: the server's exit status, how long it took, and any process still left.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def editor(model_dir: str, log: str) -> None:
    from tests.reliability.rawlsp import RawServer, inline_params, open_params

    server = RawServer(["--model", model_dir], Path(log))
    opts = {"dgLsp": {"debounceMs": 0, "maxTokens": 256, "denoisingSteps": 64, "latencyBudgetMs": 0}}
    server.initialize(opts)
    server.wait_loaded()
    uri = "file:///orphan.py"
    server.notify("textDocument/didOpen", open_params(uri, "def f(x):\n    return \n"))
    server.request_async("textDocument/inlineCompletion", inline_params(uri, 1, 11))
    print(json.dumps({"server_pid": server.pid}), flush=True)
    time.sleep(120)  # killed long before this


def reaper(model_dir: str, log: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.orphan", "editor", model_dir, log],
        stdout=subprocess.PIPE,
        text=True,
    )
    server_pid = json.loads(child.stdout.readline())["server_pid"]
    time.sleep(0.3)  # the request is being denoised
    child.send_signal(signal.SIGKILL)
    child.wait()
    started = time.monotonic()
    status = None
    while time.monotonic() - started < 30:
        pid, raw = os.waitpid(-1, os.WNOHANG)
        if pid == server_pid:
            status = os.waitstatus_to_exitcode(raw)
            break
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    leftover = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                leftover.append({"pid": int(entry.name), "state": fields[0]})
    if status is None:
        os.kill(server_pid, signal.SIGKILL)
    print(json.dumps({"server_pid": server_pid, "exit": status, "seconds": elapsed, "leftover": leftover}))


if __name__ == "__main__":
    {"editor": editor, "reaper": reaper}[sys.argv[1]](*sys.argv[2:])
