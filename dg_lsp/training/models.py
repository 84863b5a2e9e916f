"""Build the diffusion model and its causal twin from one ModelConfig, and export shippable copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from dg_lsp.models import tokens
from dg_lsp.models.tiny import tiny_diffusion_gemma_config
from dg_lsp.training.config import ModelConfig


def _shape_kwargs(mc: ModelConfig, vocab_size: int) -> dict:
    """The layer shape every family shares (Gemma 4 with MoE, dense Gemma 3)."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=mc.hidden_size,
        intermediate_size=mc.intermediate_size,
        num_hidden_layers=mc.num_hidden_layers,
        num_attention_heads=mc.num_attention_heads,
        num_key_value_heads=mc.num_key_value_heads,
        head_dim=mc.head_dim,
    )


def _text_kwargs(mc: ModelConfig, vocab_size: int) -> dict:
    pattern = mc.layer_pattern
    layer_types = [pattern[i % len(pattern)] for i in range(mc.num_hidden_layers)]
    layer_types[-1] = "full_attention"
    return dict(
        **_shape_kwargs(mc, vocab_size),
        global_head_dim=mc.head_dim,
        enable_moe_block=True,
        num_experts=mc.num_experts,
        top_k_experts=mc.top_k_experts,
        moe_intermediate_size=mc.moe_intermediate_size,
        sliding_window=mc.sliding_window,
        layer_types=layer_types,
    )


def diffusion_model(mc: ModelConfig, vocab_size: int):
    from transformers import DiffusionGemmaForBlockDiffusion

    kw = _text_kwargs(mc, vocab_size)
    config = tiny_diffusion_gemma_config(kw.pop("vocab_size"), canvas_length=mc.canvas_length, **kw)
    return DiffusionGemmaForBlockDiffusion(config)


def causal_model(mc: ModelConfig, vocab_size: int):
    """The AR twin: Gemma 4's causal text model with the diffusion encoder's layers (MoE included)."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    kw = _text_kwargs(mc, vocab_size)
    kw.pop("global_head_dim")
    config = Gemma4TextConfig(
        **kw,
        global_head_dim=mc.head_dim,
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=vocab_size,
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )
    return Gemma4ForCausalLM(config)


def gemma3_model(mc: ModelConfig, vocab_size: int, bidirectional: bool, logits_shift: bool = False):
    """Dense Gemma 3 layers: bidirectional = the masked-diffusion model read by the `masked` backend
    (LLaDA-style, or Dream-style with `logits_shift`), causal = its AR twin with the same weights layout."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **_shape_kwargs(mc, vocab_size),
        layer_types=["full_attention"] * mc.num_hidden_layers,
        use_bidirectional_attention=bidirectional,
        max_position_embeddings=4096,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )
    if bidirectional:
        config.mask_token_id = tokens.MASK_ID
        config.dg_lsp_logits_shift = logits_shift
    return Gemma3ForCausalLM(config)


def build_model(kind: str, mc: ModelConfig, vocab_size: int, logits_shift: bool = False):
    if mc.arch == "gemma3":
        if kind == "diffusion":
            raise ValueError("kind 'diffusion' is DiffusionGemma: it needs model.arch 'gemma4'")
        return gemma3_model(mc, vocab_size, bidirectional=kind == "masked", logits_shift=logits_shift)
    if mc.arch != "gemma4":
        raise ValueError(f"unknown model.arch {mc.arch!r} (expected 'gemma4' or 'gemma3')")
    if kind == "diffusion":
        return diffusion_model(mc, vocab_size)
    if kind == "ar":
        return causal_model(mc, vocab_size)
    if kind == "masked":
        raise ValueError("kind 'masked' runs dense bidirectional Gemma 3 layers: set model.arch 'gemma3'")
    raise ValueError(f"unknown model kind {kind!r} (expected 'diffusion', 'masked' or 'ar')")


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def export(model, tokenizer, out_dir: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Save a `from_pretrained`-loadable copy (safetensors in `dtype`) with the tokenizer."""
    out = Path(out_dir)
    if out.exists():
        for p in out.iterdir():
            if p.is_file() and p.name != "README.md":
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)
    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    model = model.to("cpu", dtype)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    model.to(device, torch.float32)
    return out
