"""Order model candidates: clean each, reject those that break the file, best first."""

from __future__ import annotations

import time
from collections.abc import Sequence

from dg_lsp.context.builder import InfillContext, as_snapshot
from dg_lsp.context.documents import DocumentSnapshot
from dg_lsp.context.postprocess import postprocess
from dg_lsp.context.syntax import verdict

MAX_TRIMS = 8
"""Shorter versions of rejected multi-line candidates tried per request, each one syntax check..."""
TRIM_BUDGET_S = 0.03
"""...while ranking has taken less than this: a check reparses the document, ~10 ms on a 5,000-line file."""


def rank_candidates(
    candidates: list[tuple[str, float]],
    ctx: InfillContext,
    snapshot: DocumentSnapshot | str | None,
    stopped: Sequence[bool] = (),
) -> list[str]:
    """Post-processed, de-duplicated candidates that add no syntax error, best first.

    Best = whole rather than trimmed, then fixes the most errors, then highest mean log-probability.
    `snapshot` must be the document `ctx` was built from (offsets refer to it); without one (or without a
    tree) there is no syntax check.

    A multi-line candidate the check rejects is often a right answer cut short: the canvas ended inside
    a block (`if p % k == 0:` with its body not written) or before the code that leads back to the suffix's
    column. Its longest run of whole lines that does parse is shown instead of nothing.

    `stopped[i]`: candidate i ends where its model stopped (`ended_by_model`); missing: it may have run on."""
    snap = as_snapshot(snapshot, ctx.language) if snapshot is not None else None
    checked = snap is not None and snap.tree is not None
    seen: set[str] = set()
    scored: list[tuple[bool, int, float, int, str]] = []
    trims, deadline = MAX_TRIMS, time.perf_counter() + TRIM_BUDGET_S
    for index, (raw, logprob) in enumerate(candidates):
        ended = index < len(stopped) and stopped[index]
        text = postprocess(raw, ctx, ended)
        if text is not None and text in seen:
            continue
        if not checked:
            if text is not None and text not in seen:
                seen.add(text)
                scored.append((False, 0, -logprob, index, text))
            continue
        best = None
        for option in (text, _with_closing_quote(raw, text or "", ctx)):
            if option is None or option in seen:
                continue
            seen.add(option)
            judged = verdict(snap, ctx.cursor_offset, ctx.end_offset, option)
            if judged.ok and (best is None or judged.new_errors < best[0]):
                best = (judged.new_errors, option)
        if best is not None:
            scored.append((False, best[0], -logprob, index, best[1]))
            continue
        for shorter in _line_prefixes(raw, text, ctx, ended) if text is not None else ():
            if trims <= 0 or time.perf_counter() > deadline:
                break
            if shorter in seen:
                continue
            seen.add(shorter)
            trims -= 1
            judged = verdict(snap, ctx.cursor_offset, ctx.end_offset, shorter)
            if judged.ok:
                scored.append((True, judged.new_errors, -logprob, index, shorter))
                break
    scored.sort()
    return [text for *_, text in scored]


def _line_prefixes(raw: str, text: str, ctx: InfillContext, stopped: bool):
    """`raw` cut after each of its lines, longest first, cleaned as a whole candidate is (never a line the
    cleaned text lacks)."""
    if ctx.span.single_line or "\n" not in text.strip("\n"):
        return
    lines = raw.split("\n")
    for k in range(len(lines) - 1, 0, -1):
        shorter = postprocess("\n".join(lines[:k]) + "\n", ctx, stopped)
        if shorter is not None and shorter.strip() and len(shorter) < len(text):
            yield shorter


def _with_closing_quote(raw: str, text: str, ctx: InfillContext) -> str | None:
    """The candidate through the closing quote it wrote and the rest of that line, where the quote stop
    cut them off.

    A string typed without its closing quote yet (a docstring's first words, a shell string that may span
    lines) reads, to the parser, as running on to the next such quote in the file or to its end: the cut
    candidate leaves it open. Kept when the closing quote fixes the file's syntax errors; where the
    document closes the string further down, it would break it instead."""
    quote = ctx.span.quote
    if ctx.span.stop != "quote" or not quote:
        return None
    end = raw.find(quote)
    if end < 0:
        return None
    line_end = raw.find("\n", end)
    closed = raw[: len(raw) if line_end < 0 else line_end]
    closed = "\n".join(line.rstrip() for line in closed.split("\n"))
    head = "\n".join(line.rstrip() for line in raw[:end].split("\n")).rstrip()
    return closed if head == text.rstrip() else None
