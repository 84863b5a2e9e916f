"""A pretrained causal Llama run as a one-block diffusion infill model (the embedded model's architecture).

Layout (suffix first, so a causal prompt already sees both sides of the cursor):

    <fim_suffix> S <fim_prefix> P <fim_middle> c_1 … c_n

The prompt is read causally, exactly as the pretrained model reads text, so its KV is exact and reusable
across keystrokes; the block `<fim_middle> c_1 … c_n` attends to the whole prompt and bidirectionally to
itself, and is denoised from `<mask>` tokens in a few parallel passes. Logits are shifted by one as in
Dream/DiffuCoder (c_i is read at the position before it), which keeps the pretrained next-token head's
meaning. Only canvas tokens are new to the model, so a short LoRA adaptation is enough to learn it.

Weights on disk: `base.safetensors` (the pretrained weights in their original block quantization, see
`packed.py`) plus `adapter.safetensors` (LoRA deltas merged at load, and the embeddings of the added
special tokens). The output head covers only the base vocabulary: added tokens are never predicted.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import torch
from torch import nn

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, MASK = "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<mask>"
ADDED_TOKENS = [FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE, MASK]
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class ExtendedEmbedding(nn.Module):
    """The frozen base embedding plus a few trainable rows for added tokens (ids >= the base vocabulary).

    Kept apart from the base table so training updates (and ships) only these rows, and the tied output
    head keeps scoring the base vocabulary alone."""

    def __init__(self, base: nn.Embedding, n_added: int):
        super().__init__()
        self.base = base
        self.base_vocab = base.num_embeddings
        init = base.weight.detach().float().mean(0, keepdim=True).repeat(n_added, 1)
        self.added = nn.Parameter(init.to(base.weight.dtype))

    @property
    def weight(self) -> torch.Tensor:  # what transformers' tying and resizing code looks at
        return self.base.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        extra = ids >= self.base_vocab
        out = self.base(ids.clamp(max=self.base_vocab - 1))
        if extra.any():
            out = out.clone()
            out[extra] = self.added[ids[extra] - self.base_vocab].to(out.dtype)
        return out


def block_attention_mask(
    input_ids: torch.Tensor, padding: torch.Tensor | None, past: int, block_id: int
) -> torch.Tensor:
    """(B, 1, q, past+q) boolean mask: causal over the prompt, bidirectional inside the block that starts at
    the `<fim_middle>` token. A chunk without that token continues a block when it follows cached keys (the
    canvas-only passes), and is a plain causal prompt otherwise."""
    bsz, q = input_ids.shape
    kv = past + q
    dev = input_ids.device
    qpos = past + torch.arange(q, device=dev)
    kpos = torch.arange(kv, device=dev)
    has = input_ids == block_id
    first = torch.where(
        has.any(1), has.float().argmax(1) + past, torch.full((bsz,), past if past else kv, device=dev)
    )
    start = first[:, None, None]
    allowed = (kpos[None, None, :] <= qpos[None, :, None]) | (
        (kpos[None, None, :] >= start) & (qpos[None, :, None] >= start)
    )
    if padding is not None:
        allowed = allowed & padding[:, None, -kv:].bool()
    return allowed[:, None]


def _block_llama_class():
    from transformers import LlamaForCausalLM

    class BlockDiffusionLlama(LlamaForCausalLM):
        """LlamaForCausalLM whose attention follows `block_attention_mask`."""

        def forward(
            self,
            input_ids=None,
            attention_mask=None,
            position_ids=None,
            cache=None,
            logits_to_keep=0,
            **kwargs,
        ):
            past = cache.get_seq_length() if cache is not None else 0
            mask = block_attention_mask(input_ids, attention_mask, past, self.config.dg_lsp_block_token_id)
            return super().forward(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=position_ids,
                cache=cache,
                logits_to_keep=logits_to_keep,
                **kwargs,
            )

    return BlockDiffusionLlama


def build_model(
    config: dict,
    state: dict[str, torch.Tensor],
    n_added: int,
    block: bool = True,
    dtype: torch.dtype = torch.float32,
):
    """The Llama from a config dict and base weights, with room for `n_added` special tokens; `block`
    = the diffusion model, else the same network read causally (its AR twin). The parameters are
    allocated in `dtype` alone (a bf16 model never holds an fp32 copy of itself)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ours = {k for k in config if k.startswith("dg_lsp_") or k == "mask_token_id"}
    cfg = LlamaConfig(**{k: v for k, v in config.items() if k not in ours})
    for k in ours:  # past the token-id validation: added ids lie beyond the base vocabulary on purpose
        cfg.__dict__[k] = config[k]
    cls = _block_llama_class() if block else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(cfg).to(dtype)
    # its inv_freq buffer is not in the weights; in the model's dtype, as `Module.to` would leave it
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg).to(dtype)
    state = {k: v.to(dtype) for k, v in state.items()}  # no copy where a tensor is in `dtype` already
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    # the weights become the parameters: a second set to copy them into doubled the memory at start
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.model.embed_tokens = ExtendedEmbedding(model.model.embed_tokens, n_added)
    return model.eval()


