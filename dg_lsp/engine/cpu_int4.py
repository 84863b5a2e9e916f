"""Narrow passes of the packed SmolLM2 models over their own 4-bit base weights, on CPUs with native bf16.

The base of the embedded model and its AR twin ships as the Q4_1 blocks of the SmolLM2 GGUF
(`models/packed.py`): 4-bit values with an fp16 scale and minimum per 32 weights. At load they are
dequantized to bf16 and the LoRA adapter is merged in, so every pass streams ~210 MB of projection weights
from memory. A canvas pass after the first (1-10 rows under tail trimming) or an AR step (1 row) does a few
MFLOP per weight it reads, so it runs at memory speed: on the 2-core Xeon with AMX a pass of 1 to 8 rows
costs 65-75 ms whatever its width (`benchmarks/int8_passes.py`).

torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, groups of 32 with a bf16 scale and zero point)
holds exactly the Q4_1 blocks: w = d*q + m = d*(q - 8) + (m + 8d). Over those, a quarter of the bytes, a
pass costs 39 ms at 1 row and 57 at 6, and the kernel's cost grows with the rows from there. The adapter
is not merged there (rounding a merged weight back to 4 bits would lose most of the LoRA's update): its
low-rank product is added to each projection's output, in fp32 (a bf16 matmul that small costs 4x an
fp32 one here). q/k/v and gate/up share their inputs, so each group is one int4 matmul and one A.

So this path is the same model, exact up to bf16 rounding and summation order, not a quantization of it.
It is slower than bf16 on wide passes (the kernel does not use AMX; the 210 projections alone, ad hoc:
16 rows 58 against 35 ms, 232 rows 570 against 90 ms), so passes of more than `MAX_ROWS` rows keep the
merged bf16 weights, which stay resident: the server holds 70-90 MiB more. `quantization = "int4"` asks
for it; `auto` takes it for the AR twin, whose every step is a one-row pass (model runs over LSP 1.75x
faster), not for the block model, whose trimmed windows are mostly 7-10 rows (1.04x:
`benchmarks/results/embedded_smollm2/int4_base/`). With fp32 activations the kernel has no fast path (the
projections at 1 row: 180 ms, ad hoc), so fp32 models (CPUs without native bf16) never use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import ClassVar

import torch

GROUP = 32
"""Weights per Q4_1 block, and the kernel's group size."""
MAX_ROWS = 6
"""Rows (batch x tokens) up to which a pass runs over the int4 base: measured crossover with bf16 at ~6."""
INNER_K_TILES = 2


@dataclass(frozen=True)
class PackedSource:
    """Where a packed model's weights came from, kept on the loaded model so a forward can re-read the
    4-bit base and the unmerged adapter: the merged bf16 weights no longer hold them apart."""

    base: Path
    adapter: Path | None
    scale: float


def _op_missing() -> str | None:
    ops = ("_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu")
    missing = [op for op in ops if not hasattr(torch.ops.aten, op)]
    return f"this torch has no {', '.join(missing)}" if missing else None


def pack_q4_1(raw: torch.Tensor, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int4 weight, (k/32, n, 2) scales and zero points) from `raw` Q4_1 rows (n, k/32 * 20 bytes)."""
    blocks = raw.reshape(n, k // GROUP, 20)
    d = blocks[..., :2].contiguous().view(torch.float16).float().squeeze(-1)
    m = blocks[..., 2:4].contiguous().view(torch.float16).float().squeeze(-1)
    nibbles = blocks[..., 4:]
    q = torch.empty(n, k // GROUP, GROUP, dtype=torch.int32)
    q[..., : GROUP // 2] = nibbles & 0x0F  # low nibbles first, as `packed.dequantize` reads them
    q[..., GROUP // 2 :] = nibbles >> 4
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), INNER_K_TILES)
    scales_zeros = torch.stack([d, m + 8 * d], dim=-1).transpose(0, 1).contiguous().to(dtype)
    return packed, scales_zeros


class Int4Group:
    """One int4 matmul over projections that share their input (rows concatenated), plus their LoRA
    updates: x @ A^T for all of them at once (ranks side by side), then each one's B on its own slice of
    the output (a block-diagonal B in one call would hold 18 MB of zeros)."""

    def __init__(self, packed, scales_zeros, a: torch.Tensor | None, bs: list[tuple[int, int, torch.Tensor]]):
        self.packed, self.scales_zeros = packed, scales_zeros
        # fp32: a bf16 matmul this small costs 4x an fp32 one on the CPU (53 against 14 us at 2 rows)
        self.a_t = None if a is None else a.t().float().contiguous()  # (k, ranks)
        self.bs = [(r, n, b.t().float().contiguous()) for r, n, b in bs]
        """Per projection with an adapter: (its first rank, its first output column, B^T (rank, n))."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)
        if self.a_t is not None:
            t = x.float() @ self.a_t
            for r, n, b_t in self.bs:
                y[:, n : n + b_t.shape[1]] += t[:, r : r + b_t.shape[0]] @ b_t
        return y


