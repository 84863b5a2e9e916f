"""Side by side in one run: the embedded diffusion model, its AR twin, and SmolLM2-135M on llama.cpp.

Speed: the same prompt sites, span lengths 8/16/32/64/128 tokens, every model forced to produce the
full span (stop tokens disabled) so that the work is the same; a fresh cache per request (dg-lsp's
prompt and continuation caches off, llama.cpp's KV reset); the same number of threads for each.
Quality: the same tasks for every model through `model_quality`'s helpers (HumanEval-infilling
pass@1, held-out exact match / edit similarity), plus the share of completions that keep the file
parsing (tree-sitter, over the tasks whose reference file parses without errors).
SmolLM2 is not a fill-in-the-middle model: it sees only the prefix, never the suffix.

    python benchmarks/side_by_side.py            # writes benchmarks/results/side_by_side.{md,png,json}
    python benchmarks/side_by_side.py --smoke    # tiny random models, seconds, for CI
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import common
import model_quality as mq
import peers

PEER = "peer"
DIFFUSION = ("diffusion-gemma", "masked")


@dataclass
class Contender:
    """One column of the comparison: a dg-lsp engine (with its sampler setting) or the llama.cpp peer."""

    label: str
    kind: str  # a dg-lsp backend ("diffusion-gemma", "masked", "ar") or PEER
    path: str
    steps: int = 0
    note: str = ""


@dataclass
class SpeedRow:
    model: str
    span: int
    site: int
    ms: float
    cpu_ms: float
    generated_tokens: int
    forward_passes: int


# -- speed ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def forced_length(engine):
    """Disable the engine's stop tokens so it fills the whole span: equal work for every model."""
    saved = {a: getattr(engine, a) for a in ("eos_ids", "stop_ids") if hasattr(engine, a)}
    for attr in saved:
        setattr(engine, attr, set())
    try:
        yield engine
    finally:
        for attr, value in saved.items():
            setattr(engine, attr, value)


def load(c: Contender, prompt_tokens: int, threads: int):
    import torch

    if c.kind == PEER:
        return peers.LlamaCppPeer(Path(c.path), threads=threads)
    engine = mq._load_engine(c.kind, c.path, prompt_tokens, c.steps or 16)
    torch.set_num_threads(threads)
    return engine


def time_span(
    c: Contender, engine, task: mq.Task, span: int, prompt_tokens: int
) -> tuple[float, float, int, int]:
    """(wall ms, CPU ms of this process, generated tokens, forward passes) for one forced-length span."""
    c0 = time.process_time()
    if c.kind == PEER:
        r = engine.generate(task.prefix, span, prompt_tokens, stop_at_eos=False)
        cpu = (time.process_time() - c0) * 1000
        return r.total_ms, cpu, r.generated_tokens, r.generated_tokens  # prefill + one per token after it
    from dg_lsp.engine.types import InfillRequest

    request = InfillRequest(task.prefix, task.suffix, max_tokens=span, seed=0)
    with forced_length(engine):
        t0 = time.perf_counter()
        result = engine.infill(request)
        ms = (time.perf_counter() - t0) * 1000
    cpu = (time.process_time() - c0) * 1000
    return ms, cpu, result.stats.generated_tokens, result.stats.forward_passes


def measure_speed(
    contenders: list[Contender], sites: list[mq.Task], spans: tuple[int, ...], prompt_tokens: int,
    threads: int, repeats: int,
) -> list[SpeedRow]:  # fmt: skip
    """Interleaved by repeat so that a change in CPU load hits every model alike."""
    engines = {c.label: load(c, prompt_tokens, threads) for c in contenders}
    for c in contenders:  # warm-up: first-call costs (allocations, kernels) are not per-span costs
        time_span(c, engines[c.label], sites[0], spans[0], prompt_tokens)
    rows = []
    for _ in range(repeats):
        for span in spans:
            for i, task in enumerate(sites):
                for c in contenders:
                    ms, cpu, gen, passes = time_span(c, engines[c.label], task, span, prompt_tokens)
                    rows.append(SpeedRow(c.label, span, i, ms, cpu, gen, passes))
    return rows


