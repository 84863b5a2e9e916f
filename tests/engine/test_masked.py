"""The masked-diffusion backend on tiny real bidirectional masked LMs (ModernBERT classes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from dg_lsp.engine import sampler
from dg_lsp.engine.loader import load_engine
from dg_lsp.engine.masked import (
    MaskedDiffusionEngine,
    MaskedSamplerConfig,
    detect_logits_shift,
)
from dg_lsp.engine.step import fill_after_stop
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


def collapsing_model(engine, request, length, word):
    """Shape the tiny model's beliefs like a weakly trained EOS-padded one: the tail is surely EOS, and
    the first position says `word` unless the canvas already holds an EOS, then EOS too (collapse)."""
    _ids, start = engine.canvas(request, length)
    eos = engine.tokenizer.eos_token_id

    def hook(_module, args, kwargs, out):
        x = kwargs["input_ids"]
        logits = out.logits
        logits[:, start + 1 : start + length] = -10.0
        logits[:, start + 1 : start + length, eos] = 10.0
        seen_eos = (x[:, start : start + length] == eos).any(dim=-1)
        logits[:, start] = -10.0
        logits[:, start, word] = torch.where(seen_eos, -10.0, 2.0)  # p ~ 0.6: below the threshold
        logits[:, start, eos] = torch.where(seen_eos, 10.0, 1.5)
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


def infill_shaped(engine, shape, request, word, length=8, **sampler):
    """Infill through a model whose beliefs `shape` sets, under these sampler settings, caches off."""
    engine.use_continuation_cache = False
    saved = engine.cfg
    engine.cfg = dataclasses.replace(saved, dual_cache=False, **sampler)
    handle = shape(engine, request, length, word)
    try:
        return engine.infill(request)
    finally:
        handle.remove()
        engine.cfg = saved


@pytest.mark.parametrize("frontier", [True, False])
def test_eos_is_committed_only_at_the_frontier(masked_engine, frontier):
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=8, steps=4)
    result = infill_shaped(
        masked_engine, collapsing_model, req, word, stop_at_frontier=frontier, min_tokens=0
    )
    if frontier:  # the word first, then the EOS at the new frontier ends the span
        assert result.candidates[0].token_ids == [word] and masked_engine.last_commits == [1, 1]
    else:  # the confident EOS tail goes first and the span collapses to empty
        assert result.candidates[0].token_ids == [] and masked_engine.last_commits[0] == 7


def empty_first_model(engine, request, length, word):
    """A model whose surest guess on the whole canvas is "empty": EOS first, `word` a distant second."""
    _ids, start = engine.canvas(request, length)
    eos = engine.tokenizer.eos_token_id

    def hook(_module, _args, _kwargs, out):
        logits = out.logits
        logits[:, start : start + length] = -10.0
        logits[:, start : start + length, eos] = 10.0
        logits[:, start, word] = 2.0
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("min_tokens", [0, 1])
def test_min_tokens_bars_an_empty_span(masked_engine, min_tokens):
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=8, steps=4)
    for confidence in ("max_prob", "entropy"):
        result = infill_shaped(
            masked_engine, empty_first_model, req, word, min_tokens=min_tokens, confidence=confidence
        )
        assert result.candidates[0].token_ids == ([word] if min_tokens else [])
        assert result.stats.forward_passes == (2 if min_tokens else 1)  # word, then EOS at the frontier


def blank_first_model(engine, request, length, word):
    """A model whose surest first token starts a blank line (`word` second), then surely EOS."""
    _ids, start = engine.canvas(request, length)
    eos = engine.tokenizer.eos_token_id
    blank = min(engine.blank_start_ids())

    def hook(_module, _args, _kwargs, out):
        logits = out.logits
        logits[:, start : start + length] = -10.0
        logits[:, start + 1 : start + length, eos] = 10.0
        logits[:, start, blank] = 10.0
        logits[:, start, word] = 8.0
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("blank_start", [True, False])
def test_a_blank_first_line_can_be_barred(masked_engine, blank_start):
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    assert masked_engine.tokenizer.decode([min(masked_engine.blank_start_ids())]).lstrip(" ").startswith("\n")
    assert word not in masked_engine.blank_start_ids()
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=8, steps=4, blank_start=blank_start)
    result = infill_shaped(masked_engine, blank_first_model, req, word)
    first = result.candidates[0].token_ids[0]
    assert (first == word) is not blank_start
    assert (first in masked_engine.blank_start_ids()) is blank_start


def test_blocks_unmask_left_to_right(masked_engine):
    masked_engine.use_continuation_cache = False
    saved = masked_engine.cfg
    masked_engine.cfg = dataclasses.replace(saved, block_length=4, threshold=None, stop_at_frontier=False)
    firsts = []
    handle = masked_engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: firsts.append(kw["input_ids"][0].tolist()), with_kwargs=True
    )
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=4)
    try:
        result = masked_engine.infill(req)
    finally:
        handle.remove()
        masked_engine.cfg = saved
    _, start = masked_engine.canvas(req, 16)
    mask = masked_engine.mask_id
    for before, after in itertools.pairwise(firsts):  # each pass fills exactly the next block
        done = [i for i in range(16) if before[start + i] == mask and after[start + i] != mask]
        assert done and max(done) - min(done) < 4 and min(done) % 4 == 0
    assert result.stats.forward_passes == len(firsts) <= 4


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
    """With the context unchanged, a canvas-only pass against the cached prefix/suffix KV is exact (in fp32;
    bf16 rounds the two orders of summation differently)."""
    engine = MaskedDiffusionEngine(
        tiny_bidirectional_dir, sampler=MaskedSamplerConfig(logits_shift=shift), dtype="float32"
    )
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


@pytest.mark.parametrize("shift", [False, True], ids=["llada", "dream"])
def test_block_window_pass_recomputes_only_the_block_and_is_exact(tiny_bidirectional_dir, shift):
    """Fast-dLLM's dual cache with blocks: the context KV holds every position but the current block's
    (later blocks' masks included) and a cached pass runs only the block (+ the token before it when
    logits are shifted). With the context unchanged it reproduces the full pass on the block, exactly."""
    engine = MaskedDiffusionEngine(
        tiny_bidirectional_dir, sampler=MaskedSamplerConfig(logits_shift=shift), dtype="float32"
    )
    ids, start = engine.canvas(InfillRequest(PREFIX, SUFFIX), 16)
    x = torch.tensor([ids, ids])
    x[:, start : start + 4] = torch.arange(20, 24)  # the first block is decided; the window is the second
    seen: list[int] = []
    engine.model.register_forward_pre_hook(
        lambda _m, args, kw: seen.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    with torch.inference_mode():
        full, ctx = engine._canvas_logits(x, start, 16, None, refresh=False, window=(4, 8))
        block, same = engine._canvas_logits(x, start, 16, ctx, refresh=False, window=(4, 8))
    assert same is ctx and seen == [len(ids), 4 + int(shift)]
    assert ctx[0][0].shape[2] == len(ids) - 4 - int(shift)  # every position but the recomputed ones
    torch.testing.assert_close(block[:, 4:8], full[:, 4:8], rtol=1e-4, atol=1e-4)
    assert not block[:, :4].any() and not block[:, 8:].any()  # outside the block: never read


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


def short_line_model(engine, request, length, word):
    """A natural stop after four tokens: `word` (unsure) at the first four positions, EOS (sure) after."""
    _ids, start = engine.canvas(request, length)
    eos = engine.tokenizer.eos_token_id

    def hook(_module, _args, _kwargs, out):
        logits = out.logits
        logits[:, start : start + length] = -10.0
        logits[:, start : start + 4, word] = 1.0
        logits[:, start + 4 : start + length, eos] = 10.0
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("stops_in_quota", [True, False])
def test_masks_that_predict_a_stop_count_in_the_quota(masked_engine, stops_in_quota):
    """Left out of the quota, the 12 stop-predicting masks made the 4 words commit one per pass (5 passes,
    the last commits the EOS that ends the span); counted, 16 masks over 8 steps commit 2 per pass (3
    passes), the same text."""
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=8)
    result = infill_shaped(
        masked_engine, short_line_model, req, word, length=16, stops_in_quota=stops_in_quota, threshold=None
    )
    assert result.candidates[0].token_ids == [word] * 4
    assert masked_engine.last_commits == ([2, 2, 1] if stops_in_quota else [1, 1, 1, 1, 1])


def test_a_tight_budget_never_cuts_an_automatic_request_below_two_steps_nor_an_invoked_one_at_all(
    masked_engine,
):
    from dg_lsp import context, pipeline

    settings = Settings(latency_budget_ms=1, denoising_steps=8)
    snap = context.parse_snapshot(PREFIX + SUFFIX, "python")
    _, automatic = pipeline.plan(snap, len(PREFIX), settings, invoked=False)
    _, invoked = pipeline.plan(snap, len(PREFIX), settings, invoked=True)
    assert automatic.deadline_ms == 1.0 and invoked.deadline_ms is None
    masked_engine.use_continuation_cache = False
    masked_engine.ms_per_step = 1000.0  # one step costs more than the whole budget
    capped = masked_engine.infill(dataclasses.replace(automatic, steps=8, max_tokens=8))
    assert capped.stats.step_cap == 2
    masked_engine.ms_per_step = 1000.0
    full = masked_engine.infill(dataclasses.replace(invoked, steps=8, max_tokens=8))
    assert full.stats.step_cap == 8


def sure_word_model(engine, request, length, word):
    """Every canvas position believes `word`, rightmost surest: no stops, so only the schedule decides."""
    _ids, start = engine.canvas(request, length)

    def hook(_module, _args, _kwargs, out):
        logits = out.logits
        logits[:, start : start + length] = -10.0
        logits[:, start : start + length, word] = torch.linspace(1.0, 2.0, length)
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


def test_blocks_get_their_steps_up_front_as_llada_allots_them(masked_engine):
    """Canvas 16, blocks of 8, 8 steps: LLaDA's generate commits [2, 2, 2, 2 | 2, 2, 2, 2]; sharing the steps
    left among the blocks left gave [2, 2, 2, 1, 1 | 3, 3, 2]."""
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=8)
    infill_shaped(masked_engine, sure_word_model, req, word, length=16, block_length=8, threshold=None)
    assert masked_engine.last_commits == [2] * 8


def test_dream_schedule_commits_int_n_times_one_minus_s_over_t(masked_engine):
    word = masked_engine.tokenizer.encode("return", add_special_tokens=False)[0]
    req = InfillRequest(PREFIX, SUFFIX, max_tokens=16, steps=4)
    infill_shaped(masked_engine, sure_word_model, req, word, length=16, schedule="dream", threshold=None)
    expected, left = [], 16
    for i in range(4):
        t, s = 1 - 0.999 * i / 4, 1 - 0.999 * (i + 1) / 4
        n = left if i == 3 else int(left * (1 - s / t))
        expected.append(n)
        left -= n
    assert masked_engine.last_commits == expected == [3, 4, 4, 5]


def staged_line_model(engine, request, length, word, words_by_pass):
    """A model that writes `words_by_pass[i]` words then EOS (sure) on its i-th pass (the last entry
    from then on), whatever part of the sequence a pass runs: each logits column is mapped back to the
    canvas position it predicts from the pass's position ids and `logits_to_keep`."""
    _ids, start = engine.canvas(request, length)
    eos = engine.tokenizer.eos_token_id
    calls = [0]

    def hook(_module, _args, kwargs, out):
        n = kwargs["input_ids"].shape[1]
        pos = kwargs.get("position_ids")
        pos = pos[0] if pos is not None else torch.arange(n)
        keep = kwargs.get("logits_to_keep")
        if isinstance(keep, int) and keep > 0:
            pos = pos[-keep:]
        elif isinstance(keep, torch.Tensor):
            pos = pos[keep]
        words = words_by_pass[min(calls[0], len(words_by_pass) - 1)]
        calls[0] += 1
        for j, c in enumerate((pos + int(engine.shift) - start).tolist()):
            if 0 <= c < length:
                out.logits[:, j] = -10.0
                out.logits[:, j, word if c < words else eos] = 1.0 if c < words else 10.0
        return out

    return engine.model.register_forward_hook(hook, with_kwargs=True)


