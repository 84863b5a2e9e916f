"""Latency of the tree-sitter context layer on real 5,000-line files.

Measures, per file: `build_context` at random cursors (the per-request cost), a one-character
incremental edit + reparse through `DocumentTrees.edit` (the per-keystroke cost), a full parse, and
one syntax-check verdict (the per-candidate cost of `rank_candidates`). Also the plain-text fallback on
a 10 MB document, which must not stall. Wall and CPU time are both reported: the CPU is shared.

    python benchmarks/context_latency.py            # writes benchmarks/results/context_latency.{md,png}
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import os
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

from dg_lsp.context import (
    DocumentTrees,
    build_context,
    find_placeholders,
    find_syntax_errors,
    parse_snapshot,
    verdict,
)

RESULTS = Path(__file__).resolve().parent / "results"
LINES = 5000


STATEMENT = {
    "python": "total = compute(a, b)",
    "javascript": "total = compute(a, b);",
    "c": "total = compute(a, b);",
}


def _cut(text: str, lines: int) -> str:
    """The first `lines` lines, extended to the next top-level line so no construct is cut in half."""
    parts = text.split("\n")
    end = lines
    while end < len(parts) and (not parts[end].strip() or parts[end][0] in " \t}"):
        end += 1
    return "\n".join(parts[:end]) + "\n"


def real_sources() -> list[tuple[str, str, str]]:
    """(label, language, text) of real files cut to ~5,000 lines; the Python one ships with CPython."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    candidates = [
        ("python", stdlib / "_pydecimal.py"),
        ("javascript", Path("/usr/share/javascript/jquery/jquery.js")),
        ("c", stdlib / "test" / "clinic.test.c"),
    ]
    found = []
    for language, path in candidates:
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            if text.count("\n") >= LINES:
                cut = _cut(text, LINES)
                found.append((f"{path.name} ({language}, {cut.count(chr(10)):,} lines)", language, cut))
    if found and found[0][1] == "python":
        # the same code with non-ASCII comments, where str and byte offsets differ
        out: list[str] = []
        for i, line in enumerate(found[0][2].split("\n")):
            if i % 20 == 0 and line.strip() and not (out and out[-1].endswith("\\")):
                out.append(line[: len(line) - len(line.lstrip())] + "# café ✓ ünïcödé")
            out.append(line)
        text = "\n".join(out)
        label = f"{candidates[0][1].name} (python + non-ASCII comments, {text.count(chr(10)):,} lines)"
        found.append((label, "python", text))
    return found


def timed(fn, n: int) -> tuple[list[float], list[float]]:
    wall, cpu = [], []
    for i in range(n):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(i)
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return wall, cpu


