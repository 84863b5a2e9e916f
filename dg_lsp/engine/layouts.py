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

    model = load_block_model(model_dir, dtype=dtype)
    release_freed_memory()
    return model


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc). Dequantizing the packed base goes through fp32
    copies of every weight; freed, they stayed in the server's resident memory (1.3 GB after loading the
    135M model in bf16, 0.6 GB once trimmed). Elsewhere a no-op."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_packed_tokenizer(model_dir: Path):
    """The tokenizer of a packed model, read without its config.json: transformers would build a
    LlamaConfig from it only to warn on every start that the added FIM and mask ids lie past the base
    vocabulary, which they do on purpose (the adapter carries their embeddings)."""
    from transformers import AutoTokenizer, PretrainedConfig

    return AutoTokenizer.from_pretrained(model_dir, config=PretrainedConfig())


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
