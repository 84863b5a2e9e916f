"""The DiffusionGemma backend on a tiny real checkpoint: exactness, caches, cancellation, budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dg_lsp.engine.diffusion_gemma import CURSOR, DenoiseConfig, chat_prompt_ids, uses_fim_tokens
from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.models import tokens

PREFIX = "def add(a, b):\n    return "
SUFFIX = "\n\nprint(add(1, 2))\n"
LONG_PREFIX = "import os\nimport sys\n\n" + "".join(
    f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40)
)


def reference(engine, request, steps, max_new, **gen_kwargs):
    """transformers' own `generate` on the same prompt and seed."""
    ids = torch.tensor([engine.prompt_ids(request)])
    torch.manual_seed(request.seed)
    out = engine.model.generate(
        ids,
        max_new_tokens=max_new,
        max_denoising_steps=steps,
        eos_token_id=tokens.EOS_ID,
        pad_token_id=tokens.PAD_ID,
        **gen_kwargs,
    )
    return out.sequences[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("prefix", [PREFIX, LONG_PREFIX], ids=["short", "beyond-sliding-window"])
@pytest.mark.parametrize("seed", [0, 3])
def test_own_loop_reproduces_transformers_generate(dg_engine, prefix, seed):
    request = InfillRequest(prefix=prefix, suffix=SUFFIX, max_tokens=32, steps=6, seed=seed)
    if prefix is LONG_PREFIX:
        assert len(dg_engine.prompt_ids(request)) > dg_engine.text_config.sliding_window
    dg_engine.use_continuation_cache = False
    got = dg_engine.infill(request).candidates[0].token_ids
    assert got == reference(dg_engine, request, steps=6, max_new=32)[: len(got)]
    assert len(got) == 32  # a random model never says EOS, so the whole canvas is kept


def test_two_canvases_when_more_tokens_are_wanted(dg_engine):
    request = InfillRequest(prefix=PREFIX, suffix=SUFFIX, max_tokens=48, steps=4, seed=1)
    dg_engine.use_continuation_cache = False
    result = dg_engine.infill(request)
    assert result.stats.encoder_passes == 2 and result.stats.forward_passes == 8
    got = result.candidates[0].token_ids
    assert got == reference(dg_engine, request, steps=4, max_new=64)[:48]


def test_deterministic_per_seed(dg_engine):
    dg_engine.use_continuation_cache = False
    a = dg_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=16, seed=7)).candidates[0].token_ids
    b = dg_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=16, seed=7)).candidates[0].token_ids
    c = dg_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=16, seed=8)).candidates[0].token_ids
    assert a == b and a != c


@pytest.mark.parametrize("base", [PREFIX, LONG_PREFIX], ids=["short", "beyond-sliding-window"])
def test_prompt_cache_gives_identical_results(dg_engine, base):
    """Typing on: the second request reuses the encoder KV of the unchanged prompt head."""
    dg_engine.use_continuation_cache = False
    first = InfillRequest(base, SUFFIX, max_tokens=16, seed=2, doc_key="file:///a.py")
    second = dataclasses.replace(first, prefix=base + "a +")
    dg_engine.infill(first)
    warm = dg_engine.infill(second)
    assert warm.stats.reused_prompt_tokens > 0
    assert (
        warm.stats.reused_prompt_tokens
        >= len(dg_engine.prompt_ids(first)) - len(dg_engine.tokenizer.encode(SUFFIX)) - 4
    )
    dg_engine.reset_caches()
    cold = dg_engine.infill(second)
    assert cold.stats.reused_prompt_tokens == 0
    assert warm.candidates[0].token_ids == cold.candidates[0].token_ids
    dg_engine.use_prompt_cache = False
    off = dg_engine.infill(second)
    assert off.candidates[0].token_ids == cold.candidates[0].token_ids


def test_encoder_state_matches_full_encoding(dg_engine):
    ids = dg_engine.prompt_ids(InfillRequest(LONG_PREFIX, SUFFIX))
    with torch.inference_mode():
        full, _ = dg_engine.encode(ids, None)
        head, _ = dg_engine.encode(ids[:200], None)
        resumed, reused = dg_engine.encode(ids, head)
    assert reused == 200
    for k1, k2 in zip(full.keys, resumed.keys, strict=True):
        assert k1.shape == k2.shape
        torch.testing.assert_close(k1, k2, rtol=1e-4, atol=1e-5)


def test_cancel_stops_within_one_step(dg_engine):
    dg_engine.use_continuation_cache = False
    passes = []
    cancel = {"now": False}

    def on_pass(*_):
        passes.append(1)
        if len(passes) == 3:
            cancel["now"] = True

    handle = dg_engine.model.model.decoder.register_forward_hook(on_pass)
    try:
        with pytest.raises(Cancelled):
            dg_engine.infill(InfillRequest(PREFIX, SUFFIX, steps=12), should_cancel=lambda: cancel["now"])
    finally:
        handle.remove()
    assert len(passes) == 3


