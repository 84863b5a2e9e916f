"""The packed Llama models' lean forward (dg_lsp/engine/lean_llama.py) against transformers, on tiny
random Llamas built here: the block-diffusion model (causal prompt, bidirectional block), the causal twin."""

from __future__ import annotations

import pytest
import torch

from dg_lsp.engine import lean, lean_llama
from dg_lsp.engine.kv import new_cache
from dg_lsp.models import block_llama as bl

VOCAB = 300
BLOCK, MASK = VOCAB + 2, VOCAB + 3


TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def tiny(block: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = dict(TINY_LLAMA)
    torch.manual_seed(seed)
    state = LlamaForCausalLM(LlamaConfig(**config)).state_dict()
    for k, w in state.items():  # norms away from 1, so a misplaced norm weight shows
        if k.endswith("norm.weight"):
            state[k] = w + 0.3 * torch.randn_like(w)
    extra = {"dg_lsp_block_token_id": BLOCK, "mask_token_id": MASK} if block else {}
    model = bl.build_model({**config, **extra}, state, n_added=len(bl.ADDED_TOKENS), block=block)
    model.model.embed_tokens.added.data.normal_(0, 0.02)
    return model


def ids_with_block(rows: int, prompt: int, canvas: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pre = torch.randint(5, VOCAB, (rows, prompt), generator=gen)
    return torch.cat([pre, torch.full((rows, 1), BLOCK), torch.full((rows, canvas), MASK)], dim=1)


def test_block_model_passes_equal_transformers():
    """A cold pass (run as a causal prompt chunk, then the block), the engine's reuse pass (new prompt
    tokens and the block after cached keys), a canvas-only pass and the logits_to_keep forms."""
    model = tiny(block=True)
    fast = lean_llama.LeanLlama(model)
    assert fast.block_id == BLOCK
    x = ids_with_block(2, 30, 8)
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=x).logits, fast(input_ids=x).logits, rtol=0, atol=1e-5)
        keep = torch.arange(30, 38)
        a = model(input_ids=x, logits_to_keep=keep).logits
        b = fast(input_ids=x, logits_to_keep=keep).logits
        assert a.shape == b.shape == (2, 8, VOCAB)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        # reuse: 20 cached prompt tokens, then 10 more prompt tokens + the block in one call
        slow_cache, fast_cache = new_cache(model.config), new_cache(model.config)
        model(input_ids=x[:, :20], cache=slow_cache)
        fast(input_ids=x[:, :20], cache=fast_cache)
        pos = torch.arange(20, 39).unsqueeze(0)
        a = model(input_ids=x[:, 20:], position_ids=pos, cache=slow_cache).logits
        b = fast(input_ids=x[:, 20:], position_ids=pos, cache=fast_cache).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert fast_cache.get_seq_length() == slow_cache.get_seq_length() == 39
        # the dual cache: the canvas alone against the context keys, every query seeing every key
        ctx_slow, ctx_fast = new_cache(model.config), new_cache(model.config)
        model(input_ids=x[:, :31], cache=ctx_slow)
        fast(input_ids=x[:, :31], cache=ctx_fast)
        pos = torch.arange(31, 39).unsqueeze(0)
        a = model(input_ids=x[:, 31:], position_ids=pos, cache=ctx_slow).logits
        b = fast(input_ids=x[:, 31:], position_ids=pos, cache=ctx_fast).logits
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_a_two_chunk_pass_reads_each_weight_once():
    """A request's first pass after a cache hit (new prompt tokens, then the block) is two attention chunks
    but one sweep of the layers: each of the 7 projections per layer is multiplied once, over all rows."""
    model = tiny(block=True)
    fast = lean_llama.LeanLlama(model)
    x = ids_with_block(1, 30, 8)
    seen = []
    real = fast._linear
    fast._linear = lambda h, w: seen.append((h.shape[1], w.data_ptr())) or real(h, w)
    with torch.inference_mode():
        cache = new_cache(model.config)
        fast(input_ids=x[:, :20], cache=cache)
        seen.clear()
        pos = torch.arange(20, 39).unsqueeze(0)
        assert len(fast._chunks(x[:, 20:], None, 20)) == 2
        fast(input_ids=x[:, 20:], position_ids=pos, cache=cache)
    layers = model.config.num_hidden_layers
    assert len(seen) == 7 * layers
    assert len({ptr for _, ptr in seen}) == 7 * layers
    assert {rows for rows, _ in seen} == {19}


def test_block_is_bidirectional_and_prompt_causal():
    """What the chunking must preserve: a canvas token changes the logits before it inside the block,
    never those of the prompt."""
    fast = lean_llama.LeanLlama(tiny(block=True))
    x = ids_with_block(1, 12, 6)
    y = x.clone()
    y[0, -1] = 7  # the last canvas position
    with torch.inference_mode():
        a, b = fast(input_ids=x).logits, fast(input_ids=y).logits
    assert torch.equal(a[0, :12], b[0, :12])
    assert not torch.allclose(a[0, 12:-1], b[0, 12:-1])


def test_padded_batches_and_the_causal_twin_equal_transformers():
    for block in (True, False):
        model = tiny(block=block, seed=1)
        fast = lean_llama.LeanLlama(model)
        x = ids_with_block(3, 24, 6, seed=2) if block else torch.randint(5, VOCAB, (3, 31))
        attn = torch.ones_like(x)
        attn[1, :5] = 0
        attn[2, :13] = 0
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        real = attn.bool()
        with torch.inference_mode():
            a = model(input_ids=x, attention_mask=attn, position_ids=pos).logits
            b = fast(input_ids=x, attention_mask=attn, position_ids=pos).logits
            torch.testing.assert_close(a[real], b[real], rtol=0, atol=1e-5)
            if not block:  # causal after a cache (the AR twin's prompt reuse) and one-token steps
                sc, fc = new_cache(model.config), new_cache(model.config)
                model(input_ids=x[:, :20], cache=sc)
                fast(input_ids=x[:, :20], cache=fc)
                for lo, hi in ((20, 28), (28, 29)):
                    p = torch.arange(lo, hi).unsqueeze(0)
                    a = model(input_ids=x[:, lo:hi], position_ids=p, cache=sc).logits
                    b = fast(input_ids=x[:, lo:hi], position_ids=p, cache=fc).logits
                    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            with pytest.raises(ValueError, match="padding mask of shape"):
                fast(input_ids=x, attention_mask=attn[:, :5])


def test_adopt_takes_it_for_the_packed_models_and_refuses_what_it_cannot_reproduce():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [5 + ord(c) % 200 for c in text]

    model = tiny(block=True)
    kept, why = lean.adopt(model, Tok())
    assert why == "lean" and isinstance(kept, lean_llama.LeanLlama) and kept.inner is model
    bf = tiny(block=True).to(torch.bfloat16)
    assert lean.adopt(bf, Tok())[1] == "lean"
    other = tiny(block=False)
    other.config.hidden_act = "gelu"
    kept, why = lean.adopt(other, Tok())
    assert kept is other and "activation gelu" in why
