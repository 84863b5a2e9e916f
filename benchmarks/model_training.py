"""Training record of the embedded diffusion model and its AR twin, from their run directories.

    python benchmarks/model_training.py runs/diffusion-cpu-2h runs/ar-cpu-2h

Writes benchmarks/results/model_training.md (steps, tokens, wall time, held-out losses) and
model_training.png (both runs' loss curves, drawn by the trainer's own plot function).
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    from PIL import Image

    rows, images = [], []
    for run in args.runs:
        cfg = json.loads((run / "config.json").read_text())
        hist = _history(run)
        train = [h for h in hist if "tokens" in h]
        valid = [h for h in hist if "valid_loss" in h]
        best = min(valid, key=lambda h: h["valid_loss"])
        png = args.out / f"model_training_{cfg['kind']}.png"
        plot_history(hist, png, f"{cfg['kind']} ({run.name})")
        images.append(png)
        rows.append(
            f"| {cfg['kind']} | `{run}` | {train[-1]['step']} | {cfg['batch_size']} | "
            f"{train[-1]['tokens'] / 1e6:.2f}M | {train[-1]['time'] / 60:.1f} | {best['step']} | "
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
            "# Training record: embedded diffusion model and AR twin",
            "",
            f"Command: `python {' '.join(sys.argv)}`",
            "",
            f"Date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; machine: {platform.machine()}, "
            f"{os.cpu_count()} CPU cores shared with other jobs, 1 torch thread per run, runs concurrent; "
            f"torch {torch.__version__}.",
            "",
            "| kind | run | steps | batch | tokens | minutes | best step | held-out loss | held-out AR loss "
            "| final held-out loss |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Held-out loss: diffusion = canvas cross-entropy (middle + EOS padding), t on a fixed grid and "
            "no self-conditioning; AR = cross-entropy on middle + EOS tokens. The AR column is the encoder's "
            "(diffusion) or the whole PSM sequence's (AR) next-token loss. Both on the same 64 held-out "
            "examples. Tokens = prompt + canvas tokens (identical example stream for both runs).",
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
