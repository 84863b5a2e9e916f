"""Tree-sitter context: incremental trees per document, infill windows, span kinds, candidate
post-processing, syntax checks and placeholders. Offsets are Python str indices into the text."""

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