# -- quality ----------------------------------------------------------------------------------------


def peer_outcomes(c: Contender, tasks: list[mq.Task], opts: dict, threads: int) -> list[mq.Outcome]:
    from rapidfuzz.distance import Levenshtein

    peer = peers.LlamaCppPeer(Path(c.path), threads=threads)
    out = []
    for task in tasks:
        single = task.suite == "single-line"

        def reached_cut(text: str, suffix: str = task.suffix, single: bool = single) -> bool:
            return peers.cut_continuation(text, suffix, single) != text

        r = peer.generate(task.prefix, opts["max_tokens"], opts["prompt_tokens"], stop=reached_cut)
        text = peers.cut_continuation(r.text, task.suffix, single_line=single)
        passed = None
        if task.test:
            program = f"{task.prefix}{text}{task.suffix}\n\n{task.test}\n\ncheck({task.entry_point})\n"
            passed = mq.run_program(program)
        out.append(
            mq.Outcome(task.suite, task.task_id, text, text == task.middle,
                       Levenshtein.normalized_similarity(text, task.middle), passed, r.total_ms,
                       r.generated_tokens + 1)
        )  # fmt: skip
    return out


def summarise_quality(tasks: list[mq.Task], outcomes: list[mq.Outcome], languages: dict[str, str]) -> dict:
    by_id = {t.task_id: t for t in tasks}
    kept = {
        o.task_id: mq.keeps_parsing(by_id[o.task_id], o.completion, languages[o.task_id]) for o in outcomes
    }
    names = {o.task_id: mq.context_identifiers(o.completion, by_id[o.task_id].prefix, by_id[o.task_id].suffix)
             for o in outcomes}  # fmt: skip

    def from_context(rows) -> float:
        return sum(names[o.task_id][0] for o in rows) / max(1, sum(names[o.task_id][1] for o in rows))

    suites: dict[str, dict[str, float]] = {}
    for suite in dict.fromkeys(o.suite for o in outcomes):
        rows = [o for o in outcomes if o.suite == suite]
        s: dict[str, float] = {
            "tasks": len(rows),
            "exact_match": sum(o.exact for o in rows) / len(rows),
            "edit_similarity": sum(o.edit_sim for o in rows) / len(rows),
            "nonempty": sum(bool(o.completion.strip()) for o in rows) / len(rows),
            "keeps_parsing": sum(kept[o.task_id] for o in rows) / len(rows),
            "context_identifiers": from_context(rows),
            "mean_ms": statistics.fmean(o.ms for o in rows),
            "mean_forward_passes": statistics.fmean(o.forward_passes for o in rows),
        }
        if rows[0].passed is not None:
            s["pass@1"] = sum(bool(o.passed) for o in rows) / len(rows)
        suites[suite] = s
    suites["all"] = {
        "tasks": len(outcomes),
        "edit_similarity": statistics.fmean(o.edit_sim for o in outcomes),
        "nonempty": sum(bool(o.completion.strip()) for o in outcomes) / len(outcomes),
        "keeps_parsing": sum(kept.values()) / len(outcomes),
        "nonempty_keeps_parsing": sum(kept[o.task_id] and bool(o.completion.strip()) for o in outcomes)
        / len(outcomes),
        "context_identifiers": from_context(outcomes),
        "mean_ms": statistics.fmean(o.ms for o in outcomes),
    }
    return suites


def contender_outcomes(c: Contender, tasks: list[mq.Task], opts: dict, threads: int) -> list[mq.Outcome]:
    import torch

    if c.kind == PEER:
        return peer_outcomes(c, tasks, opts, threads)
    torch.set_num_threads(threads)
    _, outcomes = mq.evaluate_model(c.kind, c.path, tasks, {**opts, "steps": c.steps or opts["steps"]})
    return outcomes


