from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A real, randomly initialised tiny DiffusionGemma checkpoint with a real tokenizer."""
    import torch

    from dg_lsp.models.tiny import make_tiny_diffusion_gemma

    torch.set_num_threads(1)
    return make_tiny_diffusion_gemma(tmp_path_factory.mktemp("tiny-dg"))
