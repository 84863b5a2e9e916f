"""Model loading with optional quantization: bitsandbytes NF4/8-bit on CUDA, weight-only int8 on CPU.

DiffusionGemma needs two things the bitsandbytes defaults get wrong:
- its encoder and decoder share (tie) every layer weight, and transformers' default skip list keeps every
  tied module in full precision, i.e. almost the whole model: we pass an explicit skip list instead
  (`bnb_config`, for the transformers loading path) and quantize each tied pair once (`quantize_to_cuda_`);
- its MoE experts are 3-D `nn.Parameter`s (experts x out x in), not `nn.Linear`, so bitsandbytes never
  sees them although they hold most of the 26B parameters: `QuantizedExperts` stores them per expert,
  quantized, and dequantizes only the experts a token is routed to.
The CUDA paths need a GPU and bitsandbytes and are not exercised by the CPU test suite.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

log = logging.getLogger(__name__)

KINDS = ("auto", "none", "int4", "int8", "8bit", "nf4")

# Kept in full precision: tiny, numerically sensitive, or tied to the embedding. Patterns follow
# transformers' `should_convert_module` (anchored regex at a module boundary, or a name suffix).
DIFFUSION_GEMMA_SKIP = [
    "lm_head",
    r".*\.embed_tokens",
    r".*\.self_conditioning",
    r".*\.router",
    r".*\.vision_tower",
    r".*\.embed_vision",
]


def resolve_kind(kind: str, device: torch.device | str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown quantization {kind!r}; expected one of {KINDS}")
    cuda = str(device).startswith("cuda")
    if kind == "auto":
        return "none"
    if kind in ("8bit", "nf4") and not cuda:
        raise ValueError(f"quantization {kind!r} needs CUDA (bitsandbytes); use 'int8' on CPU")
    if kind == "int8" and cuda:
        return "8bit"
    if kind == "int4" and cuda:  # the CPU's int4 runs over a packed model's own 4-bit base (`cpu_int4`)
        return "nf4"
    return kind


def bnb_config(kind: str, skip: list[str] | None = None, compute_dtype: torch.dtype = torch.bfloat16):
    """The `BitsAndBytesConfig` for `8bit`/`nf4` with an explicit skip list (see module docstring)."""
    from transformers import BitsAndBytesConfig

    skip = list(DIFFUSION_GEMMA_SKIP if skip is None else skip)
    if kind == "nf4":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype,
            bnb_4bit_use_double_quant=True,
            llm_int8_skip_modules=skip,
        )
    if kind == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)
    raise ValueError(f"not a bitsandbytes kind: {kind!r}")


def linear_targets(model: nn.Module, skip: list[str] | None = None) -> list[str]:
    """Names of the `nn.Linear` modules bitsandbytes will replace given `skip` (same matching rule)."""
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = list(DIFFUSION_GEMMA_SKIP if skip is None else skip)
    return [n for n, m in model.named_modules() if type(m) is nn.Linear and should_convert_module(n, skip)]


def expert_parameters(model: nn.Module) -> list[str]:
    """Names of 3-D MoE expert banks (encoder and decoder copies) that no Linear-based quantizer touches."""
    return [n for n, p in model.named_parameters(remove_duplicate=False) if p.ndim == 3 and ".experts." in n]


# -- expert banks ---------------------------------------------------------------------------------


class Int8Bank(nn.Module):
    """Weight-only int8 (per output row absmax) for a 3-D bank; dequantizes one expert at a time."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127.0
        self.register_buffer("qweight", torch.round(w / scale).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(weight.dtype))
        self.dtype = weight.dtype

    def expert(self, i: int) -> torch.Tensor:
        return self.qweight[i].to(self.dtype) * self.scale[i]


class Nf4Bank(nn.Module):
    """NF4 (bitsandbytes) per expert, quantized straight onto `device`; CUDA only, untested without a GPU."""

    def __init__(self, weight: torch.Tensor, device: torch.device):
        super().__init__()
        import bitsandbytes.functional as bnbf

        self.dtype = weight.dtype
        self.states = []
        for i in range(weight.shape[0]):
            packed, state = bnbf.quantize_4bit(
                weight[i].to(device), quant_type="nf4", compress_statistics=True
            )
            self.register_buffer(f"packed_{i}", packed)
            self.states.append(state)

    def expert(self, i: int) -> torch.Tensor:
        import bitsandbytes.functional as bnbf

        return bnbf.dequantize_4bit(getattr(self, f"packed_{i}"), self.states[i]).to(self.dtype)