def _group(raws, loras, dtype) -> Int4Group:
    """`raws`: [(raw Q4_1 rows, n, k)] of projections sharing an input; `loras`: [(A, B) or None] each."""
    k = raws[0][2]
    packed, sz = pack_q4_1(torch.cat([r for r, _, _ in raws]), sum(n for _, n, _ in raws), k, dtype)
    columns = _starts(n for _, n, _ in raws)
    pairs = [(n0, lo) for n0, lo in zip(columns, loras, strict=True) if lo is not None]
    if not pairs:
        return Int4Group(packed, sz, None, [])
    ranks = _starts(lo[0].shape[0] for _, lo in pairs)
    a = torch.cat([lo[0] for _, lo in pairs])
    return Int4Group(packed, sz, a, [(r0, n0, lo[1]) for r0, (n0, lo) in zip(ranks, pairs, strict=True)])


def _starts(sizes) -> list[int]:
    """Where each of consecutive blocks of these sizes starts."""
    return list(accumulate(sizes, initial=0))[:-1]


class Int4Layers:
    """Per decoder layer, the int4 groups `LeanLlama` runs narrow passes with: q/k/v, o, gate/up, down."""

    GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {
        "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "o": ("self_attn.o_proj",),
        "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        "down": ("mlp.down_proj",),
    }

    def __init__(self, layers: list[dict[str, Int4Group]], max_rows: int = MAX_ROWS):
        self.layers = layers
        self.max_rows = max_rows

    @classmethod
    def load(cls, source: PackedSource, n_layers: int, dtype: torch.dtype, max_rows: int = MAX_ROWS):
        from safetensors import safe_open

        lora: dict[str, torch.Tensor] = {}
        if source.adapter is not None:
            with safe_open(str(source.adapter), framework="pt") as f:
                lora = {k: f.get_tensor(k).float() for k in f.keys() if k.endswith((".lora_A", ".lora_B"))}
        layers = []
        with safe_open(str(source.base), framework="pt") as f:
            kinds = json.loads(f.metadata()["tensors"])
            for i in range(n_layers):
                groups = {}
                for gname, members in cls.GROUPS.items():
                    raws, loras = [], []
                    for m in members:
                        name = f"model.layers.{i}.{m}"
                        info = kinds[f"{name}.weight"]
                        if info["type"] != "Q4_1":
                            raise ValueError(f"{name} is {info['type']}, not Q4_1")
                        n, k = info["shape"]
                        raws.append((f.get_tensor(f"{name}.weight"), n, k))
                        pair = (lora.get(f"{name}.lora_A"), lora.get(f"{name}.lora_B"))
                        loras.append(None if pair[0] is None else (pair[0], pair[1] * source.scale))
                    groups[gname] = _group(raws, loras, dtype)
                layers.append(groups)
        return cls(layers, max_rows)


def unavailable(dtype: torch.dtype, device: torch.device, source: PackedSource | None) -> str | None:
    """None when narrow passes can run over the int4 base here; else why not (for `describe()`)."""
    if source is None:
        return "the model has no packed 4-bit base"
    if device.type != "cpu":
        return "not on the CPU"
    if dtype != torch.bfloat16:
        return f"the model runs in {str(dtype).removeprefix('torch.')}: the int4 kernel is fast in bf16 only"
    if (why := _op_missing()) is not None:
        return why
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(64, 64, generator=gen)
        from dg_lsp.models.packed import dequantize, quantize

        raw = quantize(w, "Q4_1")
        packed, sz = pack_q4_1(raw, 64, 64, torch.bfloat16)
        x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
        got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz).float()
    except Exception as exc:  # a CPU or build the kernel refuses
        return f"no int4 kernel ({type(exc).__name__}: {exc})"
    ref = x.float() @ dequantize(raw, "Q4_1", [64, 64]).t()
    err = float((got - ref).norm() / ref.norm())
    return None if err < 0.02 else f"the int4 kernel is off by {err:.2g} on a probe"