def trimmed_infill(tiny_bidirectional_dir, words_by_pass, **sampler):
    engine = MaskedDiffusionEngine(
        tiny_bidirectional_dir, use_continuation_cache=False, sampler=MaskedSamplerConfig(**sampler)
    )
    engine.use_prompt_cache = False
    word = engine.tokenizer.encode("return", add_special_tokens=False)[0]
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=48, steps=12)
    handle = staged_line_model(engine, request, 64, word, words_by_pass)
    try:
        return engine, word, engine.infill(request)
    finally:
        handle.remove()


@pytest.mark.parametrize("shift", [False, True], ids=["llada", "dream"])
def test_trimmed_passes_recompute_only_the_live_part_of_a_natural_stop(tiny_bidirectional_dir, shift):
    """A 4-token line in a 64-token canvas: after the full first pass every pass recomputes 4 + 8 canvas
    positions instead of 64, and writes what the untrimmed sampler writes."""
    opts = {"threshold": None, "logits_shift": shift}
    engine, word, plain = trimmed_infill(tiny_bidirectional_dir, [4], **opts, trim_tail=False)
    assert plain.candidates[0].token_ids == [word] * 4 and set(engine.last_windows) == {64}
    engine, word, trimmed = trimmed_infill(tiny_bidirectional_dir, [4], **opts)  # the default
    assert trimmed.candidates[0].token_ids == [word] * 4
    assert engine.last_windows == [64] + [12] * (trimmed.stats.forward_passes - 1)
    assert trimmed.stats.forward_passes == plain.stats.forward_passes


