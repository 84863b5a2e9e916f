"""Plain helpers for the editor end-to-end tests (fixtures live in conftest.py).

The tiny model is random, so its infills are noise; in plain-text buffers (no syntax check rejects
them) it still produces a candidate, which is all these tests need: they assert structure (an item
arrives, accepting it inserts text at the cursor, a code action edits the buffer), never content.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
EDITORS = REPO / "editors"

# One short line of prose: plain text has no syntax check, so the tiny model's output is kept.
SAMPLE_TEXT = "hello world and \n"

T = TypeVar("T")


def editor_env(tmp: Path) -> dict[str, str]:
    """Environment for an editor and the server it spawns: no user config, one thread, offline."""
    env = dict(os.environ)
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        path = tmp / name.lower()
        path.mkdir(exist_ok=True)
        env[name] = str(path)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def wait_for(
    probe: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str, step: float = 0.25
) -> T:
    """Poll `probe` until `ok(value)`; fail with the last value seen so a timeout explains itself."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not ok(value):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last state: {value!r}")
        time.sleep(step)
        value = probe()
    return value
