"""What the editor pipeline leaves of a right answer where users type, over whole held-out files.

Every code line of every held-out file (up to `--max-chars`) is taken out of its file, either whole (the
cursor then sits at column 0 of the next line, HumanEval-infilling's shape, `line_above`) or emptied (the
cursor on the blank line left behind, `empty_line`); with `--lines K` every run of K lines of one block
(`--blank-lines`: those with a blank line inside);
with `--rest-of-line N` the rest of the line at N token boundaries per file (after a space or
punctuation: where a user typing the line is); with `--bodies N` the body of every function of at most N
lines, blank lines and all, after its docstring (the cursor on the body's first line, at its indentation,
as after Enter at the end of the signature); with `--blocks N` the body of every block of at most N lines,
the cursor at the end of its header (after the `:` or `{` just typed). What was taken out is fed back as
the only candidate through post-processing and the tree-sitter check (`rank_candidates`), exactly as a
model's first candidate goes. A perfect model's answer is then shown as it was, or moved, cut or dropped
by the pipeline: each failure here is a fault every model's right answers meet. No model runs; the
figures are deterministic.

    python benchmarks/removed_lines.py --out benchmarks/results/removed_lines/head
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import re
import sys
import time
from pathlib import Path

from common import ROOT, header

from dg_lsp.context import build_context, parse_snapshot
from dg_lsp.context.builder import LINE_START_KINDS
from dg_lsp.context.ranking import rank_candidates


def _lead(line: str) -> int:
    return len(line) - len(line.lstrip())


def cursors(source: str, k: int = 1, blank: bool = False):
    """(shape, removed text, document without it, cursor) for every run of `k` lines of `source` that
    stays in the block of its first line (no code line to its left). Without `blank`, runs of code lines
    only; with it, only runs with a blank line inside (not first or last): a model that stopped after such
    a run keeps its blank lines; the stop rules end one that ran on at a blank line, by design."""
    lines = source.split("\n")
    for i in range(len(lines) - k):
        run = lines[i : i + k]
        code = [ln for ln in run if ln.strip()]
        if blank and (len(code) == k or not run[0].strip() or not run[-1].strip()):
            continue
        if (not blank and len(code) < k) or min(map(_lead, code)) < _lead(run[0]):
            continue
        removed = "\n".join(run)
        before = "".join(ln + "\n" for ln in lines[:i])
        after = "\n".join(lines[i + k :])
        if lines[i + k].strip():  # else the cursor would sit on a blank line: the emptied shape
            yield "removed", removed, before + after, len(before)
        yield "emptied", removed, before + "\n" + after, len(before)


def _line_starts(lines: list[str]) -> list[int]:
    """The offset each line starts at, and one past the end."""
    return list(itertools.accumulate((len(ln) + 1 for ln in lines), initial=0))


def _nodes(source: str, language: str):
    """Every node of `source`'s syntax tree (none where it does not parse)."""
    tree = parse_snapshot(source, language).tree
    stack = [tree.root_node] if tree is not None else []
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        yield node


_BOUNDARY = re.compile(r"[\s(\[{,.=:]+")


def rest_of_line_cursors(
    source: str,
    per_file: int | None = None,
    seed: int = 1,
    skip: tuple[str, ...] = ("#", "//", "*", "/*", '"""'),
):
    """("rest of line", the rest, document without it, cursor) at token boundaries (after a space or
    punctuation) inside code lines, not those starting with `skip`: where a user is typing a line.
    `per_file` of them drawn at random, or every one in order."""
    lines = source.split("\n")
    starts = _line_starts(lines)
    sites = [
        (i, m.end())
        for i, ln in enumerate(lines)
        if ln.strip() and not ln.lstrip().startswith(skip)
        for m in _BOUNDARY.finditer(ln)
        if ln[: m.end()].strip() and m.end() < len(ln)
    ]
    if per_file is not None:
        sites = random.Random(seed).sample(sites, min(per_file, len(sites)))
    for i, col in sites:
        cut, end = starts[i] + col, starts[i] + len(lines[i])
        yield "rest of line", source[cut:end], source[:cut] + source[end:], cut


FUNCTIONS = {
    "python": {"function_definition"},
    "javascript": {"function_declaration", "function_expression", "method_definition", "arrow_function",
                   "generator_function_declaration"},
}  # fmt: skip
FUNCTIONS["typescript"] = FUNCTIONS["javascript"]


