"""Masked sampler settings side by side, through the editor pipeline, on the shipped diffusion model.

Which of the sampler's options helps the model that ships? Each setting is one run of
`model_quality.py --through editor --masked ...` on the same tasks (the defaults are the baseline);
this script collects their summaries into one table and one plot. Defaults change only on evidence
from here.

    python benchmarks/sampler_sweep.py      # writes benchmarks/results/sampler_sweep.{md,png,json}
    python benchmarks/sampler_sweep.py --setting margin='confidence="margin"' --setting ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

SETTINGS = {
    "default": [],
    "blockLength=8": ["blockLength=8"],
    "blockLength=16": ["blockLength=16"],
    "confidence=margin": ['confidence="margin"'],
    "confidence=entropy": ['confidence="entropy"'],
    "threshold=0.8": ["threshold=0.8"],
}
METRICS = ("pass@1", "line_exact", "nonempty_parsing", "shown", "parsing_when_shown", "edit_similarity",
           "balanced_brackets", "context_identifiers", "mean_forward_passes", "passes_per_token",
           "p50_ms")  # fmt: skip
PLAIN = ("mean_forward_passes", "passes_per_token", "p50_ms")
"""Metrics reported as they are; the others are shares, shown as percentages."""


def run_setting(name: str, options: list[str], args: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve().parent / "model_quality.py"),
        "--model", f"diffusion={args.model}",
        "--workers", "1",
        "--through", "editor",
        "--spans", str(args.spans),
        "--single-every", str(args.single_every),
        "--multi-every", str(args.multi_every),
        "--light-every", str(args.light_every),
        "--steps", str(args.steps),
        "--max-tokens", str(args.max_tokens),
        "--out", str(out / name.replace("=", "_")),
    ]  # fmt: skip
    for option in options:
        cmd += ["--masked", option]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: model_quality.py failed\n{done.stderr[-2000:]}")
    data = json.loads((out / name.replace("=", "_") / "model_quality.json").read_text())
    return data["diffusion"]["summary"]["suites"]


def _plot(results: dict[str, dict], path: Path) -> None:
    plt = common.pyplot()
    suites = list(next(iter(results.values())))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    width = 0.8 / len(results)
    for ax, metric in zip(axes, ("nonempty_parsing", "edit_similarity"), strict=True):
        for i, (name, suites_of) in enumerate(results.items()):
            vals = [suites_of[s][metric] for s in suites]
            ax.bar([j + i * width for j in range(len(suites))], vals, width, label=name)
        ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(suites))], suites, fontsize=8)
        ax.set_title(metric.replace("_", " "))
    axes[0].legend(fontsize=7)
    fig.suptitle("Masked sampler settings through the editor pipeline (shipped diffusion model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(common.ROOT / "dg_lsp/models/embedded_tiny"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--setting",
        action="append",
        metavar="NAME=OPTION[,OPTION]",
        help="a setting to compare (repeatable), e.g. margin='confidence=\"margin\"'; default: a fixed set",
    )
    ap.add_argument("--spans", type=int, default=100)
    ap.add_argument("--single-every", type=int, default=10)
    ap.add_argument("--multi-every", type=int, default=80)
    ap.add_argument("--light-every", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=2, help="settings run at once, 1 thread each")
    ap.add_argument("--out", type=Path, default=common.RESULTS)
    args = ap.parse_args(argv)
    settings = SETTINGS
    if args.setting:
        settings = {"default": []}
        for spec in args.setting:
            name, _, options = spec.partition("=")
            settings[name] = [o for o in options.split(",") if o]

    lines, meta = common.header(
        "Masked sampler settings through the editor pipeline",
        threads=1,
        extra=(
            f"Model: `{args.model}`. Each setting is one run of `model_quality.py --through editor` "
            f"(1 thread, {args.parallel} settings at a time) on the same tasks: {args.spans} held-out spans, "
            f"HumanEval-infilling single-line every {args.single_every}th task, multi-line every "
            f"{args.multi_every}th, random-span-light every {args.light_every}th; at most {args.steps} "
            "denoising steps, seed 0, one candidate. `default` is the sampler as it ships for this model "
            "(whole canvas at once, max-probability confidence, threshold 0.9 plus the step quota, under the "
            "model's own `dg_lsp_sampler` in config.json where it has one). Metrics as in "
            "model_quality.md; percentages except mean_forward_passes."
        ),
    )
    with tempfile.TemporaryDirectory(prefix="dg-sweep-") as tmp:
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            futures = {
                name: pool.submit(run_setting, name, options, args, Path(tmp))
                for name, options in settings.items()
            }
            results = {name: f.result() for name, f in futures.items()}
    rows = []
    for suite, first in next(iter(results.values())).items():
        for metric in METRICS:
            if metric not in first:
                continue
            scale = 1 if metric in PLAIN else 100
            vals = [r[suite].get(metric, float("nan")) * scale for r in results.values()]
            rows.append([f"{suite} ({first['tasks']})", metric, *vals])
    lines += common.md_table(["suite (tasks)", "metric", *results], rows, "ll" + "r" * len(results))
    lines += ["", "![sampler sweep](sampler_sweep.png)", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    _plot(results, args.out / "sampler_sweep.png")
    path = common.write_results(
        args.out, "sampler_sweep", lines, {"meta": meta, "settings": settings, "results": results}
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