def _stats(wall: list[float], cpu: list[float]) -> tuple[float, float, float, float]:
    return pct(wall, 0.5), pct(wall, 0.95), pct(cpu, 0.5), pct(cpu, 0.95)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_file(label: str, language: str, text: str, n: int, seed: int) -> dict[str, tuple[list, list]]:
    rng = random.Random(seed)
    snap = parse_snapshot(text, language)
    offsets = [rng.randrange(len(text)) for _ in range(n)]
    out = {}
    out["build_context"] = timed(lambda i: build_context(snap, offsets[i]), n)

    # keystrokes: type a statement on a new line after random lines, one character per edit, then undo it
    trees = DocumentTrees()
    trees.open("file:///bench", language, text)
    line_ends = [i for i, ch in enumerate(text) if ch == "\n"]
    stmt = STATEMENT[language]
    keystrokes: list[tuple[int, str]] = []
    for _ in range(max(n // (len(stmt) + 1), 1)):
        end = rng.choice(line_ends)
        start = text.rfind("\n", 0, end) + 1
        typed = "\n" + text[start:end][: len(text[start:end]) - len(text[start:end].lstrip())] + stmt
        keystrokes += [(end + i, ch) for i, ch in enumerate(typed)]
        keystrokes.append((end, typed))  # marker: undo
    times_wall, times_cpu = [], []
    for pos, ch in keystrokes:
        if len(ch) > 1:
            trees.edit("file:///bench", pos, pos + len(ch), "")
            continue
        w0, c0 = time.perf_counter(), time.process_time()
        trees.edit("file:///bench", pos, pos, ch)
        times_cpu.append((time.process_time() - c0) * 1e3)
        times_wall.append((time.perf_counter() - w0) * 1e3)
    assert trees.snapshot("file:///bench").text == text
    out["keystroke: edit + incremental reparse"] = (times_wall, times_cpu)
    out["full parse"] = timed(lambda i: parse_snapshot(text, language), max(n // 20, 5))
    # one candidate line inserted at a random line end, judged against the text without it
    sites = [rng.choice(line_ends) for _ in range(n // 4)]

    def judge(i: int) -> None:
        end = sites[i]
        start = text.rfind("\n", 0, end) + 1
        indent = text[start:end][: len(text[start:end]) - len(text[start:end].lstrip())]
        verdict(snap, end, end, "\n" + indent + stmt)

    out["syntax verdict (1 candidate)"] = timed(judge, len(sites))
    out["find_syntax_errors (whole file)"] = timed(lambda i: find_syntax_errors(snap), 10)
    out["find_placeholders (whole file)"] = timed(lambda i: find_placeholders(snap), 10)
    print(f"{label}: {len(text):,} chars, {text.count(chr(10)) + 1} lines", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=400, help="requests per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "context_latency")
    args = ap.parse_args()

    rows = []
    series: dict[str, tuple[list[float], list[float]]] = {}
    for label, language, text in real_sources():
        for what, (wall, cpu) in bench_file(label, language, text, args.n, args.seed).items():
            rows.append((label, what, len(wall), *_stats(wall, cpu)))
            if what == "build_context":
                series[label] = (wall, cpu)
    huge = "x = compute(1, 2)  # filler line of a huge generated module\n" * 180_000  # ~10 MB
    snap = parse_snapshot(huge, "python")
    rng = random.Random(args.seed)
    offs = [rng.randrange(len(huge)) for _ in range(args.n // 4)]
    wall, cpu = timed(lambda i: build_context(snap, offs[i]), len(offs))
    label = f"generated {len(huge) / 1e6:.1f} MB (no parse: plain-text fallback)"
    rows.append((label, "build_context", len(wall), *_stats(wall, cpu)))
    t0 = time.perf_counter()
    DocumentTrees().open("file:///huge.py", "python", huge)
    open_ms = (time.perf_counter() - t0) * 1e3

    header = "| file | operation | n | wall p50 ms | wall p95 ms | CPU p50 ms | CPU p95 ms |\n"
    header += "|---|---|--:|--:|--:|--:|--:|"
    table = "\n".join(
        "| " + " | ".join([r[0], r[1], str(r[2]), *(f"{x:.2f}" for x in r[3:])]) + " |" for r in rows
    )
    print(header + "\n" + table)
    machine = (
        f"{common.cpu_model()}, {os.cpu_count()} cores, load average "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())} at start, Python {platform.python_version()}, "
        f"tree-sitter {md.version('tree-sitter')}"
    )
    command = "python benchmarks/context_latency.py " + " ".join(sys.argv[1:])
    md_text = f"""# Context extraction latency

Command: `{command.strip()}`
Date: {dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}
Machine: {machine}

Real files: their first {LINES:,} lines, extended to the next top-level line so that no definition is cut
in half. Cursors, typing sites and candidate sites are drawn uniformly (seed {args.seed}).
`build_context` uses the default budgets (1,024 prefix / 256 suffix tokens). "keystroke" is one
character of a statement typed on a new line, applied through `DocumentTrees.edit` (`Tree.edit` +
incremental reparse). "syntax verdict" inserts one statement line at a line end and counts
ERROR/MISSING nodes (and Python empty or misindented blocks) with and without it, as `rank_candidates` does.
Wall time includes waiting for the CPU, which other jobs share (see the load average above: on a
busy machine the wall-time tail is the scheduler, not this code); CPU time is this process only.
The two `find_*` rows are what a code-action request costs (whole file, no range).
Opening the 10 MB document (not parsed: above the size limit) took {open_ms:.2f} ms.

{header}
{table}
"""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(md_text)
    plot(series, args.out.with_suffix(".png"))
    print(f"wrote {args.out.with_suffix('.md')} and .png", file=sys.stderr)


def plot(series: dict[str, tuple[list[float], list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for n, (name, (wall, cpu)) in enumerate(series.items()):
        color = f"C{n}"
        for xs, style, what in ((wall, "-", "wall"), (cpu, "--", "CPU")):
            xs = sorted(xs)
            label = f"{name.lstrip('_')}: {what} (p50 {pct(xs, 0.5):.2f}, p95 {pct(xs, 0.95):.2f} ms)"
            ax.plot(xs, [i / len(xs) for i in range(1, len(xs) + 1)], style, color=color, label=label)
    ax.axvline(5.0, color="red", linestyle=":", linewidth=1, label="5 ms target (p95)")
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("build_context time per request (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Context extraction latency on ~5,000-line files (shared 2-core CPU)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
