"""A lean forward for the shipped Gemma3-shaped models (the 5M diffusion model and its AR twin; the packed
Llama models have theirs in `lean_llama.py`, chosen here too).

At this size a transformers forward is mostly Python: per-call mask construction (vmapped mask
functions), output capturing, kwargs plumbing and three projections where one matmul would do. On the
2-core CPU that was 10–14 ms of a 4-layer canvas pass whose arithmetic takes a few. `LeanGemma3` runs
the same weights (shared, not copied, except the fused q/k/v and gate/up matrices) with plain torch and
answers the calls the engines make — `model(input_ids=, position_ids=, cache=, logits_to_keep=)` with a
transformers `DynamicCache`, and a (batch, keys) padding `attention_mask` for batched requests — so the
engines, their KV snapshots, the dual cache and the batched runner stay as they are.

It only takes configurations it reproduces exactly (`supported`): full-attention layers, no logit
soft-capping, default RoPE. Everything else keeps the transformers model. The engines
check at load that both forwards agree on a real prompt before switching (`adopt`).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def supported(model: nn.Module) -> str | None:
    """None when `model` is a Gemma3 text model the lean forward reproduces; else why not."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "gemma3_text":
        return "not a Gemma3 text model"
    if type(model).__name__ != "Gemma3ForCausalLM":
        return f"class {type(model).__name__}"
    if any(t != "full_attention" for t in cfg.layer_types):
        return "sliding-window layers"
    if cfg.attn_logit_softcapping is not None or cfg.final_logit_softcapping is not None:
        return "logit soft-capping"
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("full_attention") or {}
    if rope.get("rope_type", "default") != "default":
        return f"RoPE type {rope.get('rope_type')}"
    if cfg.hidden_activation != "gelu_pytorch_tanh":
        return f"activation {cfg.hidden_activation}"
    return plain_projections(model)


