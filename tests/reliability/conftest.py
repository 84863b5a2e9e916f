from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.rawlsp import RawServer

FAST = {"debounceMs": 0, "maxTokens": 8, "denoisingSteps": 2, "latencyBudgetMs": 0}


@contextlib.contextmanager
def raw_server(
    log_path: Path,
    options: dict[str, Any] | None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    wait_loaded: bool = True,
    capabilities: dict[str, Any] | None = None,
    process_id: int | None = None,
) -> Iterator[RawServer]:
    """A real `dg-lsp` over stdio, initialized (and loaded); its log is printed if the test fails."""
    server = RawServer(args or [], log_path, env)
    try:
        server.init_reply = server.initialize(options, capabilities, process_id)
        if wait_loaded:
            server.wait_loaded()
        yield server
    except BaseException:
        print(f"--- server log {log_path} ---\n{server.log_text()[-6000:]}")
        raise
    finally:
        server.kill()


@pytest.fixture(scope="module")
def served(tiny_model_dir, tmp_path_factory) -> Iterator[RawServer]:
    """One long-lived server per module: many messages to one process is how editors use it."""
    log = tmp_path_factory.mktemp("served") / "server.log"
    with raw_server(log, {"dgLsp": {"model": str(tiny_model_dir), **FAST}}) as server:
        yield server
