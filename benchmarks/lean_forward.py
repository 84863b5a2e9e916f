"""One forward pass of the shipped 5M models: transformers vs the lean forward (dg_lsp/engine/lean.py),
fp32 vs bf16, optionally under `torch.compile`.

The passes an engine runs, on a 192-token prompt: the diffusion model's canvas-only pass against the cached
context (canvas 16 / 32 / 48, the dual cache's common case) and its full pass (prompt + 48-token canvas); the
AR twin's one-token step against its cache and its prefill. Time is the thread's CPU time (best of 5 rounds
of 10 calls, 1 thread), which a busy machine disturbs far less than wall time; the ratios are the result.

    python benchmarks/lean_forward.py              # writes benchmarks/results/lean_forward.{md,png,json}
    python benchmarks/lean_forward.py --compile    # adds torch.compile (dynamic shapes) of the lean forward
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

PROMPT = 192


def passes(model, config, ids: torch.Tensor, causal: bool) -> dict[str, callable]:
    """name -> a zero-argument call running that pass on `model`."""
    from dg_lsp.engine.kv import new_cache

    ctx_cache = new_cache(config, record=False)
    model(input_ids=ids[:, :PROMPT], cache=ctx_cache)
    ctx = [(la.keys, la.values) for la in ctx_cache.layers]

    def against_context(n: int, keep: int):
        def run():
            cache = new_cache(config, record=False)
            for layer, (k, v) in zip(cache.layers, ctx, strict=True):
                layer.update(k, v)
            pos = torch.arange(PROMPT, PROMPT + n).unsqueeze(0)
            return model(
                input_ids=ids[:, PROMPT : PROMPT + n], position_ids=pos, cache=cache, logits_to_keep=keep
            )

        return run

    if causal:
        return {
            "AR step (1 token, cached prompt)": against_context(1, 1),
            f"AR prefill ({PROMPT} tokens)": lambda: model(input_ids=ids[:, :PROMPT], logits_to_keep=1),
        }
    out = {f"canvas pass ({n}, cached context)": against_context(n + 1, n) for n in (16, 32, 48)}
    out[f"full pass ({PROMPT} + 48)"] = lambda: model(input_ids=ids[:, : PROMPT + 49], logits_to_keep=48)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the lean forward")
    ap.add_argument("--out", type=Path, default=common.RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from dg_lsp.engine.lean import LeanGemma3

    models = {"diffusion (embedded)": ("embedded", False), "AR twin": ("ar_twin", True)}
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    rows, raw, compile_s = [], {}, {}
    for label, (name, causal) in models.items():
        ids = torch.randint(10, 8000, (1, PROMPT + 64), generator=torch.Generator().manual_seed(0))
        variants = {}
        for dname, dtype in dtypes.items():
            hf = AutoModelForCausalLM.from_pretrained(
                common.ROOT / "dg_lsp" / "models" / name, dtype=dtype
            ).eval()
            lean = LeanGemma3(hf)
            variants[f"transformers {dname}"] = (hf, hf.config)
            variants[f"lean {dname}"] = (lean, hf.config)
            if args.compile and dname == "bf16":
                variants["lean bf16, compiled"] = (torch.compile(lean, dynamic=True), hf.config)
        with torch.inference_mode():
            times: dict[str, dict[str, float]] = {}
            for vname, (model, config) in variants.items():
                t0 = time.perf_counter()
                calls = passes(model, config, ids, causal)
                if "compiled" in vname:
                    for fn in calls.values():
                        fn()
                    compile_s[label] = time.perf_counter() - t0
                times[vname] = {p: common.cpu_ms(fn) for p, fn in calls.items()}
                print(label, vname, times[vname], flush=True)
        raw[label] = times
        base = times["transformers fp32"]
        for p in base:
            row = [label, p] + [f"{times[v][p]:.2f}" for v in variants]
            row.append(f"{base[p] / times['lean bf16'][p]:.2f}x")
            rows.append(row)
        headers = ["model", "pass", *(f"{v} ms" for v in variants), "transformers fp32 / lean bf16"]
    lines, _ = common.header("One forward pass of the shipped 5M models: transformers vs the lean forward", 1)
    lines += [
        "CPU time of the calling thread per pass (best of 5 rounds of 10 calls, 1 torch thread); the machine "
        "may have been busy (see the conditions line): read the ratios.",
        "",
        *common.md_table(headers, rows),
        "",
    ]
    if compile_s:
        lines.append(
            "torch.compile (dynamic shapes): first calls took "
            + ", ".join(f"{k} {v:.0f} s" for k, v in compile_s.items())
            + " of wall time before the timed calls."
        )
    common.write_results(args.out, "lean_forward", lines, {"cpu_ms": raw, "compile_s": compile_s})
    plt = common.pyplot()
    fig, axes = plt.subplots(1, len(raw), figsize=(6 * len(raw), 4))
    for ax, (label, times) in zip(axes, raw.items(), strict=True):
        names = list(next(iter(times.values())))
        width = 0.8 / len(times)
        for i, (vname, per) in enumerate(times.items()):
            ax.bar([j + i * width for j in range(len(names))], [per[n] for n in names], width, label=vname)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
        ax.set_xticklabels([n.split(" (")[0] + "\n(" + n.split(" (", 1)[1] for n in names], fontsize=7)
        ax.set_ylabel("CPU ms per pass")
        ax.set_title(label)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "lean_forward.png", dpi=110)


if __name__ == "__main__":
    main()