def test_a_span_that_outgrows_its_window_gets_a_full_pass_and_a_new_window(tiny_bidirectional_dir):
    """First the model means 2 tokens (window 2 + 2), then 20: once the window is used up with no stop in
    it, the next pass is a full one, and the span is written whole, never cut at the old window."""
    engine, word, result = trimmed_infill(tiny_bidirectional_dir, [2, 20], threshold=None, trim_margin=2)
    assert result.candidates[0].token_ids == [word] * 20
    windows = engine.last_windows
    assert windows[0] == 64 and windows[1] == 4 and windows.count(64) >= 2
    refreshed = windows.index(64, 1)
    assert all(w == 22 for w in windows[refreshed + 1 :])


def test_live_end_is_one_past_the_last_position_the_span_still_uses():
    stops = torch.tensor([1, 9])
    canvas = torch.tensor([[5, 6, 0, 0, 0, 0], [5, 1, 1, 1, 1, 1]])
    masked = torch.tensor([[False, False, True, True, True, True], [False] * 6])
    pred = torch.tensor([[0, 0, 7, 1, 7, 9], [0] * 6])
    # row 0: a mask at 4 still predicts a word; row 1 stopped after one token
    assert sampler.live_end(canvas, masked, pred, stops) == 5
    assert sampler.live_end(canvas[1:], masked[1:], pred[1:], stops) == 1
    assert sampler.live_end(canvas[1:] * 0 + 1, masked[1:], pred[1:], stops) == 0
    # the window: margin past the live end, or None when it would save less than the margin
    assert sampler.tail_window(canvas, masked, pred, stops, margin=0) == 5
    assert sampler.tail_window(canvas, masked, pred, stops, margin=1) is None
    assert sampler.tail_window(canvas[1:], masked[1:], pred[1:], stops, margin=2) == 3
    # outgrown: a row whose masks all lie past the window
    assert sampler.outgrown(masked, 2) and not sampler.outgrown(masked, 3)
    assert not sampler.outgrown(masked[1:], 1)  # no masks left: nothing to grow into


