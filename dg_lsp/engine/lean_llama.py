"""A lean forward for the packed Llama models: the SmolLM2-based block-diffusion model and its AR twin.

transformers runs every pass of `BlockDiffusionLlama` with an explicit (batch, 1, queries, keys) boolean
mask, which sends attention down SDPA's generic math path on the CPU: on a 16-token canvas pass against a
~1,000-token cached prompt that was about a third of the pass, and a cold prompt of ~1,000 tokens paid a
materialised 1,000 x 1,000 score matrix per head and layer. Yet the block mask has only two regions that
matter: the prompt is causal and the block (`<fim_middle>` and the canvas) sees everything. So this forward
runs attention in at most two chunks, each with a mask-free kernel: the prompt with `is_causal`, then the
block against the prompt's keys with no mask at all. Canvas-only passes (the dual cache, every step after
the first) are one mask-free chunk. Padded batches and anything irregular keep an explicit mask. Only
attention is chunked: the projections of every layer run once over all rows, since a pass on a CPU costs
about one read of the weights (a request's first pass, a few new prompt tokens and the canvas, cost two
canvas passes when each chunk ran the layers on its own: 120-170 ms against 80-97 ms for 34 rows).

The weights are the model's own tensors (nothing is copied or fused: at 135M parameters a second copy
would cost as much memory as the model, and the passes are bound by reading weights, not by call count).
The call signature is the engines' (`model(input_ids=, position_ids=, cache=, logits_to_keep=,
attention_mask=)`), with a transformers `DynamicCache`, so KV snapshots, the dual cache and the batched
runner are unchanged. `lean.adopt` checks it against transformers on a probe before switching.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from dg_lsp.engine.cpu_int4 import Int4Layers
from dg_lsp.engine.cpu_int8 import MAX_ROWS, Int8Linears, key
from dg_lsp.engine.lean import plain_projections


def supported(model: nn.Module) -> str | None:
    """None when `model` is a Llama this forward reproduces; else why not."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama":
        return "not a Llama model"
    if type(model).__name__ not in ("LlamaForCausalLM", "BlockDiffusionLlama"):
        return f"class {type(model).__name__}"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope != "default":
        return f"RoPE type {rope}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act}"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "tensor-parallel pretraining split"
    return plain_projections(model)