def body_cursors(source: str, language: str, max_lines: int):
    """("body", the body, document without it, cursor) for every function whose statements after its
    docstring fill at most `max_lines` lines of their own: the cursor on an otherwise empty line at the
    body's indentation, where the user asks for the body."""
    lines = source.split("\n")
    starts = _line_starts(lines)
    for node in _nodes(source, language):
        body = node.child_by_field_name("body") if node.type in FUNCTIONS.get(language, ()) else None
        if body is None or body.type not in ("block", "statement_block"):
            continue
        statements = list(body.named_children)
        if statements and statements[0].type == "expression_statement" and statements[0].named_children:
            if statements[0].named_children[0].type == "string":
                statements = statements[1:]  # the docstring stays: the user wrote it
        if not statements:
            continue
        top, bottom = statements[0].start_point[0], statements[-1].end_point[0]
        if bottom - top + 1 > max_lines or top == node.start_point[0]:
            continue
        if language != "python" and body.end_point[0] == bottom:
            continue  # the closing brace shares the last statement's line
        indent = lines[top][: _lead(lines[top])]
        if statements[0].start_point[1] != len(indent.encode()):
            continue  # the body does not start its line
        cut, end = starts[top] + len(indent), starts[bottom] + len(lines[bottom])
        yield "body", source[cut:end], source[:cut] + source[end:], cut


def block_cursors(source: str, language: str, max_lines: int):
    """("after header", the block's body, document without it, cursor) for every block (a function's, an
    `if`'s, a loop's...) whose body fills at most `max_lines` lines of its own: the cursor at the end of the
    header, after its `:` or `{`, where the user has just typed it (a `{` with its `}` closed by the editor
    on the line below)."""
    if language not in FUNCTIONS:
        return
    data = source.encode()
    lines = source.split("\n")
    starts = _line_starts(lines)
    for node in _nodes(source, language):
        if node.type not in ("block", "statement_block") or not node.named_children:
            continue
        if language == "python":
            colon = node.prev_sibling
            if colon is None or colon.type != ":":
                continue
            header_end = colon.end_byte
        else:
            header_end = node.children[0].end_byte  # the `{`
            if (
                node.children[-1].type != "}"
                or node.children[-1].start_point[0] == node.named_children[-1].end_point[0]
            ):
                continue
        top, bottom = node.named_children[0].start_point[0], node.named_children[-1].end_point[0]
        row = data[:header_end].count(b"\n")
        if top <= row or bottom - top + 1 > max_lines:
            continue
        cursor = len(data[:header_end].decode())
        if source[cursor : starts[row] + len(lines[row])].strip():
            continue  # a comment after the header
        end = starts[bottom] + len(lines[bottom])
        yield "after header", source[cursor:end], source[:cursor] + source[end:], cursor


def language_of(doc: dict) -> str:
    return "typescript" if doc["path"].endswith(".ts") else doc["lang"]


def _lines(text: str) -> str:
    """Trailing spaces are not part of the answer: post-processing strips them on every line."""
    return "\n".join(line.rstrip() for line in text.rstrip().split("\n"))


def run(
    corpus: Path,
    max_chars: int,
    k: int,
    rest_of_line: int,
    bodies: int = 0,
    blocks: int = 0,
    blank: bool = False,
) -> tuple[dict, list[dict]]:
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    failures = []
    for raw in (corpus / "valid.jsonl").open():
        doc = json.loads(raw)
        source, language = doc["text"], language_of(doc)
        if len(source) > max_chars:
            continue
        if blocks:
            sites = block_cursors(source, language, blocks)
        elif bodies:
            sites = body_cursors(source, language, bodies)
        elif rest_of_line:
            sites = rest_of_line_cursors(source, rest_of_line)
        else:
            sites = cursors(source, k, blank)
        for shape, line, text, cursor in sites:
            snap = parse_snapshot(text, language)
            ctx = build_context(snap, cursor, language=language)
            if not (rest_of_line or bodies or blocks) and ctx.span.name not in LINE_START_KINDS:
                continue  # inside brackets or strings: their own stop rules, not a whole line's
            candidate = line if rest_of_line or bodies or blocks else line + "\n"
            shown = rank_candidates([(candidate, 0.0)], ctx, snap, stopped=[True])  # ends where it should
            ok = bool(shown) and _lines(text[:cursor] + shown[0] + text[cursor:]) == _lines(source)
            counts[(language, shape)]["shown as it was" if ok else "moved, cut or dropped"] += 1
            if not ok:
                where = {"file": doc["path"], "shape": shape, "span": ctx.span.name}
                failures.append({**where, "line": line, "shown": shown[:1]})
    table = {f"{lang} / {shape}": dict(c) for (lang, shape), c in sorted(counts.items())}
    return table, failures