def measure_quality(
    contenders: list[Contender], tasks: list[mq.Task], opts: dict, threads: int, jobs: int
) -> dict:
    """Quality does not depend on timing, so contenders may run in parallel processes (spawned: no
    fork after torch's thread pools exist)."""
    import multiprocessing

    languages = {t.task_id: mq.task_language(t) for t in tasks}
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(contender_outcomes, c, tasks, opts, threads) for c in contenders]
            all_outcomes = [f.result() for f in futures]
    else:
        all_outcomes = [contender_outcomes(c, tasks, opts, threads) for c in contenders]
    return {
        c.label: {"suites": summarise_quality(tasks, outcomes, languages),
                  "outcomes": [asdict(o) for o in outcomes]}
        for c, outcomes in zip(contenders, all_outcomes, strict=True)
    }  # fmt: skip


# -- report -----------------------------------------------------------------------------------------


def speed_table(
    rows: list[SpeedRow], contenders: list[Contender], spans: tuple[int, ...]
) -> tuple[list[str], dict]:
    summary: dict[str, dict[int, dict[str, float]]] = {}
    table = []
    for c in contenders:
        for span in spans:
            mine = [r for r in rows if r.model == c.label and r.span == span]
            if not mine:
                continue
            ms = statistics.median(r.ms for r in mine)
            cpu = statistics.median(r.cpu_ms for r in mine)
            gen = statistics.fmean(r.generated_tokens for r in mine)
            passes = statistics.fmean(r.forward_passes for r in mine)
            s = {"median_ms": ms, "median_cpu_ms": cpu, "tokens": gen, "forward_passes": passes,
                 "tokens_per_s": 1000 * gen / ms, "passes_per_token": passes / gen if gen else float("nan"),
                 "n": len(mine)}  # fmt: skip
            summary.setdefault(c.label, {})[span] = s
            table.append(
                [c.label, span, len(mine), ms, cpu, gen, passes, s["passes_per_token"], s["tokens_per_s"]]
            )
    lines = common.md_table(
        ["model", "span (tokens)", "n", "median wall ms / span", "median CPU ms / span", "tokens",
         "forward passes", "passes / token", "tokens / s (wall)"], table, "lrrrrrrrr",
    )  # fmt: skip
    base = contenders[0].label
    ratio_rows = []
    for c in contenders[1:]:
        for key, kind in (("median_ms", "wall"), ("median_cpu_ms", "CPU")):
            ratio_rows.append([f"{c.label} / {base} ({kind})"] + [
                summary[c.label][s][key] / summary[base][s][key]
                if s in summary.get(c.label, {}) and s in summary.get(base, {}) else float("nan")
                for s in spans
            ])  # fmt: skip
    if ratio_rows:
        lines += [
            "",
            "Time ratio per span, same run and load (> 1: slower than the first model). CPU time is this "
            "process's, all threads, so it is less sensitive to other jobs on the machine than wall time:",
            "",
        ]
        lines += common.md_table(["ratio", *[str(s) for s in spans]], ratio_rows)
    return lines, summary


def quality_table(quality: dict) -> list[str]:
    labels = list(quality)
    suites = [s for s in next(iter(quality.values()))["suites"] if s != "all"]
    rows = []
    for suite in suites:
        n = quality[labels[0]]["suites"][suite]["tasks"]
        for metric in (
            "pass@1",
            "exact_match",
            "edit_similarity",
            "nonempty",
            "keeps_parsing",
            "context_identifiers",
            "mean_ms",
        ):
            if metric not in quality[labels[0]]["suites"][suite]:
                continue
            vals = []
            for label in labels:
                v = quality[label]["suites"][suite].get(metric, float("nan"))
                vals.append(f"{v:.0f}" if metric == "mean_ms" else ("n/a" if v != v else f"{100 * v:.1f}%"))
            rows.append([suite, n, metric, *vals])
    for metric in (
        "edit_similarity",
        "nonempty",
        "keeps_parsing",
        "nonempty_keeps_parsing",
        "context_identifiers",
    ):
        overall = [f"{100 * quality[lb]['suites']['all'][metric]:.1f}%" for lb in labels]
        rows.append(["all", quality[labels[0]]["suites"]["all"]["tasks"], metric, *overall])
    return common.md_table(["suite", "tasks", "metric", *labels], rows, "lrl" + "r" * len(labels))


