"""Training throughput of the SmolLM2 adaptation step on this CPU, per attention kernel or thread count.

The recipe's step (`dg_lsp/training/adapt.py`: LoRA on every projection, bf16 autocast, loss on the
masked canvas or the twin's middle) on the same batches of the CPU recipe, with two variants alternated
`--repeats` times, so drift of the machine falls on both: transformers' `sdpa` and `eager` attention on
one thread, or (`--threads`) one and two torch threads with eager attention. Reported: tokens (prompt +
canvas, padding excluded) per second of step, median over repeats, and the loss each variant gives on the
first batches (the same up to bf16 rounding). Needs the recipe's data (`data/smollm2`, the corpus in
`data/corpus`: see dg_lsp/training/README.md). Run it on a quiet machine.

    python benchmarks/adapt_step.py                 # kernels: results/adapt_step/
    python benchmarks/adapt_step.py --threads       # threads: results/adapt_threads/
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import torch

from dg_lsp.training import adapt
from dg_lsp.training.config import load_config
from dg_lsp.training.corpus import load_docs
from dg_lsp.training.train import DocSampler

CONFIG = "dg_lsp/training/configs/cpu-smollm2-block.json"
KERNELS = {"sdpa": ("sdpa", 1), "eager": ("eager", 1)}
THREADS = {"1 thread": ("eager", 1), "2 threads": ("eager", 2)}


def measure(kind: str, batches_n: int, repeats: int, variants: dict[str, tuple[str, int]]) -> dict:
    cfg = load_config(common.ROOT / CONFIG)
    cfg = dataclasses.replace(cfg, kind=kind)
    tok = adapt.base_tokenizer(cfg.base, Path(cfg.data.tokenizer))
    sp = adapt.special_ids(tok)
    base = adapt.base_weights(cfg.base, Path(cfg.data.tokenizer))
    peft_model, model = adapt.lora_model(cfg, base, kind, sp)
    params = list(adapt.trainable(peft_model).values())
    opt = torch.optim.AdamW(params, lr=1e-5)
    sampler = DocSampler(load_docs(Path(cfg.data.corpus) / "train.jsonl"))
    batches = []
    for i in range(batches_n):
        examples = adapt.make_examples(cfg, tok, sampler, random.Random(100 + i), cfg.batch_size)
        batches.append(adapt.make_batch(cfg, kind, examples, torch.Generator().manual_seed(100 + i), sp))
    tokens = sum(int(b.attention_mask.sum()) for b in batches)

    def step(batch) -> float:
        t = time.perf_counter()
        with adapt._autocast(cfg):
            loss = adapt.batch_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return time.perf_counter() - t

    def use(name: str) -> None:
        kernel, threads = variants[name]
        model.set_attn_implementation(kernel)
        torch.set_num_threads(threads)

    names = list(variants)
    losses = {}
    for name in names:
        use(name)
        step(batches[0])  # warm-up
        with torch.no_grad(), adapt._autocast(cfg):
            losses[name] = [float(adapt.batch_loss(model, b)) for b in batches[:3]]
    rates: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            use(name)
            rates[name].append(tokens / sum(step(b) for b in batches))
            print(kind, r, name, f"{rates[name][-1]:.0f} tokens/s", flush=True)
    return {"kind": kind, "tokens": tokens, "rates": rates, "losses": losses}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", action="store_true", help="compare 1 and 2 threads (eager), not kernels")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    variants, what, name = (
        (THREADS, "thread count", "adapt_threads")
        if args.threads
        else (KERNELS, "attention kernel", "adapt_step")
    )
    out = args.out or common.RESULTS / name
    a, b = variants
    lines, info = common.header(
        f"SmolLM2 adaptation step: tokens per second per {what}", threads=2 if args.threads else 1
    )
    runs = [measure(kind, args.batches, args.repeats, variants) for kind in ("block", "ar")]
    rows = []
    for run in runs:
        med = {k: statistics.median(v) for k, v in run["rates"].items()}
        rows.append(
            [
                "diffusion (block)" if run["kind"] == "block" else "AR twin",
                f"{med[a]:.0f}",
                f"{med[b]:.0f}",
                f"{med[b] / med[a]:.2f}x",
                " / ".join(f"{x:.0f}" for x in run["rates"][a]),
                " / ".join(f"{x:.0f}" for x in run["rates"][b]),
                " / ".join(f"{x:.3f} vs {y:.3f}" for x, y in zip(*run["losses"].values(), strict=True)),
            ]
        )
    lines += [
        f"`{CONFIG}`'s step (batch 8, LoRA r 32, bf16 autocast) on {args.batches} batches of its data,"
        f" {runs[0]['tokens']:,} tokens (block) and {runs[1]['tokens']:,} (twin); {a} and {b} alternated"
        f" {args.repeats} times after a warm-up step each.",
        "",
        *common.md_table(
            [
                "model",
                f"{a} tokens/s",
                f"{b} tokens/s",
                f"{b} / {a}",
                f"{a}, each repeat",
                f"{b}, each repeat",
                f"loss, first 3 batches ({a} vs {b})",
            ],
            rows,
        ),
    ]
    path = common.write_results(out, name, lines, {"info": info, "runs": runs})
    common.grouped_bars(
        out / f"{name}.png",
        {
            "diffusion (block)" if run["kind"] == "block" else "AR twin": {
                k: statistics.median(run["rates"][k]) for k in variants
            }
            for run in runs
        },
        "tokens per second of step (median)",
        f"SmolLM2 adaptation step per {what}",
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
