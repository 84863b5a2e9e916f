"""One infill, end to end below the protocol: context → engine → post-processing.

Shared by the language server and `dg-lsp complete`, so the terminal shows exactly what an editor
would get.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dg_lsp import context
from dg_lsp.engine.types import InfillEngine, InfillRequest, InfillStats, ShouldCancel, ended_by_model
from dg_lsp.settings import Settings


@dataclass
class Completion:
    """Ranked infill texts for one cursor (or span), with the engine's figures."""

    texts: list[str] = field(default_factory=list)
    start: int = 0
    end: int = 0
    span_kind: str = ""
    stats: InfillStats = field(default_factory=InfillStats)
    skipped: str | None = None
    """Why nothing was generated (span kind disabled, language disabled...), for logs and --json."""
    rejected: list[str] = field(default_factory=list)
    """The engine's raw candidates when all were rejected: shown by `complete --json`, never inserted."""


def plan(
    snapshot: context.DocumentSnapshot,
    offset: int,
    settings: Settings,
    end_offset: int | None = None,
    doc_key: str | None = None,
    invoked: bool = True,
) -> tuple[context.InfillContext, InfillRequest]:
    """Pure: derive the model request from the document, cursor and settings. `invoked`: the user asked
    (code action, invoked completion, `dg-lsp complete`) and waits for it, so the latency budget, which
    is there to keep ghost text up with typing, does not cut its steps."""
    ctx = context.build_context(
        snapshot,
        offset,
        language=snapshot.language,
        max_tokens=settings.max_tokens,
        end_offset=end_offset,
    )
    request = InfillRequest(
        prefix=ctx.prefix,
        suffix=ctx.suffix,
        max_tokens=max(1, min(settings.max_tokens, ctx.span.max_tokens)),
        single_line=ctx.span.single_line,
        language=snapshot.language,
        blank_start=ctx.blank_start,
        num_candidates=max(1, settings.num_candidates),
        steps=settings.denoising_steps or None,
        seed=settings.seed,
        doc_key=doc_key,
        token_healing=settings.token_healing,
        deadline_ms=float(settings.latency_budget_ms) if settings.latency_budget_ms and not invoked else None,
    )
    return ctx, request


def complete(
    engine: InfillEngine,
    snapshot: context.DocumentSnapshot,
    offset: int,
    settings: Settings,
    end_offset: int | None = None,
    should_cancel: ShouldCancel | None = None,
    doc_key: str | None = None,
    invoked: bool = True,
) -> Completion:
    ctx, request = plan(snapshot, offset, settings, end_offset, doc_key, invoked)
    span_end = offset if end_offset is None else end_offset
    out = Completion(start=offset, end=span_end, span_kind=ctx.span.name)
    if not ctx.span.enabled and not (ctx.span.name == "comment" and settings.complete_comments):
        out.skipped = f"span kind {ctx.span.name!r} is off"
        return out
    result = engine.infill(request, should_cancel)
    out.stats = result.stats
    ranked = context.rank_candidates(
        [(c.text, c.mean_logprob) for c in result.candidates],
        ctx,
        snapshot,
        stopped=[ended_by_model(c, request.max_tokens) for c in result.candidates],
    )
    out.texts = ranked
    if not ranked:
        out.skipped = "every candidate was rejected by post-processing or the syntax check"
        out.rejected = [c.text for c in result.candidates]
    return out