def mean_score(suites: dict) -> float:
    """One graded number per model: mean edit similarity over all tasks (pass@1 is ~0 for tiny models)."""
    return suites["all"]["edit_similarity"]


def matched_quality(quality: dict, summary: dict, contenders: list[Contender]) -> list[str]:
    """Quality next to speed, and the diffusion setting closest in quality to the AR twin."""
    rows = []
    for c in contenders:
        per = summary.get(c.label, {})
        rows.append(
            [c.label, f"{100 * mean_score(quality[c.label]['suites']):.1f}%"]
            + [per[n]["median_cpu_ms"] if n in per else float("nan") for n in (32, 128)]
        )
    lines = common.md_table(
        ["model", "mean score", "CPU ms / 32-token span", "CPU ms / 128-token span"], rows
    )
    ar = next((c for c in contenders if c.kind == "ar"), None)
    diff = [c for c in contenders if c.kind in DIFFUSION]
    if ar and diff:
        target = mean_score(quality[ar.label]["suites"])
        best = min(diff, key=lambda c: abs(mean_score(quality[c.label]["suites"]) - target))
        ratios = [
            summary[ar.label][n]["median_cpu_ms"] / summary[best.label][n]["median_cpu_ms"]
            for n in (32, 128)
            if n in summary.get(ar.label, {}) and n in summary.get(best.label, {})
        ]
        lines += [
            "",
            "Mean score = mean edit similarity to the reference over all tasks. Closest "
            f"diffusion setting to the AR twin's {100 * target:.1f}%: {best.label} "
            f"({100 * mean_score(quality[best.label]['suites']):.1f}%)"
            + (
                f"; there the AR twin takes {' / '.join(f'{r:.2f}x' for r in ratios)} the diffusion "
                "model's CPU time for 32 / 128-token spans."
                if ratios
                else "."
            ),
        ]
    return lines


