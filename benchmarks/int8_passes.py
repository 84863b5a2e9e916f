"""One forward pass of the shipped SmolLM2 models (`embedded` and its AR twin), in the dtype `auto` gives this
CPU (bf16 where it is native, else fp32), per `quantization` setting: `none` (the merged weights), `int4`
(narrow passes over the 4-bit base, dg_lsp/engine/cpu_int4.py, where the CPU has native bf16; what `auto`
gives the AR twin) and `int8` (dg_lsp/engine/cpu_int8.py).

The passes the engines run against a cached 320-token prompt (about what the server's prompt budget
gives): canvas passes of `--canvas` positions (default 1, 13 and 33: a block marker plus 0, 12 or 32 masks,
a trimmed tail, the default 12-token canvas, a multi-line one; trimmed windows are 2-10), the AR twin's
one-token step, and the cold prompt pass (prompt + 13-position block). Time is the thread's CPU time (best
of 5 rounds of 10 calls, 1 torch thread), loaded through the engines as a user's settings load them.

    python benchmarks/int8_passes.py --out benchmarks/results/embedded_smollm2/int8/passes
    python benchmarks/int8_passes.py --quantization none --quantization int4 --quantization int8 \
        --canvas 1,2,4,6,8,13,33 --out benchmarks/results/embedded_smollm2/int4_base/passes
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
import torch

PROMPT = 320


def _passes(engine, block: int | None, canvas: tuple[int, ...] = (1, 13, 33)) -> dict[str, callable]:
    from dg_lsp.engine.kv import new_cache

    model = engine.model
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (1, PROMPT), generator=gen)
    cache = new_cache(model.config, record=False)
    model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)

    def against_prompt(ids: torch.Tensor):
        pos = torch.arange(PROMPT, PROMPT + ids.shape[1]).unsqueeze(0)

        def run():
            model(input_ids=ids, position_ids=pos, cache=cache, logits_to_keep=ids.shape[1])
            cache.crop(-ids.shape[1])

        return run

    if block is None:
        out = {"AR step (1 token)": against_prompt(prompt[:, :1])}
        out[f"prompt pass ({PROMPT})"] = lambda: model(input_ids=prompt, logits_to_keep=1)
        return out

    def opened(n: int) -> torch.Tensor:  # a block marker and n - 1 masks
        ids = torch.full((1, n), engine.mask_id)
        ids[0, 0] = block
        return ids

    out = {f"canvas pass ({n})": against_prompt(opened(n)) for n in canvas}
    full = torch.cat([prompt, opened(13)], dim=1)
    out[f"prompt pass ({PROMPT} + 13)"] = lambda: model(input_ids=full, logits_to_keep=13)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=common.RESULTS / "embedded_smollm2" / "int8" / "passes")
    ap.add_argument(
        "--quantization", action="append", help="settings to compare, the first the baseline (none, int8)"
    )
    ap.add_argument("--canvas", default="1,13,33", help="canvas pass widths (block marker included)")
    args = ap.parse_args(argv)
    quants = args.quantization or ["none", "int8"]
    canvas = tuple(int(n) for n in args.canvas.split(","))
    torch.set_num_threads(1)
    from dg_lsp.engine.ar import AutoregressiveEngine
    from dg_lsp.engine.masked import MaskedDiffusionEngine

    models = common.ROOT / "dg_lsp" / "models"
    rows, raw = [], {}
    for label, cls, name in (
        ("diffusion (embedded)", MaskedDiffusionEngine, "embedded_smollm2"),
        ("AR twin", AutoregressiveEngine, "ar_twin_smollm2"),
    ):
        times: dict[str, dict[str, float]] = {}
        forwards, dtype = {}, None
        for quant in quants:
            engine = cls(models / name, quantization=quant)
            forwards[quant] = engine.describe().get("forward", "")
            dtype = dtype or ("fp32" if engine.model.dtype == torch.float32 else "bf16")
            with torch.inference_mode():
                calls = _passes(engine, getattr(engine.model, "block_id", None), canvas)
                times[quant] = {p: common.cpu_ms(fn) for p, fn in calls.items()}
            print(label, quant, forwards[quant], times[quant], flush=True)
            del engine
        raw[label] = {"cpu_ms": times, "forward": forwards, "dtype": dtype}
        for p in times[quants[0]]:
            base_ms = times[quants[0]][p]
            cells = [f"{times[q][p]:.1f}" for q in quants]
            ratios = [f"{base_ms / times[q][p]:.2f}x" for q in quants[1:]]
            rows.append([label, p, *cells, *ratios])
    base = next(iter(raw.values()))["dtype"]
    names = [f"`{q}` ms" for q in quants]
    title = f"One forward pass of the shipped SmolLM2 models ({base}) per quantization setting"
    lines, _ = common.header(title, 1)
    lines += [
        "CPU time of the calling thread per pass (best of 5 rounds of 10 calls, 1 torch thread), against a "
        f"cached {PROMPT}-token prompt; the models run in {base} on this CPU.",
        "",
        *common.md_table(["model", "pass", *names, *(f"`{quants[0]}` / `{q}`" for q in quants[1:])], rows),
        "",
        "Forwards: "
        + "; ".join(f"{m} {q}: `{f}`" for m, r in raw.items() for q, f in r["forward"].items())
        + ".",
    ]
    common.write_results(args.out, "int8_passes", lines, raw)
    groups = {
        f"{m.split(' ')[0]}\n{p}": {q: r["cpu_ms"][q][p] for q in quants}
        for m, r in raw.items()
        for p in r["cpu_ms"][quants[0]]
    }
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(max(9, 0.7 * len(groups)), 3.8))
    labels = list(groups)
    width = 0.8 / len(quants)
    for j, variant in enumerate(quants):
        heights = [groups[n][variant] for n in labels]
        ax.bar([i + j * width for i in range(len(labels))], heights, width, label=variant)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=7)
    ax.set_ylabel("CPU ms per pass")
    ax.set_title("SmolLM2 models, one pass, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "int8_passes.png", dpi=110)


if __name__ == "__main__":
    main()