class QuantizedExperts(nn.Module):
    """Drop-in for DiffusionGemma's expert module with quantized banks; same routing arithmetic."""

    def __init__(self, experts: nn.Module, bank_factory):
        super().__init__()
        self.num_experts = experts.num_experts
        self.act_fn = experts.act_fn
        self.gate_up = bank_factory(experts.gate_up_proj)
        self.down = bank_factory(experts.down_proj)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if e >= self.num_experts:
                continue
            token_idx, slot = torch.where(top_k_index == e)
            x = hidden_states[token_idx]
            gate, up = nn.functional.linear(x, self.gate_up.expert(e)).chunk(2, dim=-1)
            y = nn.functional.linear(self.act_fn(gate) * up, self.down.expert(e))
            y = y * top_k_weights[token_idx, slot, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


def quantize_experts_(model: nn.Module, bank_factory) -> int:
    """Replace every expert module (one with 3-D `gate_up_proj`/`down_proj`) in place; tied copies in the
    encoder and decoder share one quantized module, so memory is paid once. Returns how many were replaced.
    """
    done: dict[int, nn.Module] = {}
    count = 0
    for name, module in list(model.named_modules(remove_duplicate=False)):
        gate_up = getattr(module, "gate_up_proj", None)
        if not isinstance(gate_up, nn.Parameter) or gate_up.ndim != 3:
            continue
        key = id(gate_up)  # tied encoder/decoder experts share the Parameter object
        if key not in done:
            done[key] = QuantizedExperts(module, bank_factory)
            count += 1
        model.set_submodule(name, done[key])
    return count


class Int8Linear(nn.Module):
    """Weight-only int8 linear (per output row absmax), dequantized on the fly.

    Our own rather than `torch.ao.quantization.quantize_dynamic`, whose quantized tensors torch 2.13
    deprecates; this one is plain tensors, so it survives torch upgrades and `state_dict` round trips.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bank = Int8Bank(linear.weight.detach()[None])
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.bank.expert(0).to(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears_int8_(model: nn.Module, skip: list[str] | None = None) -> int:
    """Swap every targeted `nn.Linear` for `Int8Linear`; tied encoder/decoder linears share one module."""
    targets = set(linear_targets(model, skip))
    swapped: dict[int, nn.Module] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if name not in targets:
            continue
        key = id(module.weight)
        if key not in swapped:
            swapped[key] = Int8Linear(module)
        model.set_submodule(name, swapped[key])
    return len(swapped)


def quantize_cpu_int8_(model: nn.Module, skip: list[str] | None = None) -> dict[str, int]:
    linears = quantize_linears_int8_(model, skip)
    experts = quantize_experts_(model, Int8Bank)
    return {"linears": linears, "expert_modules": experts}


def module_bytes(model: nn.Module) -> int:
    """Bytes held by unique parameters and buffers (tied weights and shared quantized banks count once)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


# -- CUDA (bitsandbytes) ----------------------------------------------------------------------------


def _bnb_linear(linear: nn.Linear, kind: str, device: torch.device, compute_dtype: torch.dtype) -> nn.Module:
    """A bitsandbytes linear holding `linear`'s weight, quantized as it moves to `device`."""
    import bitsandbytes as bnb

    has_bias = linear.bias is not None
    if kind == "nf4":
        new = bnb.nn.Linear4bit(
            linear.in_features, linear.out_features, has_bias, compute_dtype=compute_dtype, quant_type="nf4"
        )
        new.weight = bnb.nn.Params4bit(
            linear.weight.data.to(compute_dtype),
            requires_grad=False,
            quant_type="nf4",
            compress_statistics=True,
        )
    else:
        new = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, has_bias, has_fp16_weights=False)
        new.weight = bnb.nn.Int8Params(
            linear.weight.data.to(torch.float16), requires_grad=False, has_fp16_weights=False
        )
    if has_bias:
        new.bias = nn.Parameter(linear.bias.data.to(compute_dtype), requires_grad=False)
    return new.to(device)


def quantization_plan(model: nn.Module, skip: list[str] | None = None) -> dict[str, list[str]]:
    """What `quantize_to_cuda_` will do, computable without a GPU: unique linears to quantize (tied copies
    listed once), their tied aliases, and the expert modules whose 3-D banks get quantized per expert."""
    targets = set(linear_targets(model, skip))
    first: dict[int, str] = {}
    aliases: list[str] = []
    for name, module in model.named_modules(remove_duplicate=False):
        if name in targets:
            key = id(module.weight)
            if key in first:
                aliases.append(name)
            else:
                first[key] = name
    experts: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        bank = getattr(module, "gate_up_proj", None)
        if isinstance(bank, nn.Parameter) and bank.ndim == 3:
            experts.setdefault(id(bank), name)
    return {"linears": list(first.values()), "tied_aliases": aliases, "experts": list(experts.values())}


