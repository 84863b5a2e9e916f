"""Order model candidates: clean each, reject those that break the file, best first."""

from __future__ import annotations

from dg_lsp.context.builder import InfillContext, as_snapshot
from dg_lsp.context.documents import DocumentSnapshot
from dg_lsp.context.postprocess import postprocess
from dg_lsp.context.syntax import verdict


def rank_candidates(
    candidates: list[tuple[str, float]],
    ctx: InfillContext,
    snapshot: DocumentSnapshot | str | None,
) -> list[str]:
    """Post-processed, de-duplicated candidates that add no syntax error, best first.

    Best = fixes the most errors, then highest mean log-probability. `snapshot` must be the document
    `ctx` was built from (offsets refer to it); without one (or without a tree) there is no syntax check.
    """
    snap = as_snapshot(snapshot, ctx.language) if snapshot is not None else None
    seen: set[str] = set()
    scored: list[tuple[int, float, int, str]] = []
    for index, (raw, logprob) in enumerate(candidates):
        text = postprocess(raw, ctx)
        if text is None or text in seen:
            continue
        seen.add(text)
        delta = 0
        if snap is not None and snap.tree is not None:
            judged = verdict(snap, ctx.cursor_offset, ctx.end_offset, text)
            if not judged.ok:
                continue
            delta = judged.new_errors
        scored.append((delta, -logprob, index, text))
    scored.sort()
    return [text for *_, text in scored]