def test_the_embedded_model_starts_on_a_short_canvas_and_grows_it_when_filled():
    """The embedded model's config asks for `grow_from` 16 and `grow_from_multiline` 32: a rest-of-line
    span (a 32-token canvas) starts on 16 masks, a multi-line one (64) on 32; a span that fills its canvas
    without stopping (stops barred from all 32 positions here) goes on past 32 tokens on the full canvas,
    and the pass after growing reads the block alone, not the prompt again; `growFrom = 0` gives a
    single-line span its whole canvas at once."""
    engine = load_engine(Settings(device="cpu"))
    cfg = engine.cfg
    assert (cfg.grow_from, cfg.grow_from_multiline, cfg.confidence) == (16, 32, "leftmost")
    line = InfillRequest("def area(width, height):\n    return ", "\n", max_tokens=32, single_line=True)
    block = InfillRequest("def mean(values):\n    ", "\n", max_tokens=64)
    for request, first in ((line, 16), (block, 32)):
        engine.infill(request)
        assert engine.last_windows[0] == first
    engine.cfg = dataclasses.replace(engine.cfg, min_tokens=32)
    fed: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        engine.reset_caches()
        grown = engine.infill(block)
    finally:
        hook.remove()
    assert 64 in engine.last_windows and len(grown.candidates[0].token_ids) > 32
    after = engine.last_windows.index(64)
    assert fed[after] == 64 + 1  # the block token and the canvas: the prompt's keys and values are kept
    engine = load_engine(Settings(device="cpu", extra={"masked": {"growFrom": 0}}))
    engine.infill(line)
    assert engine.cfg.grow_from == 0 and engine.last_windows[0] == 32


@pytest.mark.parametrize("kind", ["masked", "ar"])
def test_a_long_file_does_not_make_the_tokenizer_warn_of_indexing_errors(capfd, kind):
    """A prefix longer than the tokenizer's `model_max_length` (the packed models record their prompt
    budget there) is encoded whole and cut to the budget after: transformers' warning that running it
    "will result in indexing errors" was false, and it reached every editor's server log."""
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.loader import EMBEDDED_TINY_DIR

    if kind == "masked":
        engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    else:
        engine = AutoregressiveEngine(EMBEDDED_TINY_DIR.parent / "ar_twin", use_continuation_cache=False)
    capfd.readouterr()
    prefix = "def f(x):\n    return x + 1\n\n\n" * 60 + "y = "
    result = engine.infill(InfillRequest(prefix, "\n", max_tokens=4))
    assert result.stats.prompt_tokens <= engine.max_prompt_tokens + 2  # cut to the budget, as before
    assert len(engine.tokenizer.encode(prefix, add_special_tokens=False)) > engine.tokenizer.model_max_length
    assert "indexing errors" not in capfd.readouterr().err
