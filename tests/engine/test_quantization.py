"""Quantization on the tiny DiffusionGemma: what is targeted, that experts are covered, int8 agreement."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dg_lsp.engine import quantization as q
from dg_lsp.engine.diffusion_gemma import DiffusionGemmaEngine
from dg_lsp.engine.loader import load_engine
from dg_lsp.engine.types import InfillRequest
from dg_lsp.settings import Settings


@pytest.fixture(scope="module")
def fp32(tiny_dg_dir):
    return q.load_diffusion_gemma(tiny_dg_dir, torch.device("cpu"), "none", torch.float32)[0]


@pytest.fixture(scope="module")
def int8(tiny_dg_dir):
    model, kind = q.load_diffusion_gemma(tiny_dg_dir, torch.device("cpu"), "int8")
    assert kind == "int8"
    return model


def test_transformers_default_skip_list_would_keep_tied_layers_unquantized(fp32):
    """Why we pass our own skip list: the default one names every tied encoder/decoder weight."""
    from transformers.quantizers.base import get_keys_to_not_convert

    default_skip = set(get_keys_to_not_convert(fp32))
    assert "model.decoder.layers.0.self_attn.q_proj" in default_skip
    targets = q.linear_targets(fp32)
    for layer in ("model.decoder.layers.0", "model.encoder.language_model.layers.1"):
        for proj in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
            assert f"{layer}.{proj}" in targets
    for kept in ("lm_head", "router.proj", "self_conditioning", "vision_tower", "embed_vision"):
        assert not any(kept in t for t in targets), kept


def test_bnb_configs_carry_the_explicit_skip_list():
    nf4 = q.bnb_config("nf4")
    assert nf4.load_in_4bit and nf4.bnb_4bit_quant_type == "nf4" and nf4.bnb_4bit_use_double_quant
    assert nf4.llm_int8_skip_modules == q.DIFFUSION_GEMMA_SKIP
    eight = q.bnb_config("8bit")
    assert eight.load_in_8bit and eight.llm_int8_skip_modules == q.DIFFUSION_GEMMA_SKIP


def test_resolve_kind():
    assert q.resolve_kind("auto", "cpu") == "none"
    assert q.resolve_kind("int8", "cpu") == "int8"
    assert q.resolve_kind("int8", "cuda") == "8bit"
    assert q.resolve_kind("int4", "cpu") == "int4"  # the packed models' own 4-bit base (cpu_int4)
    assert q.resolve_kind("int4", "cuda") == "nf4"
    with pytest.raises(ValueError, match="CUDA"):
        q.resolve_kind("nf4", "cpu")
    with pytest.raises(ValueError):
        q.resolve_kind("fp3", "cpu")


def test_int8_covers_linears_and_3d_experts_once(fp32, int8):
    assert q.expert_parameters(fp32)  # the fp32 model has 3-D expert banks...
    assert q.expert_parameters(int8) == []  # ...the quantized one has none left
    assert not any(type(m) is nn.Linear and n in q.linear_targets(fp32) for n, m in int8.named_modules())
    enc = int8.model.encoder.language_model.layers[0]
    dec = int8.model.decoder.layers[0]
    assert isinstance(dec.experts, q.QuantizedExperts) and enc.experts is dec.experts  # tied: stored once
    assert isinstance(dec.self_attn.q_proj, q.Int8Linear) and enc.self_attn.q_proj is dec.self_attn.q_proj
    assert q.module_bytes(int8) < q.module_bytes(fp32)


def test_int8_logits_agree_with_fp32(tiny_dg_dir, fp32, int8):
    e32 = DiffusionGemmaEngine(tiny_dg_dir, model=fp32)
    e8 = DiffusionGemmaEngine(tiny_dg_dir, model=int8, quantization="int8")
    ids = e32.prompt_ids(InfillRequest("def add(a, b):\n    return ", "\n"))
    canvas = torch.randint(
        0, e32.vocab_size, (1, e32.canvas_length), generator=torch.Generator().manual_seed(0)
    )
    pos = torch.arange(len(ids), len(ids) + e32.canvas_length)[None]
    with torch.inference_mode():
        logits = []
        for engine in (e32, e8):
            state, _ = engine.encode(ids, None)
            cache = engine._decoder_cache(state, 1)
            logits.append(
                engine.model(decoder_input_ids=canvas, past_key_values=cache, decoder_position_ids=pos).logits
            )
    cos = nn.functional.cosine_similarity(logits[0].flatten(), logits[1].flatten(), dim=0)
    assert cos > 0.99
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean() > 0.8


def test_int8_expert_bank_matches_reference_math(fp32):
    experts = fp32.model.decoder.layers[0].experts
    quant = q.QuantizedExperts(experts, q.Int8Bank)
    hidden = torch.randn(5, experts.hidden_dim, generator=torch.Generator().manual_seed(1))
    top_k = torch.tensor([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2]])
    weights = torch.full((5, 2), 0.5)
    with torch.inference_mode():
        ref = experts(hidden, top_k, weights)
        got = quant(hidden, top_k, weights)
    torch.testing.assert_close(got, ref, rtol=0.05, atol=0.05 * ref.abs().max().item())


def test_engine_loads_int8_from_settings(tiny_dg_dir):
    engine = load_engine(Settings(model=str(tiny_dg_dir), device="cpu", quantization="int8"))
    assert engine.describe()["quantization"] == "int8"
    result = engine.infill(InfillRequest("x = ", "\n", max_tokens=8, steps=2))
    assert result.stats.forward_passes == 2 and len(result.candidates[0].token_ids) <= 8


def test_cuda_plan_quantizes_each_tied_pair_once_and_every_expert_bank(fp32):
    plan = q.quantization_plan(fp32)
    modules = dict(fp32.named_modules(remove_duplicate=False))
    layers = fp32.config.get_text_config().num_hidden_layers
    assert len(plan["experts"]) == layers  # encoder and decoder share each layer's bank
    assert plan["tied_aliases"]  # the encoder's linears are the decoder's
    unique = {id(modules[n].weight) for n in plan["linears"]}
    assert len(unique) == len(plan["linears"])
    assert all(id(modules[n].weight) in unique for n in plan["tied_aliases"])
    covered = {id(modules[n].gate_up_proj) for n in plan["experts"]}
    banks = {
        id(p) for n, p in fp32.named_parameters(remove_duplicate=False) if n in q.expert_parameters(fp32)
    }
    assert {id(modules[n].gate_up_proj) for n in plan["experts"]} == covered and covered <= banks


def test_auto_quantization_rule():
    gib = 1 << 30
    assert q.auto_kind(52 * gib, None) == "none"  # CPU
    assert q.auto_kind(52 * gib, 23 * gib) == "nf4"  # 26B-A4B bf16 on a 24 GB card
    assert q.auto_kind(1 * gib, 23 * gib) == "none"
