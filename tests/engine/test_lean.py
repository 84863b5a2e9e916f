"""The lean forward (dg_lsp/engine/lean.py) against transformers' Gemma3 on the shipped models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dg_lsp.engine import lean
from dg_lsp.engine.ar import AutoregressiveEngine
from dg_lsp.engine.kv import new_cache
from dg_lsp.engine.masked import MaskedDiffusionEngine
from dg_lsp.engine.types import InfillRequest

MODELS = Path(__file__).resolve().parents[2] / "dg_lsp" / "models"


@pytest.mark.parametrize("name", ["embedded_tiny", "ar_twin"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_equal_transformers(name, dtype):
    """Full pass, a multi-token chunk after a cached prefix (the causal offset mask for the AR twin, the
    canvas-only pass for the diffusion model) and a one-token step: the same logits as transformers (in bf16
    up to about one rounding step of the logits' size: the fused projections accumulate in another order)."""
    atol = 1e-4 if dtype == torch.float32 else 0.07
    model = AutoModelForCausalLM.from_pretrained(MODELS / name, dtype=dtype).eval()
    fast = lean.LeanGemma3(model)
    ids = torch.randint(10, model.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, fast(input_ids=ids).logits)
        slow_cache, fast_cache = new_cache(model.config), new_cache(model.config)
        model(input_ids=ids[:, :30], cache=slow_cache)
        fast(input_ids=ids[:, :30], cache=fast_cache)
        pos = torch.arange(30, 40).unsqueeze(0)
        a = model(input_ids=ids[:, 30:], position_ids=pos, cache=slow_cache, logits_to_keep=4).logits
        b = fast(input_ids=ids[:, 30:], position_ids=pos, cache=fast_cache, logits_to_keep=4).logits
        assert a.shape == b.shape == (2, 4, model.config.vocab_size)
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        a = model(input_ids=ids[:, :1], cache=slow_cache).logits
        b = fast(input_ids=ids[:, :1], cache=fast_cache).logits
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
        assert fast_cache.get_seq_length() == slow_cache.get_seq_length() == 41
        made = fast(input_ids=ids[:, :5], use_cache=True).cache  # no cache given: one is made and returned
        assert made is not None and made.get_seq_length() == 5


def test_unsupported_configurations_keep_transformers():
    model = AutoModelForCausalLM.from_pretrained(MODELS / "embedded_tiny").eval()
    tok = AutoTokenizer.from_pretrained(MODELS / "embedded_tiny")
    assert lean.supported(model) is None
    model.config.final_logit_softcapping = 30.0
    assert "soft-capping" in lean.supported(model)
    kept, why = lean.adopt(model, tok)
    assert kept is model and why.startswith("transformers (") and "soft-capping" in why


@pytest.mark.parametrize(
    "engine_cls, name", [(MaskedDiffusionEngine, "embedded_tiny"), (AutoregressiveEngine, "ar_twin")]
)
def test_engines_complete_the_same_with_either_forward(engine_cls, name):
    engine = engine_cls(MODELS / name)
    assert engine.describe()["forward"] == "lean"
    src = (MODELS.parent / "examples" / "stack.py").read_text()
    cut = src.index("def pop") + len("def pop")
    requests = [
        InfillRequest(prefix=src[:cut], suffix=src[cut:], max_tokens=16, doc_key="a"),
        InfillRequest(prefix=src[: cut + 2], suffix=src[cut + 2 :], max_tokens=16, doc_key="a"),  # warm
        InfillRequest(prefix="def mean(values):\n    return ", suffix="\n", max_tokens=8, single_line=True),
    ]
    fast = [engine.infill(r).candidates[0].text for r in requests]
    engine.model = engine.model.inner
    engine.reset_caches()
    slow = [engine.infill(r).candidates[0].text for r in requests]
    assert fast == slow
    assert any(t.strip() for t in fast)


@pytest.mark.parametrize("name", ["embedded_tiny", "ar_twin"])
def test_padded_batches_equal_transformers(name):
    """Left-padded rows of different lengths (the batched runner's layout), a full pass and then a chunk
    against the cache: every real position's logits equal transformers' with the same padding mask."""
    model = AutoModelForCausalLM.from_pretrained(MODELS / name, dtype=torch.float32).eval()
    fast = lean.LeanGemma3(model)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(10, model.config.vocab_size, (3, 30), generator=gen)
    attn = torch.ones(3, 30, dtype=torch.long)
    attn[1, :7] = 0
    attn[2, :19] = 0
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    real = attn.bool()
    with torch.inference_mode():
        a_cache, b_cache = new_cache(model.config), new_cache(model.config)
        a = model(input_ids=ids[:, :24], attention_mask=attn[:, :24], position_ids=pos[:, :24], cache=a_cache)
        b = fast(input_ids=ids[:, :24], attention_mask=attn[:, :24], position_ids=pos[:, :24], cache=b_cache)
        torch.testing.assert_close(a.logits[real[:, :24]], b.logits[real[:, :24]], rtol=0, atol=1e-4)
        kw = {"attention_mask": attn, "position_ids": pos[:, 24:]}
        a = model(input_ids=ids[:, 24:], cache=a_cache, **kw).logits
        b = fast(input_ids=ids[:, 24:], cache=b_cache, **kw).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
        with pytest.raises(ValueError, match="padding mask of shape"):
            fast(input_ids=ids, attention_mask=attn[:, :5])
