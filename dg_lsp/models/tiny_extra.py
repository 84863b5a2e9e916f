"""Tiny random causal and masked LMs with our tokenizer, for the `ar` and `masked` backend tests.

Built from stock transformers classes and saved to a directory, so the engines load them exactly like
user checkpoints (`from_pretrained` on a local dir).
"""

from __future__ import annotations

from pathlib import Path

from dg_lsp.models import tokens
from dg_lsp.models.tiny import _SAMPLE_CODE, build_tokenizer


def make_tiny_causal_lm(path: str | Path, seed: int = 0, sliding_window: int = 16) -> Path:
    """A 2-layer `Gemma4ForCausalLM`, the AR twin's class, with a sliding window small enough that test
    prompts outgrow it (the case where naive KV-cache cropping breaks)."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    torch.manual_seed(seed)
    config = Gemma4TextConfig(
        vocab_size=len(tokenizer),
        vocab_size_per_layer_input=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=32,
        hidden_size_per_layer_input=0,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=64,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )
    Gemma4ForCausalLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_masked_lm(path: str | Path, seed: int = 0, logits_shift: bool = False) -> Path:
    """A 2-layer bidirectional `ModernBertForMaskedLM` using our `<mask>` token.

    `logits_shift=True` marks it Dream-style (position i's token is read from logits at i-1) through the
    `dg_lsp_logits_shift` config key, which the masked backend honours like Dream's architecture names.
    """
    import torch
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    torch.manual_seed(seed)
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
        cls_token_id=tokens.BOS_ID,
        sep_token_id=tokens.EOS_ID,
        mask_token_id=tokens.MASK_ID,
        global_attn_every_n_layers=1,
    )
    config.dg_lsp_logits_shift = logits_shift
    ModernBertForMaskedLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_bidirectional_lm(path: str | Path, seed: int = 0) -> Path:
    """A 2-layer `Gemma3ForCausalLM` with `use_bidirectional_attention=True`: a masked-diffusion LM (LLaDA
    style, no logit shift) whose forward accepts a KV cache, so the dual-cache path can be exercised."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        layer_types=["full_attention", "full_attention"],
        use_bidirectional_attention=True,
        max_position_embeddings=4096,
        pad_token_id=tokens.PAD_ID,
        eos_token_id=tokens.EOS_ID,
        bos_token_id=tokens.BOS_ID,
    )
    config.mask_token_id = tokens.MASK_ID
    Gemma3ForCausalLM(config).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def make_tiny_packed_base(path: str | Path, seed: int = 0) -> Path:
    """A 2-layer random Llama in the embedded model's packed format (`base.safetensors`, Q4_1/Q8_0 blocks)
    with our tiny tokenizer: the base `dg-lsp train` adapts when a config's `base` names a directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from dg_lsp.models.packed import pack_state_dict

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer([_SAMPLE_CODE] * 4)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    }
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config))
    pack_state_dict(config, model.state_dict(), path / "base.safetensors")
    tokenizer.save_pretrained(path)
    return path


def write_tiny_corpus(path: str | Path) -> Path:
    """A corpus folder (`train.jsonl`, `valid.jsonl`, 4 small Python files each) in `dg_lsp.training.corpus`'s
    format, for the adaptation tests and the GPU recipe's smoke run over `make_tiny_packed_base`."""
    import json

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid"):
        docs = [
            {"path": f"{split}{i}.py", "package": "t", "lang": "python", "text": _SAMPLE_CODE * (i + 2)}
            for i in range(4)
        ]
        (path / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path
