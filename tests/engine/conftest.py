"""Tiny real checkpoints, built once per session, for every engine test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dg_dir(tmp_path_factory):
    from dg_lsp.models.tiny import make_tiny_diffusion_gemma

    return make_tiny_diffusion_gemma(tmp_path_factory.mktemp("tiny-dg"))


@pytest.fixture(scope="session")
def tiny_causal_dir(tmp_path_factory):
    from dg_lsp.models.tiny_extra import make_tiny_causal_lm

    return make_tiny_causal_lm(tmp_path_factory.mktemp("tiny-causal"))


@pytest.fixture(scope="session")
def tiny_masked_dir(tmp_path_factory):
    from dg_lsp.models.tiny_extra import make_tiny_masked_lm

    return make_tiny_masked_lm(tmp_path_factory.mktemp("tiny-masked"))


@pytest.fixture(scope="session")
def tiny_shifted_dir(tmp_path_factory):
    from dg_lsp.models.tiny_extra import make_tiny_masked_lm

    return make_tiny_masked_lm(tmp_path_factory.mktemp("tiny-masked-shift"), seed=1, logits_shift=True)


@pytest.fixture(scope="session")
def tiny_bidirectional_dir(tmp_path_factory):
    from dg_lsp.models.tiny_extra import make_tiny_bidirectional_lm

    return make_tiny_bidirectional_lm(tmp_path_factory.mktemp("tiny-bidir"))


@pytest.fixture(scope="session")
def dg_engine(tiny_dg_dir):
    from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine

    return DiffusionGemmaEngine(tiny_dg_dir)


@pytest.fixture(scope="session")
def ar_engine(tiny_causal_dir):
    from dg_lsp.engine.ar import AutoregressiveEngine

    return AutoregressiveEngine(tiny_causal_dir)


@pytest.fixture(autouse=True)
def _fresh_caches(request):
    """Engines are session-wide; each test starts from empty caches and default switches."""
    yield
    for name in ("dg_engine", "ar_engine", "masked_engine", "shifted_engine"):
        if name in request.fixturenames:
            engine = request.getfixturevalue(name)
            engine.reset_caches()
            engine.use_prompt_cache = True
            engine.use_continuation_cache = True
