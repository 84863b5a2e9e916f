"""Paired typing replay in process: the same keystrokes, each model run by every variant, through
`dg_lsp.pipeline` as the server runs it.

The LSP benchmark (`lsp_latency.py`) measures what an editor sees, but each model answers a different
set of keystrokes (a slow one is cancelled more often) and a typing session holds only 20-30 model
runs: its medians move by 100+ ms between runs, too coarse for a 10-20% change in pass cost. Here
every variant completes the same cursors in turn, on the same typed text, with its own engine and
its own prompt cache (the server's per-document KV reuse: each keystroke's prompt shares its start
with the last one), so per-cursor ratios are paired. The variants' order rotates from cursor to
cursor, which spreads slow drift of the machine over all of them.

Lines of real files (`lsp_latency.REAL_FILES`, chosen by its `pick_lines`, seeded afresh for each file, so
not the LSP run's lines) are blanked and retyped; at every `--every`-th keystroke each variant completes
the cursor with the server's defaults (automatic request: the rest of the line or a block by span kind,
natural stops). The latency budget is
off (`--budget-ms 0`) unless given, so every variant decodes the same number of steps: the budget caps
steps from each engine's own pace, which would mix speed into the completions. Time is the thread's CPU
time of the `pipeline.complete` call.

    python benchmarks/typing_replay.py --model "default=dg_lsp/models/embedded_smollm2" \\
        --model "freezeFront=dg_lsp/models/embedded_smollm2" --masked 'freezeFront={"freezeFront": true}' \\
        --model "AR twin=dg_lsp/models/ar_twin_smollm2" --out benchmarks/results/embedded_smollm2/freeze_front
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import common
from lsp_latency import REAL_FILES, pick_lines


def cursors(lines_per_file: int, every: int, seed: int) -> list[tuple[str, str, int, str]]:
    """(language, text as typed so far, cursor offset, file name) at every `every`-th keystroke of each
    retyped line: the line's text up to the cursor, the rest of the line gone (as while typing it)."""
    out = []
    for lang, path in REAL_FILES:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        for n in pick_lines(text, lines_per_file, random.Random(seed), 20, 60):
            line = lines[n]
            indent = len(line) - len(line.lstrip())
            before = "\n".join(lines[:n]) + "\n"
            after = "\n" + "\n".join(lines[n + 1 :])
            for k in range(indent + 1, len(line) + 1, every):
                typed = line[:k]
                out.append((lang, before + typed + after, len(before) + k, path.name))
    return out


def summary_table(rows: dict[str, list[dict]], names: list[str], at: list[int]) -> list[str]:
    """Per variant over the cursors `at`: time, paired speed-up against the first variant, passes per
    token, suggestions shown, and completions identical to the first variant's."""
    base = names[0]
    table = []
    for name in names:
        r, b = [rows[name][i] for i in at], [rows[base][i] for i in at]
        ms = [x["ms"] for x in r] or [float("nan")]
        ratio = [y["ms"] / x["ms"] for y, x in zip(b, r, strict=True) if x["ms"] > 0] or [float("nan")]
        table.append([
            name, len(r), statistics.median(ms), common.percentile(ms, 95), statistics.mean(ms),
            statistics.median(ratio), sum(y["ms"] for y in b) / max(sum(ms), 1e-9),
            sum(x["passes"] for x in r) / max(sum(x["tokens"] for x in r), 1),
            sum(bool(x["text"]) for x in r), sum(y["text"] == x["text"] for y, x in zip(b, r, strict=True)),
        ])  # fmt: skip
    return common.md_table(
        ["variant", "cursors", "p50 ms", "p95 ms", "mean ms", f"speed-up vs {base}: median per cursor",
         f"speed-up vs {base}: total time", "passes per token", "shown", f"same text as {base}"],
        table,
    )  # fmt: skip