def quantize_to_cuda_(
    model: nn.Module, kind: str, device: torch.device, compute_dtype: torch.dtype = torch.bfloat16
) -> dict[str, int]:
    """Quantize a CPU-resident model onto the GPU module by module, so GPU memory never holds an
    unquantized copy: targeted linears become bitsandbytes layers (tied encoder/decoder copies share
    one), expert banks become per-expert NF4/int8, the rest moves in `compute_dtype`.
    Needs CUDA and bitsandbytes; untested in CI (no GPU there)."""
    targets = set(linear_targets(model))
    done: dict[int, nn.Module] = {}
    for name, module in list(model.named_modules(remove_duplicate=False)):
        if name in targets:
            key = id(module.weight)
            if key not in done:
                done[key] = _bnb_linear(module, kind, device, compute_dtype)
            model.set_submodule(name, done[key])
    experts = quantize_experts_(
        model, lambda w: Nf4Bank(w, device) if kind == "nf4" else Int8Bank(w.to(compute_dtype).to(device))
    )
    model.to(device)
    return {"linears": len(done), "expert_modules": experts}


def auto_kind(checkpoint_bytes: int, free_gpu_bytes: int | None) -> str:
    """`auto` quantization: nothing on CPU; on CUDA, NF4 when the checkpoint (plus ~20% for activations and
    caches) would not fit in free GPU memory, else none."""
    if free_gpu_bytes is None:
        return "none"
    return "nf4" if checkpoint_bytes * 1.2 > free_gpu_bytes else "none"


def checkpoint_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))


# -- loading --------------------------------------------------------------------------------------


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The `dtype` setting's choices besides `auto`."""


BF16_MIN_CHECKPOINT_BYTES = 50 * 2**20
"""Below this a model runs fp32 on a CPU even with native bf16. The shipped 5M models (10 MB) gained 1.4-1.8x
per diffusion pass in bf16 but lost 1.7-1.9 points of single-line quality through the editor, and their AR
steps got slower (benchmarks/results/lean_forward.md, dtype/); a 100M-class model is matmul-bound."""


def default_dtype(device: torch.device | str, model_dir: Path | None = None) -> torch.dtype:
    """bf16 on CUDA, and on CPUs with native bf16 (avx512_bf16/AMX: matmuls ~2-4x faster than fp32 there,
    measured on this project's machines) for checkpoints of `BF16_MIN_CHECKPOINT_BYTES` or more; fp32 on
    other CPUs, which emulate bf16 several times slower. A checkpoint saved in fp16 never runs as such on a
    CPU."""
    from dg_lsp.engine.layouts import cpu_has_native_bf16

    if str(device).startswith("cuda"):
        return torch.bfloat16
    big = model_dir is None or checkpoint_bytes(model_dir) >= BF16_MIN_CHECKPOINT_BYTES
    return torch.bfloat16 if cpu_has_native_bf16() and big else torch.float32


def resolve_dtype(name: str, device: torch.device | str, model_dir: Path | None = None) -> torch.dtype:
    """The `dtype` setting: `auto` (`default_dtype`) or one of `DTYPES`; ValueError names the choices."""
    if name == "auto":
        return default_dtype(device, model_dir)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected auto or one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_diffusion_gemma(model_dir: Path, device: torch.device, kind: str, dtype: torch.dtype | None = None):
    """Load `DiffusionGemmaForBlockDiffusion` on `device` with `kind` quantization; return (model, kind).

    8bit/nf4 load on CPU first (needs CPU RAM about the checkpoint's size) and quantize onto the GPU,
    since bitsandbytes alone would leave the 3-D expert banks unquantized on the GPU, which is what
    does not fit for 26B-A4B.
    """
    from transformers import DiffusionGemmaForBlockDiffusion

    cuda = str(device).startswith("cuda")
    if kind == "auto" and cuda:
        free, _ = torch.cuda.mem_get_info(device)
        kind = auto_kind(checkpoint_bytes(model_dir), free)
    kind = resolve_kind(kind, device)
    if kind == "int4":  # the packed SmolLM2 models' 4-bit base (`cpu_int4`): no such thing here
        log.warning("quantization 'int4' applies to the packed SmolLM2 models only: loading unquantized")
        kind = "none"
    if kind in ("8bit", "nf4"):
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir, dtype=dtype or torch.bfloat16)
        quantize_to_cuda_(model, kind, device, compute_dtype=dtype or torch.bfloat16)
        return model.eval(), kind
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(
        model_dir, dtype=dtype or default_dtype(device, model_dir)
    )
    if kind == "int8":
        quantize_cpu_int8_(model)
    return model.to(device).eval(), kind