def plot(summary: dict, quality: dict | None, spans: tuple[int, ...], path: Path) -> None:
    plt = common.pyplot()
    ncols = 2 if quality else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.2), squeeze=False)
    ax = axes[0][0]
    for label, per_span in summary.items():
        xs = [s for s in spans if s in per_span]
        ax.plot(xs, [per_span[s]["median_ms"] for s in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(spans), [str(s) for s in spans])
    ax.set_xlabel("span length (tokens, forced)")
    ax.set_ylabel("median ms per span")
    ax.set_title("Time per span, same machine, same run")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    if quality:
        ax = axes[0][1]
        labels = list(quality)
        first = quality[labels[0]]["suites"]
        metrics = [
            (s, m) for s in first for m in ("pass@1", "edit_similarity") if s != "all" and m in first[s]
        ]
        metrics += [("all", "keeps_parsing"), ("all", "nonempty_keeps_parsing")]
        width = 0.8 / len(labels)
        for i, label in enumerate(labels):
            vals = [quality[label]["suites"][s].get(m, 0.0) for s, m in metrics]
            ax.bar([j + i * width for j in range(len(metrics))], vals, width, label=label)
        ax.set_xticks([j + width * (len(labels) - 1) / 2 for j in range(len(metrics))])
        short = {
            "edit_similarity": "edit sim.",
            "keeps_parsing": "keeps parsing",
            "nonempty_keeps_parsing": "non-empty + parsing",
            "random-span-light": "random-span",
        }
        ax.set_xticklabels(
            [f"{short.get(s, s)}: {short.get(m, m)}" for s, m in metrics], fontsize=7, rotation=35, ha="right"
        )
        ax.set_ylim(0, 1)
        ax.set_title("Quality on the same tasks")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def contenders_for(args, tmp: Path) -> tuple[list[Contender], list[str]]:
    notes = []
    if args.smoke:
        specs = common.tiny_models(tmp)
    else:
        specs = common.default_models(args.diffusion, args.ar)
    out = []
    for spec in specs:
        if spec.backend in DIFFUSION:
            for steps in args.diffusion_steps:
                out.append(Contender(f"{spec.label}, {steps} steps", spec.backend, str(spec.path), steps))
        else:
            out.append(Contender(spec.label, "ar", str(spec.path)))
    why = peers.available()
    if why is None and not args.no_peer:
        out.append(Contender(peers.LABEL, PEER, str(peers.smollm2_gguf()), note="prefix only, no suffix"))
    elif why:
        notes.append(f"{peers.LABEL} not measured: {why}.")
    return out, notes


def _shown(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(common.ROOT)) if p.is_relative_to(common.ROOT) else p.name


def _described(c: Contender) -> str:
    bits = [f"`{_shown(c.path)}`", common.model_identity(Path(c.path)), c.note]
    return ", ".join(b for b in bits if b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random models, a handful of tasks (CI)")
    ap.add_argument("--diffusion", help="diffusion checkpoint dir (default: embedded, else runs/*/best)")
    ap.add_argument("--ar", help="AR twin checkpoint dir (default: dg_lsp/models/ar_twin, else runs/*/best)")
    ap.add_argument("--diffusion-steps", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16])
    ap.add_argument("--no-peer", action="store_true", help="leave out SmolLM2 on llama.cpp")
    ap.add_argument("--threads", type=int, default=1, help="threads per model (the same for every model)")
    ap.add_argument("--sites", type=int, default=4, help="prompt sites per span length")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--spans", type=int, default=30, help="held-out spans for quality")
    ap.add_argument("--single-every", type=int, default=40)
    ap.add_argument("--multi-every", type=int, default=300)
    ap.add_argument("--light-every", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16, help="default denoising steps")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="processes for the quality part (not timed)")
    ap.add_argument("--corpus", type=Path, default=common.ROOT / "data/corpus")
    ap.add_argument("--out", type=Path, default=common.RESULTS)
    ap.add_argument("--replot", action="store_true", help="redraw the PNG from the results JSON only")
    args = ap.parse_args(argv)
    spans = common.SPAN_LENGTHS
    if args.replot:
        raw = json.loads((args.out / "side_by_side.json").read_text())
        summary = {k: {int(n): v for n, v in per.items()} for k, per in raw["speed_summary"].items()}
        plot(summary, raw["quality"], spans, args.out / "side_by_side.png")
        return 0
    if args.smoke:
        spans = (8, 32)
        args.sites, args.repeats, args.spans, args.diffusion_steps = 1, 1, 0, [4]
        args.single_every, args.multi_every, args.light_every = 400, 0, 0
        args.max_tokens, args.jobs = 16, 1

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dg-bench-") as tmp:
        contenders, notes = contenders_for(args, Path(tmp))
        if not any(c.kind != PEER for c in contenders):
            print("no dg-lsp model found: train one (dg_lsp/training/README.md) or pass --diffusion/--ar")
            return 2
        sites = mq.humaneval_tasks("single-line", 97)[: args.sites]
        lines, meta = common.header(
            "Side by side: diffusion vs AR twin vs SmolLM2 on llama.cpp", args.threads
        )
        print(f"speed: {len(contenders)} models x {len(spans)} spans x {len(sites)} sites x {args.repeats}")
        rows = measure_speed(contenders, sites, spans, args.prompt_tokens, args.threads, args.repeats)
        speed_lines, speed_summary = speed_table(rows, contenders, spans)
        quality = None
        if not args.skip_quality:
            tasks: list[mq.Task] = []
            if args.spans > 0 and (args.corpus / "valid.jsonl").exists():
                dg = next(c for c in contenders if c.kind != PEER)
                tasks += mq.held_out_tasks(args.corpus, Path(dg.path), args.spans, args.prompt_tokens, 32)
            elif args.spans > 0:
                notes.append(f"no held-out corpus at {args.corpus}: held-out spans skipped.")
            for suite, every in (("single-line", args.single_every), ("multi-line", args.multi_every),
                                 ("random-span-light", args.light_every)):  # fmt: skip
                if every > 0:
                    tasks += mq.humaneval_tasks(suite, every)
            print(f"quality: {len(contenders)} models x {len(tasks)} tasks")
            quality = measure_quality(
                contenders, tasks, {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                                    "steps": args.steps}, args.threads, args.jobs,
            )  # fmt: skip
        wall = time.perf_counter() - start

    lines += [
        "Models: " + "; ".join(f"{c.label} ({_described(c)})" for c in contenders) + ".",
        "",
        f"Prompt budget {args.prompt_tokens} tokens for every model (dg-lsp: prefix + suffix, at most a "
        f"quarter suffix; SmolLM2: the last {args.prompt_tokens} prefix tokens). Greedy decoding for the "
        f"AR models, seed 0 for diffusion. Wall time of the whole run: {wall / 60:.1f} min.",
        "",
        *(f"Note: {n}" for n in notes),
        "",
        "## Speed: time per span",
        "",
        f"{len(sites)} prompt sites (HumanEval single-line prompts) x {args.repeats} repeats per span "
        "length, interleaved across models; stop tokens disabled so every model generates exactly the span; "
        "fresh caches per request. Forward passes as the engines count them: diffusion = denoising passes "
        "(DiffusionGemma's one encoder pass per canvas not included), AR = prefill + one per further token. "
        "A DiffusionGemma canvas is 32 tokens, so shorter spans pay for a whole canvas; a masked model's "
        "canvas is the span rounded up to its buckets (8/16/32/64/128).",
        "",
        *speed_lines,
        "",
    ]
    if quality:
        lines += [
            "## Quality on the same tasks",
            "",
            f"Max {args.max_tokens} new tokens, natural stop (EOS; SmolLM2: first newline for single-line, "
            "else where it starts repeating the suffix or a new top-level statement; it stops generating "
            "there). keeps_parsing: share of completions after which prefix + completion + suffix has no "
            "more tree-sitter ERROR/MISSING nodes than with the reference middle (held-out windows are cut "
            "out of files and need not parse on their own). An empty completion often keeps the file "
            "parsing: read it with nonempty (share of completions with non-blank text) and, in the 'all' "
            "rows, nonempty_keeps_parsing (non-blank and keeps parsing). context_identifiers: of the "
            "identifiers the completions use (keywords and builtins left out), the share the surrounding "
            "code already uses. mean_ms is per natural-stop "
            "infill, with the quality runs in parallel processes: indicative only.",
            "",
            *quality_table(quality),
            "",
            "## Quality and speed together",
            "",
            *matched_quality(quality, speed_summary, contenders),
            "",
        ]
    lines += ["![side by side](side_by_side.png)", ""]
    raw = {"meta": meta, "args": {k: str(v) for k, v in vars(args).items()},
           "contenders": [asdict(c) for c in contenders], "speed": [asdict(r) for r in rows],
           "speed_summary": speed_summary, "quality": quality}  # fmt: skip
    path = common.write_results(args.out, "side_by_side", lines, raw)
    plot(speed_summary, quality, spans, args.out / "side_by_side.png")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