def merge_lora(state: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], scale: float) -> None:
    """W += scale * B @ A for every `NAME.lora_A` / `NAME.lora_B` pair (NAME = a Linear's module path), on
    the fp32 base weights before the model exists: the sum is rounded to the model's dtype once."""
    for key in [k for k in lora if k.endswith(".lora_A")]:
        name = key.removesuffix(".lora_A")
        a, b = lora[key].float(), lora[f"{name}.lora_B"].float()
        state[f"{name}.weight"] += scale * (b @ a)


def base_path(model_dir: Path, name: str) -> Path:
    """Where a model directory's `dg_lsp_base` points, if that is a regular file inside the directory or
    among the models shipped in this package (shared bases): a config must not make dg-lsp read any file
    on disk, nor open a FIFO."""
    path = (model_dir / name).resolve()
    allowed = (model_dir.resolve(), Path(__file__).resolve().parent)
    # a run's export links the base from the training data folder: follow links made inside the directory
    link_ok = (model_dir / name).is_symlink() and (model_dir / name).parent.resolve() == model_dir.resolve()
    if not link_ok and not any(path.is_relative_to(a) for a in allowed):
        raise ValueError(f"dg_lsp_base {name!r} points outside the model directory")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError(f"dg_lsp_base {name!r} is not a regular file")
    return path


def load_block_model(model_dir: str | Path, dtype: torch.dtype = torch.float32):
    """The embedded-model layout: `config.json` + `base.safetensors` (packed) + `adapter.safetensors`."""
    from safetensors import safe_open

    from dg_lsp.engine.cpu_int4 import PackedSource
    from dg_lsp.models.packed import load_packed

    d = Path(model_dir)
    config = json.loads((d / "config.json").read_text())
    base_file = base_path(d, str(config.get("dg_lsp_base", "base.safetensors")))
    base_cfg, state = load_packed(base_file)
    adapter_file = d / "adapter.safetensors"
    lora, meta = {}, {}
    if adapter_file.exists():
        with safe_open(str(adapter_file), framework="pt") as f:
            meta = f.metadata() or {}
            lora = {k: f.get_tensor(k) for k in f.keys()}
    added = lora.pop("added_embeddings", None)
    n_added = len(ADDED_TOKENS) if added is None else added.shape[0]
    merge_lora(state, lora, float(meta.get("scale", 1.0)))
    for name in list(state):  # one tensor at a time: the fp32 copy of the whole model never coexists
        state[name] = state[name].to(dtype)
    block = config.get("dg_lsp_layout") == "block"
    model = build_model({**base_cfg, **config}, state, n_added, block=block, dtype=dtype)
    del state
    if added is not None:
        model.model.embed_tokens.added.data.copy_(added.float())
    model = model.to(dtype).eval()
    # the 4-bit base and the unmerged adapter, for the forward's int4 narrow passes (`cpu_int4`)
    model.dg_lsp_packed_source = PackedSource(
        base_file, adapter_file if lora else None, float(meta.get("scale", 1.0))
    )
    return model
