"""Prompt layouts, and loading the models that declare one.

A checkpoint's `config.json` may carry `dg_lsp_layout`; it says how a request becomes token ids:

- absent: dg-lsp's own models (`<bos><fim_prefix>P<fim_suffix>S<fim_middle>` for AR, `[bos] P [mask]… S` in
  place for masked models) and the checkpoints they were built to read;
- `block`: the embedded model (`dg_lsp/models/block_llama.py`): `<fim_suffix>S<fim_prefix>P<fim_middle>` then
  the canvas, so the causal prompt sees both sides and the canvas comes last;
- `spm`: its AR twin, the same prompt, generated left to right;
- `prefix`: a plain causal LM with no FIM tokens (the pretrained base as it ships): the prefix only.

`block`/`spm`/`prefix` models are stored as packed base weights plus an adapter and load through
`block_llama.load_block_model`, not `from_pretrained`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

PACKED_LAYOUTS = ("block", "spm", "prefix")


def layout_of(config: dict) -> str:
    return str(config.get("dg_lsp_layout") or "native")


def load_packed_model(model_dir: Path, dtype: torch.dtype):
    from dg_lsp.models.block_llama import load_block_model

    return load_block_model(model_dir, dtype=dtype)


def spm_ids(tokenizer, pre: list[int], suf: list[int]) -> list[int]:
    """`<fim_suffix> S <fim_prefix> P <fim_middle>` with the tokenizer's own ids for the FIM tokens."""
    from dg_lsp.models.block_llama import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX

    fp, fs, fm = tokenizer.convert_tokens_to_ids([FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE])
    return [fs, *suf, fp, *pre, fm]


@functools.cache
def cpu_has_native_bf16() -> bool:
    """avx512_bf16 or AMX: bf16 matmuls run several times faster than fp32 there (measured ~4x on this
    project's machines); elsewhere bf16 on a CPU is emulated and slower."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def packed_dtype(device: torch.device) -> torch.dtype:
    """The packed models' dtype under `dtype = auto`: bf16 on CUDA and on CPUs with native bf16, else fp32
    (they are the 100M-parameter class, where the matmuls dominate and bf16 pays)."""
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32
