"""What a verifying pass costs: one canvas-only pass over k canvases against a cached prompt, k = 1..6.

Self-speculative denoising (`dg_lsp/engine/speculative.py`) trades passes for wider ones: it pays off only
when a pass over k canvases costs less than the passes its kept drafts save. This measures that price
for a model, on the device and thread count given, with the shapes the engine uses at natural stops (a
cached prompt, a trimmed window of canvas positions, the log-softmax the sampler takes).

    python benchmarks/speculative_cost.py --model dg_lsp/models/embedded_smollm2 --threads 1 2 \
        --out benchmarks/results/speculative
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
import torch

from dg_lsp.engine.kv import new_cache
from dg_lsp.engine.loader import load_engine
from dg_lsp.settings import Settings


def pass_ms(model, ctx, rows: int, window: int, prompt: int, repeats: int) -> float:
    """Best-of-`repeats` wall ms of one verifying pass (cache rebuilt each time, as the engine does)."""

    def run():
        cache = new_cache(model.config, record=False)
        for layer, (k, v) in zip(cache.layers, ctx, strict=True):
            layer.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
        ids = torch.randint(100, 20000, (rows, window))
        pos = torch.arange(prompt, prompt + window)[None]
        logits = model(input_ids=ids, position_ids=pos, cache=cache).logits
        torch.log_softmax(logits.float(), dim=-1).max(dim=-1)

    run()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dg_lsp/models/embedded_smollm2")
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--windows", type=int, nargs="+", default=[12, 20])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    ap.add_argument("--prompt", type=int, default=320, help="cached prompt positions")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    results = []
    for threads in args.threads:
        engine = load_engine(Settings(model=args.model, threads=threads))
        model = engine.model
        with torch.inference_mode():
            prompt = torch.randint(100, 20000, (1, args.prompt))
            cache = model(input_ids=prompt, use_cache=True).cache
            ctx = [(layer.keys, layer.values) for layer in cache.layers]
            for window in args.windows:
                one = None
                for rows in args.rows:
                    ms = pass_ms(model, ctx, rows, window, args.prompt, args.repeats)
                    one = one or ms
                    results.append(
                        {"threads": threads, "window": window, "rows": rows, "ms": ms, "vs_one": ms / one}
                    )
                    print(f"threads {threads} window {window} rows {rows}: {ms:.1f} ms ({ms / one:.2f}x)")
    lines, meta = common.header(
        "What a verifying pass costs (self-speculative denoising)",
        extra=f"Model `{args.model}` as the engine loads it (dtype auto); a canvas-only pass against "
        f"{args.prompt} cached prompt positions, the sampler's log-softmax included; best of {args.repeats} "
        "calls, wall ms.",
    )
    lines += common.md_table(
        ["threads", "window", "canvases in the pass", "ms", "x one canvas"],
        [[r["threads"], r["window"], r["rows"], r["ms"], r["vs_one"]] for r in results],
        "rrrrr",
    )
    if args.out:
        common.write_results(args.out, "speculative_cost", lines, {**meta, "results": results})
        plt = common.pyplot()
        fig, ax = plt.subplots(figsize=(6, 4))
        for threads in args.threads:
            for window in args.windows:
                pts = [r for r in results if r["threads"] == threads and r["window"] == window]
                ax.plot(
                    [r["rows"] for r in pts],
                    [r["ms"] for r in pts],
                    marker="o",
                    label=f"{threads} thread(s), window {window}",
                )
        ax.set_xlabel("canvases verified in one pass")
        ax.set_ylabel("ms per pass")
        ax.set_title("Cost of a verifying pass")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "speculative_cost.png", dpi=110)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
