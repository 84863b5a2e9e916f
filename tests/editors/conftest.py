"""Fixtures for the editor end-to-end tests: a tiny real model and the real server command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dg_lsp.models.tiny import make_tiny_diffusion_gemma

    return make_tiny_diffusion_gemma(tmp_path_factory.mktemp("editor-tiny-model"))


@pytest.fixture(scope="session")
def server_cmd() -> list[str]:
    """The real server, from the same interpreter that runs the tests (what `dg-lsp` runs)."""
    return [sys.executable, "-m", "dg_lsp"]


@pytest.fixture(scope="session")
def server_settings(tiny_model_dir: Path) -> dict[str, object]:
    """Editor-side settings in the server's camelCase; small numbers keep each infill quick on CPU."""
    return {
        "model": str(tiny_model_dir),
        "device": "cpu",
        "maxTokens": 8,
        "denoisingSteps": 2,
        "debounceMs": 0,
        "latencyBudgetMs": 20000,
    }
