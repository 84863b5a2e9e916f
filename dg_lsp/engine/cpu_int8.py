"""Dynamic int8 matmuls for the lean Llama forward's narrow passes on the CPU.

A canvas pass or an AR step multiplies 1-50 rows by every weight of the model once: at 135M parameters
that is ~270 MB of bf16 weights streamed from memory for a few MFLOP each, so it runs at memory speed
(measured on the 2-core Xeon, all 210 projections of 30 layers, weights streamed: 31 ms at 1 row, 35 at
13, 42 at 33 in bf16). fbgemm's dynamic int8 linear reads half the bytes and multiplies in int8 (10.6,
20.0, 29.4 ms) but loses to bf16 on wide passes (300 rows: 188 against 113 ms), so the lean forward keeps
the bf16 weights for prompts and uses these packed copies only up to `MAX_ROWS` rows (~107 MB more).
Against fp32 (CPUs without native bf16, where bf16 is emulated and slower still) int8 wins at every width:
on a 2-core AMD EPYC (AVX2, no VNNI), the shipped block model's 13-row canvas pass 155 -> 99 ms and a
333-token prompt 1,124 -> 797 ms (`benchmarks/results/embedded_smollm2/int8_fp32/`), so over fp32 weights
every pass runs in int8 (`max_rows=None`).

Weights are symmetric int8 per output row; activations are quantized per call by fbgemm, per tensor:
8-bit on CPUs with VNNI, 7-bit (`reduce_range`) elsewhere, where fbgemm's 16-bit pair sums can saturate.
On the shipped block model's canvas passes (30 held-out files, against fp32) top-1 agreement was 99.4% in
bf16, 96.3% with every projection and the LM head in 8-bit int8, 94.5% in 7-bit, and 97.2% with the
head left in bf16: the head's input is where per-tensor activation scales hurt, so callers leave it out.
Per-tensor scales also clip the few input channels with large values, so the copies are smoothed as in
SmoothQuant: each weight column is multiplied by s_j = max|x_j|^0.5 / max|W_j|^0.5 (activation maxima from
bf16 passes over the first 320 tokens of four of dg-lsp's own source files, run at load) and the input
is divided by s on the fly, which leaves the product unchanged and moves range from the activations into
the weights: agreement 97.2% -> 98.2%, KL to fp32 halved. fbgemm scales activations per tensor, which a
prompt's hundreds of rows of unequal magnitude pay for, so each row is divided by its own largest value
before the call and the output row multiplied back (exact in real arithmetic: the product is linear in the
row): per-token scales through a per-tensor kernel. With every pass in int8 (2-core AMD EPYC, 7-bit, 15
held-out cursors, canvas logits after an int8 prompt, ad-hoc): KL to fp32 0.34 -> 0.094, against 0.070
with the prompt left in fp32. Built on torch's `quantized` ops, which torch
2.13 marks deprecated: `unavailable()` tries them on a tiny matrix, and a torch that has dropped
them (or a CPU fbgemm does not run on) keeps plain bf16 with the reason in `describe()`.
"""

from __future__ import annotations

import warnings
from functools import cache
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_ROWS = 64
"""Rows (batch x tokens) up to which a pass multiplies in int8; wider passes (prompts) stay in bf16."""
SMOOTH_ALPHA = 0.5
"""SmoothQuant's migration strength (0.5, 0.7 and 0.85 measured: 0.5 kept the logits closest to fp32)."""
CALIBRATION_FILES = ("settings.py", "pipeline.py", "files.py", "context/__init__.py")
"""dg-lsp's own sources, which ship with it: code to calibrate the smoothing on, for any model."""
CALIBRATION_TOKENS = 320


@cache
def reduce_range() -> bool:
    """7-bit activations unless the CPU has VNNI (its int8 dot products accumulate in 32 bits)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return not ("avx512_vnni" in flags or "avx_vnni" in flags)


def _pack(weight: torch.Tensor):
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors; `unavailable` guards removal
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None)


def unavailable() -> str | None:
    """None when fbgemm's dynamic int8 linear runs here and matches fp32 on a probe; else why not."""
    try:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            return "this torch has no fbgemm"
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(64, 96, generator=gen), torch.randn(3, 96, generator=gen)
        got = torch.ops.quantized.linear_dynamic(x, _pack(w), reduce_range())
    except Exception as exc:  # a torch without the quantized ops, or a CPU fbgemm refuses
        return f"no dynamic int8 linear ({type(exc).__name__}: {exc})"
    ref = F.linear(x, w)
    err = float((got - ref).norm() / ref.norm())
    return None if err < 0.05 else f"dynamic int8 linear is off by {err:.2g} on a probe"


def calibration_texts() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    return [(root / f).read_text(encoding="utf-8") for f in CALIBRATION_FILES if (root / f).is_file()]


def key(weight: torch.Tensor) -> tuple[int, torch.Size]:
    return weight.data_ptr(), weight.shape


def smoothing(input_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel scale: max|x_j|^alpha / max|W_j|^(1 - alpha)."""
    w_max = weight.detach().float().abs().amax(dim=0).clamp_min(1e-5)
    return (input_absmax.float().clamp_min(1e-5) ** alpha / w_max ** (1 - alpha)).clamp_min(1e-5)


class Int8Linears:
    """Packed int8 copies of a model's projection weights, looked up by the weight they copy;
    `input_absmax` (per weight key: the largest |x_j| its input reached) turns on the smoothing; passes wider
    than `max_rows` rows keep the model's own weights (None: none do)."""

    def __init__(
        self, weights: list[torch.Tensor], input_absmax: dict | None = None, max_rows: int | None = MAX_ROWS
    ):
        self.max_rows = max_rows
        self._packed = {}
        for w in weights:
            stats = (input_absmax or {}).get(key(w))
            s = None if stats is None else smoothing(stats, w)
            self._packed[key(w)] = (_pack(w.detach().float() * s if s is not None else w), s)
        self.bytes = sum(w.numel() for w in weights)  # one byte a weight, plus a scale per row

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`F.linear(x, weight)`, in int8 when `weight` is packed and the pass is narrow enough."""
        rows = x.numel() // x.shape[-1]
        narrow = self.max_rows is None or rows <= self.max_rows
        packed, s = self._packed.get(key(weight), (None, None)) if narrow else (None, None)
        if packed is None:
            return F.linear(x, weight)
        x2 = x.reshape(rows, x.shape[-1]).float()
        if s is not None:
            x2 = x2 / s
        peak = x2.abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)  # per-row scale (module docstring)
        out = torch.ops.quantized.linear_dynamic(x2 / peak, packed, reduce_range()) * peak
        return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])
