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

import re

import pytest

from dg_lsp.context import build_context, parse_snapshot
from dg_lsp.context.ranking import rank_candidates

from .snippets import PROGRAMS

LINE_START = {"line_above", "empty_line", "function_body"}


def _cursors(source: str):
    lines = source.split("\n")
    for i, line in enumerate(lines[:-1]):
        if not line.strip():
            continue
        before = "".join(ln + "\n" for ln in lines[:i])
        after = "\n".join(lines[i + 1 :])
        if lines[i + 1].strip():  # else the cursor would sit on a blank line: the emptied shape
            yield "removed", line, before + after, len(before)
        yield "emptied", line, before + "\n" + after, len(before)


@pytest.mark.parametrize("language", list(PROGRAMS))
def test_a_removed_line_written_back_is_shown_as_it_was(language):
    source = PROGRAMS[language]
    checked, wrong = 0, []
    for shape, line, doc, cursor in _cursors(source):
        snap = parse_snapshot(doc, language)
        ctx = build_context(snap, cursor, language=language)
        if ctx.span.name not in LINE_START:
            continue  # inside brackets or strings: their own stop rules, not a whole line's
        checked += 1
        shown = rank_candidates([(line + "\n", 0.0)], ctx, snap)
        if not shown or (doc[:cursor] + shown[0] + doc[cursor:]).rstrip() != source.rstrip():
            wrong.append((shape, ctx.span.name, line, shown[:1]))
    assert checked >= 5
    assert not wrong, wrong


_BOUNDARY = re.compile(r"[\s(\[{,.=:]+")


def _rest_of_line_cursors(source: str):
    start = 0
    for line in source.split("\n"):
        code = line.strip() and not line.lstrip().startswith(("#", "//", "*", "/*", "--"))
        for m in _BOUNDARY.finditer(line) if code else ():
            if line[: m.end()].strip() and m.end() < len(line):
                cut, end = start + m.end(), start + len(line)
                yield source[cut:end], source[:cut] + source[end:], cut
        start += len(line) + 1


@pytest.mark.parametrize("language", list(PROGRAMS))
def test_the_rest_of_a_line_written_back_is_shown_as_it_was(language):
    """The user has typed a line up to a token boundary (`function baseNth(`, `if (!s.`, `xs.map((`); the
    rest of it comes back whole: it used to lose the `) {` a `}` further down was taken to close, the
    `) => (` whose `(` closes below, and a docstring's or shell string's closing quote (the string, not
    closed yet, ran on to the next quote in the file)."""
    source = PROGRAMS[language]
    checked, wrong = 0, []
    for rest, doc, cursor in _rest_of_line_cursors(source):
        snap = parse_snapshot(doc, language)
        ctx = build_context(snap, cursor, language=language)
        checked += 1
        shown = rank_candidates([(rest, 0.0)], ctx, snap)
        if shown[:1] != [rest]:
            wrong.append((ctx.span.name, doc[:cursor].rsplit("\n", 1)[-1] + "<|>", rest, shown[:1]))
    assert checked >= 10
    assert not wrong, wrong