def plain_projections(model: nn.Module) -> str | None:
    """None when every decoder layer's projections are plain bias-free `nn.Linear`s (what the lean
    forwards multiply by directly); else why not. Shared by the Gemma3 and Llama forwards."""
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        projections = (
            att.q_proj,
            att.k_proj,
            att.v_proj,
            att.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
        if any(type(p) is not nn.Linear or p.bias is not None for p in projections):
            return "quantized or biased linear layers"
    return None


class _Layer(nn.Module):
    """One decoder layer's weights, q/k/v and gate/up fused into one matrix each (one matmul instead of
    three and two); norms as (1 + w) in fp32, as Gemma3's RMSNorm applies them."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        att, mlp = layer.self_attn, layer.mlp
        w = lambda t: t.detach()  # noqa: E731
        self.register_buffer(
            "qkv", torch.cat([w(att.q_proj.weight), w(att.k_proj.weight), w(att.v_proj.weight)])
        )
        self.register_buffer("o", w(att.o_proj.weight))
        self.register_buffer("gate_up", torch.cat([w(mlp.gate_proj.weight), w(mlp.up_proj.weight)]))
        self.register_buffer("down", w(mlp.down_proj.weight))
        self.register_buffer("q_norm", 1.0 + w(att.q_norm.weight).float())
        self.register_buffer("k_norm", 1.0 + w(att.k_norm.weight).float())
        norms = (
            layer.input_layernorm,
            layer.post_attention_layernorm,
            layer.pre_feedforward_layernorm,
            layer.post_feedforward_layernorm,
        )
        self.register_buffer("norms", torch.stack([1.0 + w(n.weight).float() for n in norms]))


class LeanGemma3(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        cfg = model.config
        self.config = cfg
        self.bidirectional = bool(getattr(cfg, "use_bidirectional_attention", False))
        base = model.model
        self.embed = base.embed_tokens.weight
        self.embed_scale = float(cfg.hidden_size) ** 0.5
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.scaling = cfg.query_pre_attn_scalar**-0.5
        self.eps = cfg.rms_norm_eps
        theta = cfg.rope_parameters["full_attention"]["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv.to(self.embed.device), persistent=False)
        self.layers = nn.ModuleList(_Layer(layer) for layer in base.layers)
        self.register_buffer("final_norm", 1.0 + base.norm.weight.detach().float(), persistent=False)
        self.lm_head = model.lm_head.weight
        self.inner = model  # keeps the originals alive (the embedding is shared with the head)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def parameters(self, recurse: bool = True):  # what `describe()` counts: the original weights
        return self.inner.parameters(recurse)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * w.float()).type_as(x)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[:, None, :, None].float() * self.inv_freq  # (B, 1, T, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _mask(self, padding: torch.Tensor | None, b: int, t: int, past: int, device) -> torch.Tensor:
        """(B, 1, T, past + T) bool: a causal model's new rows see the cache and the new tokens up to
        themselves; `padding` (B, past + T), 1 = real token, as transformers takes it, hides padded keys. A
        row left with no key (a padded query) sees every key, as transformers' masks let it: its output is
        never read, and an all-masked row would be NaN."""
        keys = past + t
        mask = torch.ones(t, keys, dtype=torch.bool, device=device)
        if not self.bidirectional:
            mask = mask.tril(past)
        mask = mask.expand(b, 1, t, keys)
        if padding is not None:
            if padding.shape != (b, keys):
                raise ValueError(f"padding mask of shape {tuple(padding.shape)}, expected {(b, keys)}")
            mask = mask & padding.bool()[:, None, None, :]
        return mask | ~mask.any(dim=-1, keepdim=True)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

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
        if use_cache and cache is None:  # as transformers does: a fresh cache, returned with the logits
            from dg_lsp.engine.kv import new_cache

            cache = new_cache(self.config, record=False)
        past = cache.get_seq_length() if cache is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device).unsqueeze(0)
        position_ids = position_ids.expand(b, -1)
        h = F.embedding(input_ids, self.embed) * torch.tensor(self.embed_scale, dtype=self.embed.dtype)
        cos, sin = self._rope(position_ids, h.dtype)
        mask = None
        causal = not self.bidirectional and t > 1
        if attention_mask is not None or (causal and past):
            mask = self._mask(attention_mask, b, t, past, h.device)
            causal = False
        q_end, k_end = self.heads * self.head_dim, (self.heads + self.kv_heads) * self.head_dim
        for i, layer in enumerate(self.layers):
            x = self._norm(h, layer.norms[0])
            qkv = F.linear(x, layer.qkv)
            q = qkv[..., :q_end].view(b, t, self.heads, self.head_dim).transpose(1, 2)
            k = qkv[..., q_end:k_end].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            v = qkv[..., k_end:].view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
            q = self._rotate(self._norm(q, layer.q_norm), cos, sin)
            k = self._rotate(self._norm(k, layer.k_norm), cos, sin)
            if cache is not None:
                k, v = cache.update(k, v, i)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=self.scaling, enable_gqa=True
            )
            a = F.linear(a.transpose(1, 2).reshape(b, t, -1), layer.o)
            h = h + self._norm(a, layer.norms[1])
            x = self._norm(h, layer.norms[2])
            gate, up = F.linear(x, layer.gate_up).chunk(2, dim=-1)
            m = F.linear(F.gelu(gate, approximate="tanh") * up, layer.down)
            h = h + self._norm(m, layer.norms[3])
        h = self._norm(h, self.final_norm)
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep else h
        else:
            h = h[:, logits_to_keep]
        return SimpleNamespace(logits=F.linear(h, self.lm_head), cache=cache)


PROBE = "def mean(values):\n    total = sum(values)\n    return total / len(values)\n"


def int8_capable(model: nn.Module, quantization: str, device: torch.device) -> bool:
    """Whether the `quantization` setting asks `adopt(..., int8=True)` to run `model`'s passes in dynamic
    int8: `int8` on the CPU, on a model the lean Llama forward runs (the 5M Gemma3 models, at 4 layers of
    width 192, are not bound by reading weights). Otherwise `int8` means int8 weights dequantized per call
    (`quantization.quantize_linears_int8_`: smaller, not faster). `auto` never picks it: even with per-row
    activation scales int8 cost 4-8 points of suggestions shown (single- and multi-line) through the editor
    against fp32 (`benchmarks/results/embedded_smollm2/int8_fp32/`)."""
    from dg_lsp.engine import lean_llama

    return quantization == "int8" and device.type == "cpu" and lean_llama.supported(model) is None


def adopt(model: nn.Module, tokenizer, int8: bool = False) -> tuple[nn.Module, str]:
    """(the lean forward, "lean") when it supports `model` and matches it on a probe (one full pass both
    ways); else (`model`, why not), for `describe()`. `int8`: passes in dynamic int8 where the forward and
    this torch can (`cpu_int8`): every pass over fp32 weights, narrow ones over bf16 (on wide passes native
    bf16 beats int8); the kind says which."""
    lean_model, kind = _adopt(model, tokenizer)
    if not int8:
        return lean_model, kind
    from dg_lsp.engine import cpu_int8

    why = None if hasattr(lean_model, "use_int8") else "this forward has no int8 path"
    why = why or cpu_int8.unavailable()
    if why is not None:
        log.warning("int8 off: %s", why)
        return lean_model, f"{kind} (int8 off: {why})"
    calibration = [
        ids[: cpu_int8.CALIBRATION_TOKENS]
        for text in cpu_int8.calibration_texts()
        if (ids := tokenizer.encode(text, add_special_tokens=False))
    ]
    max_rows = None if lean_model.dtype == torch.float32 else cpu_int8.MAX_ROWS
    lean_model.use_int8(calibration, max_rows)
    smoothed = ", smoothed" if calibration else ""
    rows = "on every pass" if max_rows is None else f"up to {max_rows} rows"
    return lean_model, f"{kind}, int8 {rows}{smoothed}"


def adopt_int4(model: nn.Module, tokenizer, setting: str, kind: str, by_default: bool) -> str:
    """Run `model`'s (a `LeanLlama`'s) narrow passes over its packed 4-bit base (`cpu_int4`) where it can and
    where it matches the merged weights on a probe pass; return the forward's kind for `describe()`. The
    same weights, not a quantization of them: `quantization = "int4"` asks for it, and `auto` takes it where
    it pays for its memory (`by_default`: the AR twin, whose every step is a one-row pass, 1.5-1.8x faster;
    not the block model, whose trimmed windows are mostly wider than the int4 kernel's crossover: 1.04x for
    ~70 MiB, `benchmarks/results/embedded_smollm2/int4_base/`)."""
    from dg_lsp.engine import cpu_int4

    if not (setting == "int4" or (setting == "auto" and by_default)):
        return kind
    source = getattr(getattr(model, "inner", None), "dg_lsp_packed_source", None)
    if not hasattr(model, "use_int4"):
        why = "this forward has no int4 path"
    else:
        why = cpu_int4.unavailable(model.dtype, model.lm_head.device, source)
    if why is None:
        try:
            layers = cpu_int4.Int4Layers.load(source, len(model.layers), model.dtype)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
    if why is None:
        ids = tokenizer.encode(PROBE, add_special_tokens=False)[: layers.max_rows]
        with torch.inference_mode():
            x = torch.tensor([ids], device=model.lm_head.device)
            ref = model(input_ids=x).logits.float()
            model.use_int4(layers)
            got = model(input_ids=x).logits.float()
        # two bf16 paths, each 1-4% (relative norm) from the fp32 model on the shipped models' probes, the
        # int4 one as often the closer; a mispacked weight or a base that is not the model's is off by ~100%
        err = float((ref - got).norm() / ref.norm())
        if err <= 0.1:
            from dg_lsp.engine.layouts import release_freed_memory

            release_freed_memory()  # the unpacked nibbles and raw blocks the packing went through
            return f"{kind}, int4 base up to {layers.max_rows} rows"
        model.use_int4(None)
        why = f"it differs from the merged weights by {err:.3g}"
    if setting == "int4":
        log.warning("int4 off: %s", why)
    elif source is None:
        return kind  # `auto` on a model without a packed base: nothing to say
    return f"{kind} (int4 base off: {why})"


def _adopt(model: nn.Module, tokenizer) -> tuple[nn.Module, str]:
    from dg_lsp.engine import lean_llama

    cls, why = LeanGemma3, supported(model)
    if getattr(getattr(model, "config", None), "model_type", None) == "llama":
        cls, why = lean_llama.LeanLlama, lean_llama.supported(model)
    probe_ids = tokenizer.encode(PROBE, add_special_tokens=False)[:64] if why is None else []
    if why is None and not probe_ids:
        why = "the tokenizer encodes nothing"
    if why is None:
        lean = cls(model)
        with torch.inference_mode():
            block = getattr(lean, "block_id", None)
            if block is not None:  # a block model: the probe also opens a block of masks
                mask = getattr(model.config, "mask_token_id", None)
                probe_ids = [*probe_ids, block, *([mask] * 4 if mask is not None else probe_ids[:4])]
            ids = torch.tensor([probe_ids], device=lean.lm_head.device)
            ref = model(input_ids=ids).logits.float()
            got = lean(input_ids=ids).logits.float()
        err = float((ref - got).abs().max())
        scale = float(ref.abs().max()) or 1.0
        # fp32 agrees to rounding; in bf16 the kernels' accumulation orders differ and a 30-layer model
        # drifts ~1% of the logits' range (the argmax still agrees), so the bar follows the precision
        tol = 2e-3 if lean.dtype == torch.float32 else 2e-2
        if err <= tol * max(1.0, scale):
            log.debug("lean forward on (max logit difference %.2e)", err)
            return lean, "lean"
        why = f"it differs from transformers by {err:.3g}"
    log.debug("lean forward off: %s", why)
    return model, f"transformers ({why})"