def test_cancel_before_start_runs_nothing(dg_engine):
    with pytest.raises(Cancelled):
        dg_engine.infill(InfillRequest(PREFIX, SUFFIX), should_cancel=lambda: True)


def test_continuation_served_without_forward_pass(dg_engine):
    request = InfillRequest(PREFIX, SUFFIX, max_tokens=16, doc_key="doc")
    shown = dg_engine.infill(request).best
    assert len(shown) > 2
    typed = dataclasses.replace(request, prefix=PREFIX + shown[:2])
    hit = dg_engine.infill(typed)
    assert hit.stats.cache_hit and hit.stats.forward_passes == 0
    assert hit.best == shown[2:]


def test_several_candidates_ranked_by_mean_logprob(dg_engine):
    dg_engine.use_continuation_cache = False
    result = dg_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=16, num_candidates=3, steps=4))
    scores = [c.mean_logprob for c in result.candidates]
    assert len(result.candidates) >= 2
    assert scores == sorted(scores, reverse=True)
    assert len({c.text for c in result.candidates}) == len(result.candidates)
    assert result.stats.forward_passes == 4  # one batch, not one pass per candidate


def test_early_exit_when_canvas_confident(dg_engine):
    """A random model is never stable, so the stability window is disabled and a lenient entropy bound is
    met at once: the loop must stop after one pass, exactly as `generate` does with the same knobs."""
    dg_engine.use_continuation_cache = False
    saved = dg_engine.denoise
    dg_engine.denoise = dataclasses.replace(saved, confidence_threshold=1e3, stability_threshold=0)
    try:
        request = InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=12, seed=0)
        result = dg_engine.infill(request)
    finally:
        dg_engine.denoise = saved
    assert result.stats.early_exit and result.stats.forward_passes == 1
    ref = reference(dg_engine, request, steps=12, max_new=32, confidence_threshold=1e3, stability_threshold=0)
    assert result.candidates[0].token_ids == ref


def test_latency_budget_caps_steps_and_batch(dg_engine):
    """The plan comes from the running per-step estimate (set here, since timings vary on shared CPUs)."""
    dg_engine.use_continuation_cache = False
    dg_engine.ms_per_row_step = 1000.0
    plan = dg_engine._plan
    assert plan(InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=40, deadline_ms=5500)) == (1, 5, 1)
    assert plan(InfillRequest(PREFIX, SUFFIX, max_tokens=64, steps=40, deadline_ms=5500)) == (1, 2, 2)
    assert plan(InfillRequest(PREFIX, SUFFIX, steps=4, num_candidates=3, deadline_ms=8500)) == (2, 4, 1)
    assert plan(InfillRequest(PREFIX, SUFFIX, steps=4, num_candidates=3)) == (3, 4, 1)
    dg_engine.ms_per_row_step = 1000.0
    result = dg_engine.infill(InfillRequest(PREFIX, SUFFIX, max_tokens=32, steps=40, deadline_ms=5500))
    assert result.stats.step_cap == 5
    assert 1 <= result.stats.forward_passes <= 5


def test_generation_config_defaults_are_read():
    cfg = DenoiseConfig.from_generation_config(None, steps=9)
    assert cfg.steps == 9 and cfg.entropy_bound == 0.1


def test_chat_prompt_for_instruction_checkpoints(dg_engine):
    tok = dg_engine.tokenizer
    assert uses_fim_tokens(tok)
    tok = type(tok).from_pretrained(dg_engine.model_dir)
    tok.chat_template = "{% for m in messages %}<bos>user\n{{ m['content'] }}\n{% endfor %}model\n"
    ids = chat_prompt_ids(tok, "x = ", "\nprint(x)")
    text = tok.decode(ids)
    assert "```\nx = " + CURSOR + "\nprint(x)\n```" in text
    assert text.rstrip().endswith("model")


def test_zero_steps_means_the_checkpoints_own_max_denoising_steps(tiny_dg_dir, tmp_path):
    import json
    import shutil

    from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine

    model = tmp_path / "dg"
    shutil.copytree(tiny_dg_dir, model)
    gc_path = model / "generation_config.json"
    gc = json.loads(gc_path.read_text()) if gc_path.exists() else {}
    gc["max_denoising_steps"] = 7
    gc_path.write_text(json.dumps(gc))
    assert DiffusionGemmaEngine(model, steps=0).denoise.steps == 7
    assert DiffusionGemmaEngine(model, steps=5).denoise.steps == 5
