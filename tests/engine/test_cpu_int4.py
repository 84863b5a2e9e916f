"""Narrow passes over the packed 4-bit base (dg_lsp/engine/cpu_int4.py): the kernel holds the Q4_1 blocks
as they are, a tiny packed model with an adapter decodes the same with and without it, and the engines take
it under `quantization = "int4"`, the AR twin under `auto` too."""

from __future__ import annotations

import json

import pytest
import torch

from dg_lsp.engine import cpu_int4, lean_llama
from dg_lsp.engine.kv import new_cache
from dg_lsp.models import block_llama as bl
from dg_lsp.models import packed
from tests.engine.test_lean_llama import BLOCK, MASK, TINY_LLAMA, VOCAB

CONFIG = {**TINY_LLAMA, "num_hidden_layers": 2, "attention_bias": False, "mlp_bias": False}


@pytest.fixture(scope="module", autouse=True)
def _needs_the_kernel():
    why = cpu_int4.unavailable(torch.bfloat16, torch.device("cpu"), cpu_int4.PackedSource(None, None, 1.0))
    if why is not None:
        pytest.skip(f"int4 kernel unavailable here: {why}")


def packed_model_dir(tmp_path, with_adapter: bool = True):
    """A tiny model in the embedded model's layout: packed Q4_1 base, LoRA adapter (rank 4, scale 0.5)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    state = LlamaForCausalLM(LlamaConfig(**CONFIG)).state_dict()
    packed.pack_state_dict(CONFIG, state, tmp_path / "base.safetensors")
    gen = torch.Generator().manual_seed(1)
    adapter = {"added_embeddings": torch.randn(len(bl.ADDED_TOKENS), 64, generator=gen) * 0.02}
    if with_adapter:
        for i in range(CONFIG["num_hidden_layers"]):
            for target in bl.LORA_TARGETS:
                part = "mlp" if target in ("gate_proj", "up_proj", "down_proj") else "self_attn"
                n, k = state[f"model.layers.{i}.{part}.{target}.weight"].shape
                name = f"model.layers.{i}.{part}.{target}"
                adapter[f"{name}.lora_A"] = torch.randn(4, k, generator=gen) * 0.2
                adapter[f"{name}.lora_B"] = torch.randn(n, 4, generator=gen) * 0.2
    save_file(adapter, str(tmp_path / "adapter.safetensors"), metadata={"rank": "4", "scale": "0.5"})
    layout = {"dg_lsp_layout": "block", "dg_lsp_block_token_id": BLOCK, "mask_token_id": MASK}
    config = {**CONFIG, **layout, "dg_lsp_base": "base.safetensors"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_kernel_holds_q4_1_blocks_as_they_are():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 128, generator=gen)
    raw = packed.quantize(w, "Q4_1")
    weights, scales_zeros = cpu_int4.pack_q4_1(raw, 96, 128, torch.bfloat16)
    assert scales_zeros.shape == (128 // cpu_int4.GROUP, 96, 2)
    x = torch.randn(5, 128, generator=gen).to(torch.bfloat16)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, weights, cpu_int4.GROUP, scales_zeros).float()
    exact = x.float() @ packed.dequantize(raw, "Q4_1", [96, 128]).t()
    assert float((got - exact).norm() / exact.norm()) < 1e-2  # bf16 rounding of the scales and the output
    lossy = x.float() @ w.t()  # against the weights before Q4_1: the blocks' own error, far larger
    assert float((got - exact).norm()) < 0.1 * float((got - lossy).norm())


def _passes(model, prompt: torch.Tensor, canvas: torch.Tensor):
    """(prompt logits, canvas logits) of a cold prompt pass then a canvas pass against its cache."""
    with torch.inference_mode():
        cache = new_cache(model.config)
        a = model(input_ids=prompt, cache=cache, use_cache=True).logits.float()
        pos = torch.arange(prompt.shape[1], prompt.shape[1] + canvas.shape[1]).unsqueeze(0)
        b = model(input_ids=canvas, position_ids=pos, cache=cache).logits.float()
    return a, b


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


def test_narrow_passes_run_over_the_base_and_the_adapter_wide_ones_over_the_merged_weights(tmp_path):
    model = bl.load_block_model(packed_model_dir(tmp_path), dtype=torch.bfloat16)
    source = model.dg_lsp_packed_source
    assert source.base == tmp_path / "base.safetensors" and source.adapter is not None and source.scale == 0.5
    plain, fast = lean_llama.LeanLlama(model), lean_llama.LeanLlama(model)
    fast.use_int4(cpu_int4.Int4Layers.load(source, 2, torch.bfloat16))
    gen = torch.Generator().manual_seed(4)
    prompt = torch.cat([torch.randint(5, VOCAB, (1, 40), generator=gen), torch.tensor([[BLOCK]])], dim=1)
    narrow = torch.full((1, cpu_int4.MAX_ROWS), MASK)
    a_plain, b_plain = _passes(plain, prompt, narrow)
    a_fast, b_fast = _passes(fast, prompt, narrow)
    torch.testing.assert_close(a_fast, a_plain, rtol=0, atol=0)  # 41 rows: the merged bf16 weights
    assert 0 < _rel(b_plain, b_fast) < 0.03  # the int4 path ran, and is the same model to bf16 rounding
    assert float((b_plain.argmax(-1) == b_fast.argmax(-1)).float().mean()) >= 0.8
    wide = torch.full((1, cpu_int4.MAX_ROWS + 1), MASK)
    got, ref = _passes(fast, prompt, wide)[1], _passes(plain, prompt, wide)[1]
    torch.testing.assert_close(got, ref, rtol=0, atol=0)

    # the adapter's update is applied, not dropped: the base alone is much further from the merged model
    base_only = lean_llama.LeanLlama(model)
    no_adapter = cpu_int4.PackedSource(source.base, None, 1.0)
    base_only.use_int4(cpu_int4.Int4Layers.load(no_adapter, 2, torch.bfloat16))
    assert _rel(b_plain, _passes(base_only, prompt, narrow)[1]) > 5 * _rel(b_plain, b_fast)


def test_a_base_that_is_not_q4_1_is_refused_with_the_tensor_named(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    d = packed_model_dir(tmp_path)
    with safe_open(str(d / "base.safetensors"), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    kinds = json.loads(meta["tensors"])
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = packed.dequantize(tensors[name], "Q4_1", kinds[name]["shape"]).contiguous()
    kinds[name]["type"] = "F32"
    save_file(tensors, str(d / "base.safetensors"), metadata={**meta, "tensors": json.dumps(kinds)})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj is F32"):
        cpu_int4.Int4Layers.load(cpu_int4.PackedSource(d / "base.safetensors", None, 1.0), 2, torch.bfloat16)


def test_unavailable_says_why():
    src = cpu_int4.PackedSource(None, None, 1.0)
    assert "no packed 4-bit base" in cpu_int4.unavailable(torch.bfloat16, torch.device("cpu"), None)
    assert "float32" in cpu_int4.unavailable(torch.float32, torch.device("cpu"), src)
    assert "CPU" in cpu_int4.unavailable(torch.bfloat16, torch.device("meta"), src)


@pytest.mark.parametrize("kind", ["masked", "ar"])
def test_the_shipped_models_take_it_when_asked_and_the_twin_by_default(kind):
    """`int4` runs the shipped models' narrow passes over their 4-bit base (probed against the merged weights
    at load) and they still complete from the class state; `auto` takes it for the AR twin alone (where it
    pays for its memory), `none` for neither."""
    from tests.engine.test_cpu_int8 import _completes_with_class_state, _shipped

    cls, model_dir = _shipped(kind)
    on = cls(model_dir, quantization="int4", dtype="bfloat16")
    assert on.describe()["quantization"] == "int4"
    assert on.describe()["forward"] == f"lean, int4 base up to {cpu_int4.MAX_ROWS} rows", on.describe()
    assert isinstance(on.model, lean_llama.LeanLlama) and on.model.int4 is not None
    _completes_with_class_state(on)
    auto = cls(model_dir, quantization="auto", dtype="bfloat16")
    assert (auto.model.int4 is not None) == (kind == "ar"), auto.describe()
    assert auto.describe()["quantization"] == ("int4" if kind == "ar" else "none")
    off = cls(model_dir, quantization="none", dtype="bfloat16")
    assert off.describe()["forward"] == "lean" and off.model.int4 is None
    fp32 = cls(model_dir, quantization="int4", dtype="float32")  # asked for, and refused with the reason
    why = "the model runs in float32: the int4 kernel is fast in bf16 only"
    assert fp32.describe()["forward"] == f"lean (int4 base off: {why})", fp32.describe()
