"""Training record of the embedded model and its AR twin (and earlier candidates), from their run directories.

    python benchmarks/model_training.py runs/recipe-2h runs/dream-from-ar runs/ar-gemma3-cpu \
        --note "how the runs shared the machine"

Writes benchmarks/results/model_training.md (steps, tokens, threads, wall time, held-out losses) and
model_training.png (every run's loss curves, drawn by the trainer's own plot function). Held-out figures
of a masked run's causal phase are left out of "best": they measure another objective.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

import torch

from dg_lsp.training.train import plot_history

RESULTS = Path(__file__).resolve().parent / "results"


def _history(run: Path) -> list[dict]:
    state = torch.load(run / "checkpoint.pt", weights_only=False, map_location="cpu")
    return state["history"]


def _recipe(cfg: dict, hist: list[dict]) -> str:
    kind = cfg["kind"]
    if cfg.get("causal_fraction"):
        switch = next((h["step"] for h in hist if "phase_switch" in h), None)
        return f"{kind}: causal to step {switch}, then masked (one run)"
    init = next((h for h in hist if "init_from" in h), None)
    if init:
        return f"{kind}: from `{init['init_from']}` ({init['init_kind']}) at step {init['step']}"
    return kind + (" (shifted logits)" if cfg.get("logits_shift") else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--note", default="", help="how the runs were run (alone, side by side...)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    from PIL import Image

    rows, images = [], []
    for run in args.runs:
        cfg = json.loads((run / "config.json").read_text())
        hist = _history(run)
        train = [h for h in hist if "loss" in h]
        valid = [h for h in hist if "valid_loss" in h and h.get("phase") != "causal"]
        best = min(valid, key=lambda h: h["valid_loss"])
        png = args.out / f"model_training_{run.name}.png"
        plot_history(hist, png, f"{cfg['kind']} ({run.name})")
        images.append(png)
        rows.append(
            f"| {_recipe(cfg, hist)} | `{run}` | {train[-1]['step']} | {cfg['batch_size']} | "
            f"{train[-1]['tokens'] / 1e6:.2f}M | {cfg['threads']} | {train[-1]['time'] / 60:.1f} | "
            f"{best['step']} | "
            f"{best['valid_loss']:.4f} | {best['valid_ar_loss']:.4f} | {valid[-1]['valid_loss']:.4f} |"
        )
    pics = [Image.open(p) for p in images]
    sheet = Image.new("RGB", (sum(p.width for p in pics), max(p.height for p in pics)), "white")
    x = 0
    for p in pics:
        sheet.paste(p, (x, 0))
        x += p.width
    sheet.save(args.out / "model_training.png")
    text = "\n".join(
        [
            "# Training record: the embedded model, its AR twin and earlier candidates",
            "",
            f"Command: `python {' '.join(sys.argv)}`",
            "",
            f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; machine: {platform.machine()}, "
            f"{os.cpu_count()} CPU cores; torch {torch.__version__}. {args.note}",
            "",
            "| recipe | run | steps | batch | tokens | threads | minutes | best step | held-out loss "
            "| held-out AR loss | final held-out loss |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Held-out loss: diffusion and masked = canvas cross-entropy (middle + EOS padding), t on a fixed "
            "grid, no self-conditioning; AR = cross-entropy on middle + EOS tokens. The AR column is the "
            "encoder's next-token loss (diffusion), the context CE with everything masked at t (masked), or "
            "the whole PSM sequence's next-token loss (AR). All on the same 64 held-out examples. Tokens = "
            "prompt + canvas tokens; runs with the same batch see the identical example stream. Minutes = "
            "the training loop's clock (a run started `--init-from` another includes that run's time).",
            "",
            "![loss curves](model_training.png)",
            "",
        ]
    )
    (args.out / "model_training.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