class LeanLlama(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        cfg = model.config
        self.config = cfg
        base = model.model
        block = getattr(cfg, "dg_lsp_block_token_id", None)
        self.block_id = (
            int(block) if type(model).__name__ == "BlockDiffusionLlama" and block is not None else None
        )
        """The token that opens the bidirectional block (None: a plain causal Llama)."""
        self.embed_tokens = base.embed_tokens  # the module: it may carry rows for added special tokens
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.inv_freq = base.rotary_emb.inv_freq
        self.rope_scale = float(base.rotary_emb.attention_scaling)
        self.layers = base.layers
        self.final_norm = base.norm
        self.lm_head = model.lm_head.weight
        self.inner = model  # keeps the originals (and the fallback) alive
        self.int8: Int8Linears | None = None
        """Packed int8 copies for narrow passes (`use_int8`); None: every matmul in the model's dtype."""
        self._ranges: dict | None = None
        """While `use_int8` calibrates: each projection's largest input magnitude per channel so far."""
        self.int4: Int4Layers | None = None
        """The 4-bit base and unmerged adapter for narrow passes (`use_int4`); None: the merged weights."""

    def use_int4(self, layers: Int4Layers | None) -> None:
        """Run passes of up to `layers.max_rows` rows over the packed 4-bit base (`cpu_int4`); None: off."""
        self.int4 = layers

    def use_int8(self, calibration: list[list[int]] | None = None, max_rows: int | None = MAX_ROWS) -> None:
        """Multiply passes of up to `max_rows` rows (None: every pass) in dynamic int8 (`cpu_int8`), smoothed
        with the input ranges seen on `calibration` (token id lists, run as plain passes first); the LM head
        stays in the model's dtype (per-tensor int8 of its input cost the most agreement)."""
        weights = []
        for layer in self.layers:
            att, mlp = layer.self_attn, layer.mlp
            weights += [p.weight for p in (att.q_proj, att.k_proj, att.v_proj, att.o_proj)]
            weights += [p.weight for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        self.int8, ranges = None, {}
        self._ranges = ranges
        try:
            with torch.inference_mode():
                for ids in calibration or []:
                    self(input_ids=torch.tensor([ids], device=self.lm_head.device), logits_to_keep=1)
        finally:
            self._ranges = None
        self.int8 = Int8Linears(weights, ranges or None, max_rows)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self._ranges is not None:  # calibrating: note each input channel's largest magnitude
            k = key(weight)
            seen = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0).float()
            self._ranges[k] = torch.maximum(self._ranges[k], seen) if k in self._ranges else seen
        return F.linear(x, weight) if self.int8 is None else self.int8.linear(x, weight)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.dtype

    def parameters(self, recurse: bool = True):  # what `describe()` counts: the original weights
        return self.inner.parameters(recurse)

    @staticmethod
    def _norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        xf = x.float()
        return norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).to(
            x.dtype
        )

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[:, None, :, None].float() * self.inv_freq.float()  # (B, 1, T, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def _mask(
        self, input_ids: torch.Tensor, padding: torch.Tensor | None, past: int, causal: bool = False
    ) -> torch.Tensor:
        """The explicit (B, 1, T, past + T) mask, for the chunks the mask-free kernels cannot take
        (`causal`: a prompt chunk, plain causal whatever the model)."""
        b, t = input_ids.shape
        if padding is not None and padding.shape != (b, past + t):
            raise ValueError(f"padding mask of shape {tuple(padding.shape)}, expected {(b, past + t)}")
        if self.block_id is not None and not causal:
            from dg_lsp.models.block_llama import block_attention_mask

            mask = block_attention_mask(input_ids, padding, past, self.block_id)
        else:
            mask = torch.ones(t, past + t, dtype=torch.bool, device=input_ids.device).tril(past)
            mask = mask.expand(b, 1, t, past + t)
            if padding is not None:
                mask = mask & padding.bool()[:, None, None, :]
        return mask | ~mask.any(dim=-1, keepdim=True)  # a padded query with no key: never read, not NaN

    def _layers(self, h, positions, cache, chunks) -> torch.Tensor:
        """Every layer once over all rows, so a pass reads each weight once whatever its chunks: only
        attention runs per chunk, each chunk's queries against the keys up to its own end."""
        b, t, _ = h.shape
        cos, sin = self._rope(positions, h.dtype)
        int4 = self.int4.layers if self.int4 is not None and b * t <= self.int4.max_rows else None
        nq, nkv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, layer in enumerate(self.layers):
            att, mlp = layer.self_attn, layer.mlp
            x = self._norm(h, layer.input_layernorm)
            if int4 is not None:
                q, k, v = int4[i]["qkv"](x.reshape(b * t, -1)).view(b, t, -1).split([nq, nkv, nkv], dim=-1)
            else:
                lin = self._linear
                q, k, v = lin(x, att.q_proj.weight), lin(x, att.k_proj.weight), lin(x, att.v_proj.weight)
            q = q.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
            if cache is not None:
                k, v = cache.update(k, v, i)
            past = k.shape[2] - t
            parts = [
                F.scaled_dot_product_attention(
                    q[:, :, lo:hi],
                    k[:, :, : past + hi],
                    v[:, :, : past + hi],
                    attn_mask=mask,
                    is_causal=causal,
                    scale=self.scaling,
                    enable_gqa=True,
                )
                for lo, hi, mask, causal in chunks
            ]
            a = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
            a = a.transpose(1, 2).reshape(b, t, -1)
            if int4 is not None:
                h = h + int4[i]["o"](a.reshape(b * t, -1)).view(b, t, -1)
                x = self._norm(h, layer.post_attention_layernorm).reshape(b * t, -1)
                gate, up = int4[i]["gate_up"](x).chunk(2, dim=-1)
                h = h + int4[i]["down"](F.silu(gate) * up).view(b, t, -1)
                continue
            h = h + self._linear(a, att.o_proj.weight)
            x = self._norm(h, layer.post_attention_layernorm)
            gated = F.silu(self._linear(x, mlp.gate_proj.weight)) * self._linear(x, mlp.up_proj.weight)
            h = h + self._linear(gated, mlp.down_proj.weight)
        return h

    def _chunks(self, input_ids: torch.Tensor, padding: torch.Tensor | None, past: int):
        """[(start, end, mask, causal)]: the pass as chunks that each run one attention call per layer."""
        t = input_ids.shape[1]
        if padding is not None and not bool(padding.bool().all()):
            return [(0, t, self._mask(input_ids, padding, past), False)]
        if self.block_id is None:  # plain causal: a single query (or a fresh prompt) needs no mask
            if past == 0 or t == 1:
                return [(0, t, None, t > 1)]
            return [(0, t, self._mask(input_ids, None, past), False)]
        has = input_ids == self.block_id
        if not bool(has.any()):  # a prompt on its own (causal), or a chunk continuing a block (sees all)
            if past:
                return [(0, t, None, False)]
            return [(0, t, None, t > 1)]
        cols = has.float().argmax(1)
        p = int(cols[0])
        if not bool((cols == p).all() and has.any(1).all()):
            return [(0, t, self._mask(input_ids, None, past), False)]
        chunks = []
        if p:  # the prompt before the block: causal (after cached keys: causal with that offset)
            if past == 0 or p == 1:
                chunks.append((0, p, None, p > 1 and past == 0))
            else:
                chunks.append((0, p, self._mask(input_ids[:, :p], None, past, causal=True), False))
        chunks.append((p, t, None, False))  # the block sees the whole prompt and all of itself
        return chunks

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        cache=None,
        logits_to_keep: int | torch.Tensor = 0,
        attention_mask=None,
        use_cache: bool | None = None,
    ):
        if isinstance(attention_mask, dict):  # transformers' precomputed per-layer-type masks: none here
            attention_mask = None
        b, t = input_ids.shape
        own_cache = cache is None
        from dg_lsp.engine.kv import new_cache

        if cache is None:
            cache = new_cache(self.config, record=False)
        past = cache.get_seq_length()
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device).unsqueeze(0)
        position_ids = position_ids.expand(b, -1)
        padding = attention_mask
        chunks = self._chunks(input_ids, padding, past)
        if own_cache and not use_cache and len(chunks) == 1:
            cache = None  # one chunk needs no cache to attend to itself
        h = self._layers(self.embed_tokens(input_ids), position_ids, cache, chunks)
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep else h
        else:
            h = h[:, logits_to_keep]
        h = self._norm(h, self.final_norm)
        return SimpleNamespace(
            logits=F.linear(h, self.lm_head), cache=cache if use_cache or not own_cache else None
        )
