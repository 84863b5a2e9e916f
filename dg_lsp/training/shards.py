"""Pre-tokenized training examples in shards, for runs where tokenizing on the fly would starve the device.

A GPU step of the LoRA adaptation takes milliseconds; drawing a batch (sampling a file, cutting an
editing-like middle, tokenizing prefix/middle/suffix) takes tens on one CPU core. So the GPU recipe
trains from examples drawn here, ahead of time, by exactly the code the CPU recipe runs
(`adapt.make_examples`, one context budget per batch) and stored compactly:

- `shard-NNNNN.safetensors`: `tokens` (uint16, or int32 for vocabularies past 65,535), every example's
  prefix, suffix and middle ids back to back, and `lengths` (int32, examples x 3); whole batches only, each
  file under `max_shard_bytes` (a device call carries at most 64 MiB, the issue asks for <= 60 MB);
- `shards.json`: the manifest (batch size, counts, tokenizer, the config's data settings and seed), so a
  run refuses shards cut for another tokenizer or batch size.

`dg-lsp train CONFIG --pretokenize DIR --examples N` writes them; a config with `data.shards = DIR` trains
from them, batch i being the i-th stored batch (cycling when the run outlasts them).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np

from dg_lsp.training.batches import Example
from dg_lsp.training.config import TrainConfig

MANIFEST = "shards.json"
MAX_SHARD_BYTES = 60 * 10**6


def _dtype(vocab: int):
    return np.uint16 if vocab <= 2**16 else np.int32


def write(
    cfg: TrainConfig, tok, out_dir: Path, examples: int, max_shard_bytes: int = MAX_SHARD_BYTES, seed: int = 0
) -> dict:
    """Draw `examples` (rounded up to whole batches) from the config's training split and write them."""
    from safetensors.numpy import save_file

    from dg_lsp.training.adapt import make_examples
    from dg_lsp.training.corpus import load_docs
    from dg_lsp.training.train import DocSampler

    out_dir.mkdir(parents=True, exist_ok=True)
    sampler = DocSampler(load_docs(Path(cfg.data.corpus) / "train.jsonl"))
    dtype = _dtype(len(tok))
    bs = cfg.batch_size
    batches = -(-examples // bs)
    files: list[str] = []
    toks: list[np.ndarray] = []
    lens: list[list[int]] = []
    size = 0
    total_tokens = 0

    def flush() -> None:
        nonlocal toks, lens, size
        if not lens:
            return
        name = f"shard-{len(files):05d}.safetensors"
        save_file(
            {"tokens": np.concatenate(toks).astype(dtype), "lengths": np.asarray(lens, dtype=np.int32)},
            str(out_dir / name),
        )
        files.append(name)
        toks, lens, size = [], [], 0

    for b in range(batches):
        rng = random.Random(seed * 1_000_003 + b)
        rows = make_examples(cfg, tok, sampler, rng, bs)
        ids = [np.asarray(e.prefix_ids + e.suffix_ids + e.middle_ids, dtype=dtype) for e in rows]
        nbytes = sum(a.nbytes for a in ids) + 12 * bs
        if nbytes > max_shard_bytes:
            raise ValueError(f"one batch takes {nbytes} bytes, more than a shard's {max_shard_bytes}")
        if size + nbytes > max_shard_bytes:
            flush()
        toks += ids
        lens += [[len(e.prefix_ids), len(e.suffix_ids), len(e.middle_ids)] for e in rows]
        size += nbytes
        total_tokens += sum(len(a) for a in ids)
    flush()
    manifest = {
        "batch_size": bs,
        "batches": batches,
        "examples": batches * bs,
        "tokens": total_tokens,
        "vocab": len(tok),
        "tokenizer": cfg.data.tokenizer,
        "seed": seed,
        "data": asdict(cfg.data),
        "canvas_buckets": list(cfg.model.canvas_buckets),
        "files": files,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


class ShardReader:
    """All of a shard directory's examples in memory (<= a few hundred MB), served batch by batch."""

    def __init__(self, shard_dir: Path, batch_size: int, vocab: int):
        from safetensors.numpy import load_file

        self.dir = Path(shard_dir)
        self.manifest = json.loads((self.dir / MANIFEST).read_text())
        if self.manifest["batch_size"] != batch_size:
            raise ValueError(
                f"shards in {self.dir} hold batches of {self.manifest['batch_size']}, the config asks for "
                f"{batch_size}: cut them again with this config (dg-lsp train CONFIG --pretokenize DIR)"
            )
        if self.manifest["vocab"] != vocab:
            raise ValueError(
                f"shards in {self.dir} were cut with a {self.manifest['vocab']}-token tokenizer, "
                f"this run's has {vocab}"
            )
        self.examples: list[Example] = []
        for name in self.manifest["files"]:
            data = load_file(str(self.dir / name))
            flat, lengths = data["tokens"].astype(np.int64).tolist(), data["lengths"].tolist()
            at = 0
            for n_pre, n_suf, n_mid in lengths:
                pre, suf = flat[at : at + n_pre], flat[at + n_pre : at + n_pre + n_suf]
                mid = flat[at + n_pre + n_suf : at + n_pre + n_suf + n_mid]
                self.examples.append(Example(prefix_ids=pre, suffix_ids=suf, middle_ids=mid))
                at += n_pre + n_suf + n_mid
        self.batch_size = batch_size
        self.batches = len(self.examples) // batch_size

    def batch(self, step: int) -> list[Example]:
        i = step % self.batches
        return self.examples[i * self.batch_size : (i + 1) * self.batch_size]