def load(spec: str, masked: dict, threads: int, extra: dict | None = None):
    from dg_lsp.engine.loader import load_engine
    from dg_lsp.settings import Settings

    settings, errors = Settings.merge(
        {"model": spec, "threads": threads, **({"masked": masked} if masked else {}), **(extra or {})}
    )
    if errors:
        raise SystemExit(f"bad settings for {spec}: {errors}")
    engine = load_engine(settings)
    engine.warmup()
    return engine, settings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument(
        "--masked", action="append", default=[], metavar="NAME=JSON", help="a variant's `masked` setting"
    )
    ap.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help='other settings of a variant, e.g. \'bf16={"quantization": "none"}\'',
    )
    ap.add_argument("--lines-per-file", type=int, default=3)
    ap.add_argument("--every", type=int, default=2, help="complete at every n-th keystroke")
    ap.add_argument("--budget-ms", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import dataclasses

    import torch

    from dg_lsp import context, pipeline

    masked = {}
    for item in args.masked:
        name, _, raw = item.partition("=")
        masked[name] = json.loads(raw)
    extra = {}
    for item in args.setting:
        name, _, raw = item.partition("=")
        extra[name] = json.loads(raw)
    unknown = (set(masked) | set(extra)) - {item.partition("=")[0] for item in args.model}
    if unknown:
        ap.error(f"--masked or --setting for no --model: {sorted(unknown)}")
    variants = []
    for item in args.model:
        name, _, path = item.partition("=")
        engine, settings = load(path, masked.get(name, {}), args.threads, extra.get(name))
        settings = dataclasses.replace(settings, latency_budget_ms=args.budget_ms)
        variants.append((name, engine, settings))
    torch.set_num_threads(args.threads)
    points = cursors(args.lines_per_file, args.every, args.seed)
    rows: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    t_start = time.time()
    for i, (lang, text, offset, fname) in enumerate(points):
        snapshot = context.as_snapshot(text, lang)
        turn = variants[i % len(variants) :] + variants[: i % len(variants)]
        for name, engine, settings in turn:
            t0 = time.thread_time()
            done = pipeline.complete(
                engine, snapshot, offset, settings, doc_key=f"file:///{fname}", invoked=False
            )
            ms = (time.thread_time() - t0) * 1000
            st = done.stats
            rows[name].append(
                {"ms": ms, "passes": st.forward_passes, "tokens": st.generated_tokens, "kind": done.span_kind,
                 "text": done.texts[0] if done.texts else "", "reused": st.reused_prompt_tokens}
            )  # fmt: skip
        if i % 20 == 0:
            print(f"{i}/{len(points)} cursors, {time.time() - t_start:.0f} s", flush=True)

    base = variants[0][0]
    lines, meta = common.header(
        "Paired typing replay through dg_lsp.pipeline (same keystrokes, every variant)", args.threads
    )
    files = ", ".join(p.name for _, p in REAL_FILES if p.is_file())
    budget = f"{args.budget_ms} ms" if args.budget_ms else "off"
    lines += [
        f"{len(points)} cursors: {args.lines_per_file} line(s) per file of {files} retyped, a completion "
        f"at every {args.every}th keystroke; automatic requests with the server's defaults, latency "
        f"budget {budget}, prompt cache on (per document), 1 candidate. Time: thread "
        f"CPU ms of `pipeline.complete`. Ratios are per cursor, against the first variant (`{base}`).",
        "",
    ]
    names = [name for name, _, _ in variants]
    ran = [i for i in range(len(points)) if all(rows[n][i]["passes"] > 0 for n in names)]
    lines += [
        f"**Model runs**: the {len(ran)} cursors at which every variant ran its model (at the others a "
        "variant answered from its continuation cache, the user typing into its last suggestion, or "
        "ran nothing for the span kind).",
        "",
    ]
    lines += summary_table(rows, names, ran)
    lines += ["", f"All {len(points)} cursors (continuation-cache answers included):", ""]
    lines += summary_table(rows, names, list(range(len(points))))
    lines += ["", "Model runs by span kind (p50 ms):", ""]
    kinds = sorted({rows[base][i]["kind"] for i in ran})

    def p50(name: str, kind: str) -> float:
        return statistics.median([rows[name][i]["ms"] for i in ran if rows[base][i]["kind"] == kind])

    lines += common.md_table(
        ["span kind", "cursors", *[n for n, _, _ in variants]],
        [[k, sum(rows[base][i]["kind"] == k for i in ran), *[p50(n, k) for n in names]] for k in kinds],
    )  # fmt: skip
    lines += ["", "Models:", ""]
    lines += [f"- {name}: `{engine.describe()}`" for name, engine, _ in variants]
    out = common.write_results(args.out, "typing_replay", lines, {"meta": meta, "rows": rows})
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, _, _ in variants:
        ms = sorted(x["ms"] for x in rows[name])
        ax.plot(ms, [(k + 1) / len(ms) for k in range(len(ms))], label=name)
    ax.set_xlabel("CPU ms per completion (pipeline.complete)")
    ax.set_ylabel("share of cursors")
    ax.set_title("Paired typing replay")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "typing_replay.png", dpi=120)
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