def rate(c: dict) -> float:
    total = sum(c.values())
    return c.get("shown as it was", 0) / total if total else 0.0


def plot(tables: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({row for table in tables.values() for row in table})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(tables)
    for n, (name, table) in enumerate(tables.items()):
        ax.barh(
            [i + n * width for i in range(len(rows))],
            [100 * (1 - rate(table.get(r, {}))) for r in rows],
            height=width,
            label=name,
        )
    ax.set_yticks([i + width * (len(tables) - 1) / 2 for i in range(len(rows))], rows)
    ax.set_xlabel("% of right lines moved, cut or dropped by the pipeline (lower is better)")
    ax.set_title("A perfect model's line at line-start cursors of held-out files")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    ap.add_argument("--max-chars", type=int, default=20_000, help="skip longer files (time: every line)")
    ap.add_argument("--lines", type=int, default=1, help="remove runs of this many lines (one block's)")
    ap.add_argument("--blank-lines", action="store_true", help="only runs with a blank line inside")
    ap.add_argument(
        "--rest-of-line",
        type=int,
        default=0,
        help="instead: this many token boundaries per file, the rest of the line",
    )
    ap.add_argument(
        "--bodies",
        type=int,
        default=0,
        help="instead: the body of every function of at most this many lines",
    )
    ap.add_argument(
        "--blocks",
        type=int,
        default=0,
        help="instead: the body of every block of at most this many lines, the cursor after its header",
    )
    ap.add_argument("--compare", type=Path, help="an earlier run's removed_lines.json, shown beside this one")
    ap.add_argument("--out", type=Path, required=True, help="a folder for removed_lines.md/.json/.png")
    args = ap.parse_args()
    if not (args.corpus / "valid.jsonl").exists():
        sys.exit(f"no held-out corpus at {args.corpus}: see dg_lsp/training/README.md")
    start = time.perf_counter()
    table, failures = run(
        args.corpus, args.max_chars, args.lines, args.rest_of_line, args.bodies, args.blocks, args.blank_lines
    )
    wall = time.perf_counter() - start
    lines, meta = header("A perfect model's line at line-start cursors of held-out files")
    tables = {"this run": table}
    if args.compare:
        tables = {"earlier run": json.loads(args.compare.read_text())["table"], "this run": table}
    names = list(tables)
    lines += [
        __doc__.split("\n\n")[1].replace("\n", " "),
        "",
        f"Held-out files of `{args.corpus.name}` up to {args.max_chars:,} characters; "
        + (
            f"block bodies of at most {args.blocks} lines taken out after their header"
            if args.blocks
            else f"function bodies of at most {args.bodies} lines taken out"
            if args.bodies
            else f"the rest of the line at {args.rest_of_line} token boundaries per file"
            if args.rest_of_line
            else f"runs of {args.lines} lines with a blank line inside taken out"
            if args.blank_lines
            else f"runs of {args.lines} line(s) taken out"
        )
        + f"; wall {wall:.0f} s.",
        "",
        "| language / shape | cursors | " + " | ".join(f"shown as it was ({n})" for n in names) + " |",
        "| --- | --: | " + " | ".join("--:" for _ in names) + " |",
    ]
    for row in sorted(table):
        total = sum(table[row].values())
        cells = [f"{100 * rate(t.get(row, {})):.1f}%" for t in tables.values()]
        lines.append(f"| {row} | {total} | " + " | ".join(cells) + " |")
    lines += ["", f"{len(failures)} lines not shown as they were; the first 40:", ""]
    lines += [
        f"- `{f['file']}` {f['shape']} ({f['span']}): `{f['line'].strip()[:70]}` shown as "
        f"`{(f['shown'][0] if f['shown'] else 'nothing')[:80]!r}`"
        for f in failures[:40]
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "removed_lines.md").write_text("\n".join(lines) + "\n")
    (args.out / "removed_lines.json").write_text(
        json.dumps({"meta": meta, "table": table, "failures": failures}, indent=1)
    )
    plot(tables, args.out / "removed_lines.png")
    print(f"wrote {args.out}/removed_lines.md, .json, .png", file=sys.stderr)


if __name__ == "__main__":
    main()
