"""A model that writes back exactly the line the user removed gets it shown as it was.

Every code line of the small real programs is taken out of its file, either whole (the cursor then sits
at column 0 of the next line, HumanEval-infilling's shape) or emptied (the cursor on the blank line left
behind), and fed back as the candidate through post-processing and the tree-sitter check. Whatever the
pipeline does to a perfect answer it does to every model's right answers: it used to re-indent a block's
header to its body's column (`for x in xs:` above the loop's body), close a `{` that the block's own `}`
below already closes, cut an `else:` for sitting left of the code line, cut a `} else {` at its `}`, and
indent a C++ namespace's body and the members after ` public:` as if they were blocks one step deeper.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dg_lsp.context import build_context, parse_snapshot
from dg_lsp.context.builder import LINE_START_KINDS
from dg_lsp.context.ranking import rank_candidates

from .snippets import PROGRAMS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from removed_lines import (  # the benchmark's cursors, on these programs
    FUNCTIONS,
    block_cursors,
    body_cursors,
    cursors,
    rest_of_line_cursors,
)


@pytest.mark.parametrize("language", list(PROGRAMS))
def test_a_removed_line_written_back_is_shown_as_it_was(language):
    source = PROGRAMS[language]
    checked, wrong = 0, []
    for shape, line, doc, cursor in cursors(source):
        snap = parse_snapshot(doc, language)
        ctx = build_context(snap, cursor, language=language)
        if ctx.span.name not in LINE_START_KINDS:
            continue  # inside brackets or strings: their own stop rules, not a whole line's
        checked += 1
        shown = rank_candidates([(line + "\n", 0.0)], ctx, snap)
        if not shown or (doc[:cursor] + shown[0] + doc[cursor:]).rstrip() != source.rstrip():
            wrong.append((shape, ctx.span.name, line, shown[:1]))
    assert checked >= 5
    assert not wrong, wrong


@pytest.mark.parametrize("language", list(PROGRAMS))
def test_the_rest_of_a_line_written_back_is_shown_as_it_was(language):
    """The user has typed a line up to a token boundary (`function baseNth(`, `if (!s.`, `xs.map((`); the
    rest of it comes back whole: it used to lose the `) {` a `}` further down was taken to close, the
    `) => (` whose `(` closes below, and a docstring's or shell string's closing quote (the string, not
    closed yet, ran on to the next quote in the file)."""
    source = PROGRAMS[language]
    checked, wrong = 0, []
    for _, rest, doc, cursor in rest_of_line_cursors(source, skip=("#", "//", "*", "/*", "--")):
        snap = parse_snapshot(doc, language)
        ctx = build_context(snap, cursor, language=language)
        checked += 1
        shown = rank_candidates([(rest, 0.0)], ctx, snap)
        if shown[:1] != [rest]:
            wrong.append((ctx.span.name, doc[:cursor].rsplit("\n", 1)[-1] + "<|>", rest, shown[:1]))
    assert checked >= 10
    assert not wrong, wrong


@pytest.mark.parametrize(("cursors_of", "least"), [(body_cursors, 2), (block_cursors, 3)])
@pytest.mark.parametrize("language", sorted(FUNCTIONS))
def test_a_block_body_written_back_is_shown_as_it_was(language, cursors_of, least):
    """The user has written a signature (and docstring) and asks for the body on the line below, or has
    just typed a header's `:` or `{` (its `}` closed by the editor below): the body, as its model stopped
    after it, comes back whole, at the block's column."""
    source = PROGRAMS[language]
    checked, wrong = 0, []
    for _, body, doc, cursor in cursors_of(source, language, max_lines=20):
        snap = parse_snapshot(doc, language)
        ctx = build_context(snap, cursor, language=language)
        checked += 1
        shown = rank_candidates([(body, 0.0)], ctx, snap, stopped=[True])
        if shown[:1] != ["\n".join(line.rstrip() for line in body.split("\n"))]:
            wrong.append((ctx.span.name, body, shown[:1]))
    assert checked >= least
    assert not wrong, wrong
