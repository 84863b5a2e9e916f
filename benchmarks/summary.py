"""Headline figures from the latest results files, as the table at the end of benchmarks/README.md.

Reads only what the benchmark scripts wrote (`benchmarks/results/*.json`); a figure that was not
measured is not shown.

    python benchmarks/summary.py             # print the table
    python benchmarks/summary.py --readme    # replace the "Latest figures" table in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

MARK = "<!-- latest figures: python benchmarks/summary.py --readme -->"


def _load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _when(data: dict) -> str:
    return data.get("meta", {}).get("date", "?")


def rows(results: Path) -> list[list[str]]:
    out: list[list[str]] = []
    lsp = _load(results, "lsp_latency")
    if lsp:
        src = f"lsp_latency.md ({_when(lsp)})"
        budget = lsp["settings"].get("latencyBudgetMs")
        for run in lsp["runs"]:
            s = lsp["summaries"][run["label"]]
            cold = run["cold"]
            pct = f"{s['p50']:.0f} / {s['p95']:.0f} / {s['p99']:.0f} ms (n={s['answered']})"
            out.append([run["label"], "LSP inlineCompletion p50 / p95 / p99", pct, src])
            share = "n/a" if s["within_budget"] != s["within_budget"] else f"{100 * s['within_budget']:.0f}%"
            out.append([run["label"], f"answered requests within {budget} ms", share, src])
            if "waited_within_budget" in s and s["waited_within_budget"] == s["waited_within_budget"]:
                w = f"{100 * s['waited_within_budget']:.0f}% of {s['waited']}"
                out.append([run["label"], f"pauses ≥ {budget} ms with a suggestion in time", w, src])
            times = f"{cold['loaded_ms'] / 1000:.1f} s → {cold['first_completion_ms'] / 1000:.1f} s"
            out.append([run["label"], "cold start: spawn → model loaded → first completion", times, src])
    sbs = _load(results, "side_by_side")
    if sbs:
        src = f"side_by_side.md ({_when(sbs)})"
        for label, per_span in sbs["speed_summary"].items():
            cells = [f"{per_span[k]['median_cpu_ms']:.0f}" for k in ("32", "128") if k in per_span]
            if len(cells) == 2:
                out.append(
                    [label, "CPU ms per 32 / 128-token span (forced, 1 thread)", " / ".join(cells), src]
                )
        for label, q in (sbs.get("quality") or {}).items():
            suites = q["suites"]
            he = [f"{k} {100 * v['pass@1']:.1f}%" for k, v in suites.items() if "pass@1" in v]
            if he:
                out.append([label, "HumanEval-infilling pass@1", ", ".join(he), src])
            if "held-out" in suites:
                h = suites["held-out"]
                em = f"{100 * h['exact_match']:.1f}% / {100 * h['edit_similarity']:.1f}%"
                out.append([label, "held-out spans EM / edit similarity", em, src])
            kp = suites["all"]["keeps_parsing"]
            if kp == kp:
                out.append([label, "completions that keep the file parsing", f"{100 * kp:.1f}%", src])
    mq = _load(results, "model_quality")
    if mq:
        src = "model_quality.md"
        for label, data in mq.items():
            suites = data.get("summary", {}).get("suites", {})
            he = [
                f"{k} {100 * v['pass@1']:.1f}% (n={v['tasks']})" for k, v in suites.items() if "pass@1" in v
            ]
            if he:
                out.append([label, "HumanEval-infilling pass@1 (larger subsets)", ", ".join(he), src])
    editor = _load(results / "model_quality_editor", "model_quality")
    if editor:
        src = "model_quality_editor/model_quality.md"
        for label, data in editor.items():
            suites = data.get("summary", {}).get("suites", {})
            shown = [
                f"{k} {100 * v['nonempty_parsing']:.1f}% / {100 * v['shown']:.1f}%"
                for k, v in suites.items()
                if "shown" in v
            ]
            if shown:
                figure = "through the editor pipeline: shown and parsing / shown"
                out.append([label, figure, ", ".join(shown), src])
    mem = _load(results, "memory")
    if mem:
        src = f"memory.md ({_when(mem)})"
        for r in mem["rows"]:
            out.append([r["label"], f"RSS [{r['quantization']}]", f"{r['rss_mib']:.0f} MiB", src])
    return out


def table(results: Path) -> list[str]:
    found = rows(results)
    if not found:
        return ["No measured figures yet: run the benchmarks above."]
    return common.md_table(["model", "figure", "value", "from"], found, "llll")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=common.RESULTS)
    ap.add_argument("--readme", action="store_true", help="rewrite the table in benchmarks/README.md")
    args = ap.parse_args(argv)
    lines = table(args.results)
    print("\n".join(lines))
    if args.readme:
        readme = Path(__file__).resolve().parent / "README.md"
        text = readme.read_text()
        head, _, rest = text.partition(MARK) if MARK in text else (text.rstrip() + "\n\n", "", "")
        # the table ends at the first blank line after it; sections below it (team_serve) stay
        body = rest.lstrip("\n").split("\n\n", 1)
        tail = "\n" + body[1] if len(body) > 1 else ""
        readme.write_text(head + MARK + "\n\n" + "\n".join(lines) + "\n" + tail.rstrip("\n") + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
