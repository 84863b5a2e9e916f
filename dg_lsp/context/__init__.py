"""Tree-sitter context: incremental trees per document, infill windows, span kinds, candidate
post-processing, syntax checks and placeholders.

All offsets are Python str indices (code points) into the document text.

Typical flow (server thread edits, worker thread reads an immutable snapshot)::

    trees = DocumentTrees()
    trees.open(uri, language_id, text)             # didOpen
    trees.edit(uri, start, old_end, new_text)      # didChange, one call per content change
    snap = trees.snapshot(uri)                     # worker thread
    ctx = build_context(snap, offset)              # or end_offset=... to replace a range
    if ctx.span.enabled:
        request = ctx.to_request(num_candidates=4)
        stopped = [ended_by_model(c, request.max_tokens) for c in result.candidates]
        texts = rank_candidates([(c.text, c.mean_logprob) for c in result.candidates], ctx, snap, stopped)

`find_syntax_errors(snap)` and `find_placeholders(snap)` feed the "Repair syntax error" and "Fill
placeholder" code actions; each issue/placeholder carries the range to pass as `end_offset`.
"""

from dg_lsp.context.builder import InfillContext, as_snapshot, build_context
from dg_lsp.context.documents import MAX_PARSE_CHARS, DocumentSnapshot, DocumentTrees, parse_snapshot
from dg_lsp.context.languages import SUPPORTED, language_for
from dg_lsp.context.placeholders import Placeholder, find_placeholders
from dg_lsp.context.postprocess import postprocess
from dg_lsp.context.ranking import rank_candidates
from dg_lsp.context.spans import SPAN_KINDS, SpanKind
from dg_lsp.context.syntax import SyntaxIssue, SyntaxVerdict, find_syntax_errors, syntax_delta, verdict

__all__ = [
    "MAX_PARSE_CHARS",
    "SPAN_KINDS",
    "SUPPORTED",
    "DocumentSnapshot",
    "DocumentTrees",
    "InfillContext",
    "Placeholder",
    "SpanKind",
    "SyntaxIssue",
    "SyntaxVerdict",
    "as_snapshot",
    "build_context",
    "find_placeholders",
    "find_syntax_errors",
    "language_for",
    "parse_snapshot",
    "postprocess",
    "rank_candidates",
    "syntax_delta",
    "verdict",
]
