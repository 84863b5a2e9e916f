"""The masked-diffusion backend on tiny real bidirectional masked LMs (ModernBERT classes)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine import sampler
from dg_lsp.engine.loader import load_engine
from dg_lsp.engine.masked import (
    MaskedDiffusionEngine,
    MaskedSamplerConfig,
    detect_logits_shift,
    fill_after_stop,
)
from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.settings import Settings

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def masked_engine(tiny_masked_dir):
    return MaskedDiffusionEngine(tiny_masked_dir)


@pytest.fixture(scope="module")
def shifted_engine(tiny_shifted_dir):
    return MaskedDiffusionEngine(tiny_shifted_dir)


def one_shot(engine, request):
    """Commit everything at the first step (threshold 0): output = argmax of one forward pass."""
    saved = engine.cfg
    engine.cfg = dataclasses.replace(saved, threshold=0.0)
    try:
        return engine.infill(request)
    finally:
        engine.cfg = saved


@pytest.mark.parametrize("which", ["masked_engine", "shifted_engine"])
def test_logit_alignment_llada_vs_dream(which, request):
    engine = request.getfixturevalue(which)
    engine.use_continuation_cache = False
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=8)
    result = one_shot(engine, req)
    assert result.stats.forward_passes == 1 and engine.last_commits == [8]
    ids, start = engine.canvas(req, 8)
    with torch.inference_mode():
        logits = engine.model(input_ids=torch.tensor([ids])).logits[0]
    offset = start - 1 if engine.shift else start
    manual = logits[offset : offset + 8].argmax(-1).tolist()
    assert result.candidates[0].token_ids == sampler.trim_at_stop(manual, engine.stop_ids | {engine.mask_id})
    assert engine.shift == (which == "shifted_engine")


def test_schedule_commits_exact_integer_counts(masked_engine):
    masked_engine.use_continuation_cache = False
    saved = masked_engine.cfg
    masked_engine.cfg = dataclasses.replace(saved, threshold=None)
    try:
        result = masked_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=5))
    finally:
        masked_engine.cfg = saved
    if len(masked_engine.last_commits) == 5:  # no EOS fill shortened it
        assert masked_engine.last_commits == sampler.transfer_schedule(16, 5)
    assert sum(masked_engine.last_commits) <= 16
    assert result.stats.forward_passes == len(masked_engine.last_commits) <= 5


@pytest.mark.parametrize("kind", sampler.CONFIDENCE_KINDS)
def test_threshold_decoding_finishes_within_steps(masked_engine, kind):
    masked_engine.use_continuation_cache = False
    saved = masked_engine.cfg
    masked_engine.cfg = dataclasses.replace(saved, confidence=kind, threshold=0.5)
    try:
        result = masked_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=6))
    finally:
        masked_engine.cfg = saved
    assert 1 <= result.stats.forward_passes <= 6
    assert all(c >= 1 for c in masked_engine.last_commits)


def test_canvas_is_bucketed(masked_engine):
    shapes = []
    handle = masked_engine.model.register_forward_pre_hook(
        lambda _m, args, kwargs: shapes.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    masked_engine.use_continuation_cache = False
    try:
        for n in (9, 12, 16):
            masked_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=n, steps=1))
    finally:
        handle.remove()
    assert len(set(shapes)) == 1  # 9, 12 and 16 tokens all use the 16-token canvas


def test_deterministic_candidates_and_cancel(masked_engine):
    masked_engine.use_continuation_cache = False
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=8, num_candidates=3, seed=4, steps=4)
    a = [c.token_ids for c in masked_engine.infill(req).candidates]
    b = [c.token_ids for c in masked_engine.infill(req).candidates]
    assert a == b and len(a) >= 2
    calls = []
    handle = masked_engine.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(Cancelled):
            masked_engine.infill(
                InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=8), should_cancel=lambda: len(calls) >= 2
            )
    finally:
        handle.remove()
    assert len(calls) == 2


def test_fill_after_stop_fills_only_the_tail():
    canvas = torch.tensor([[5, 1, 6, 6], [6, 6, 6, 6], [5, 6, 1, 6]])
    masked = canvas == 6
    fill_after_stop(canvas, masked, {1}, 1)
    assert canvas.tolist() == [[5, 1, 1, 1], [6, 6, 6, 6], [5, 6, 1, 1]]
    assert masked.tolist() == [[False] * 4, [True] * 4, [False, True, False, False]]


def test_fill_after_any_of_several_stops_and_newline_ids(masked_engine):
    canvas = torch.tensor([[5, 9, 6, 6], [6, 7, 6, 6]])
    masked = canvas == 6
    fill_after_stop(canvas, masked, {1, 9}, 1)
    assert canvas.tolist() == [[5, 9, 1, 1], [6, 7, 6, 6]]
    newline = masked_engine.newline_ids()
    nl = masked_engine.tokenizer.encode("\n", add_special_tokens=False)
    assert set(nl) <= newline and all("\n" in masked_engine.tokenizer.decode([i]) for i in newline)
    assert not newline & masked_engine.stop_ids


def test_config_and_detection(tiny_masked_dir):
    assert detect_logits_shift({"architectures": ["DreamModel"]})
    assert detect_logits_shift({"model_type": "diffucoder"})
    assert not detect_logits_shift({"architectures": ["LLaDAModelLM"]})
    assert detect_logits_shift({"architectures": ["LLaDAModelLM"], "dg_lsp_logits_shift": True})
    cfg = MaskedSamplerConfig.from_options(
        {"masked": {"threshold": 0.8, "confidence": "margin", "x": 1}}, steps=7
    )
    assert (cfg.threshold, cfg.confidence, cfg.steps) == (0.8, "margin", 7)
    with pytest.raises(ValueError):
        MaskedSamplerConfig.from_options({"confidence": "vibes"})
    engine = load_engine(
        Settings(model=str(tiny_masked_dir), device="cpu", extra={"masked": {"threshold": 0.7}})
    )
    assert engine.name == "masked" and engine.cfg.threshold == 0.7


@pytest.mark.parametrize("shift", [False, True], ids=["llada", "dream"])
def test_dual_cache_block_pass_reproduces_full_pass(tiny_bidirectional_dir, shift):
    """With the context unchanged, a canvas-only pass against the cached prefix/suffix KV is exact."""
    engine = MaskedDiffusionEngine(tiny_bidirectional_dir, sampler=MaskedSamplerConfig(logits_shift=shift))
    assert engine.supports_kv and engine.describe()["dual_cache"] == "True"
    ids, start = engine.canvas(InfillRequest(PREFIX, SUFFIX), 16)
    x = torch.tensor([ids, ids])
    x[1, start : start + 5] = torch.arange(20, 25)  # a partly filled second row
    with torch.inference_mode():
        full, ctx = engine._canvas_logits(x, start, 16, None, refresh=False)
        block, same = engine._canvas_logits(x, start, 16, ctx, refresh=False)
        engine.cfg = dataclasses.replace(engine.cfg, dual_cache=False)
        plain, none = engine._canvas_logits(x, start, 16, None, refresh=False)
    assert same is ctx and none is None
    torch.testing.assert_close(block, full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(plain, full, rtol=1e-4, atol=1e-4)


def test_dual_cache_end_to_end(tiny_bidirectional_dir):
    engine = load_engine(Settings(model=str(tiny_bidirectional_dir), device="cpu"))
    assert engine.name == "masked" and engine.supports_kv
    engine.use_continuation_cache = False
    seen = []
    handle = engine.model.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=4)
    try:
        cached = engine.infill(request)
        engine.cfg = dataclasses.replace(engine.cfg, refresh_every=1)  # a full pass every step: exact
        refreshed = engine.infill(request)
        engine.cfg = dataclasses.replace(engine.cfg, dual_cache=False, refresh_every=0)
        plain = engine.infill(request)
    finally:
        handle.remove()
    full_len = seen[0]
    assert seen[1 : cached.stats.forward_passes] == [16] * (cached.stats.forward_passes - 1)  # canvas only
    assert all(n == full_len for n in seen[cached.stats.forward_passes :])
    assert refreshed.candidates[0].token_ids == plain.candidates[0].token_ids
    assert cached.stats.forward_passes == plain.stats.forward_passes


def test_document_kv_reuse(tiny_bidirectional_dir):
    """The first full pass reuses the previous request's prefix KV: exact when nothing changed, and
    counted (approximate) when the user typed on."""
    engine = MaskedDiffusionEngine(tiny_bidirectional_dir, use_continuation_cache=False)
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=4, doc_key="doc")
    engine.use_prompt_cache = False
    plain = engine.infill(request)
    engine.use_prompt_cache = True
    first = engine.infill(request)
    again = engine.infill(request)
    _, start = engine.canvas(request, 16)
    assert first.stats.reused_prompt_tokens == 0 and again.stats.reused_prompt_tokens == start
    assert plain.candidates[0].token_ids == first.candidates[0].token_ids == again.candidates[0].token_ids
    typed = engine.infill(dataclasses.replace(request, prefix=PREFIX + "a +"))
    assert 0 < typed.stats.reused_prompt_tokens < start + 3
    engine.reset_caches()
    assert engine.infill(request).stats.reused_prompt_tokens == 0
