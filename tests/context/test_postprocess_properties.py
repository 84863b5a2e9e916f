"""Invariants of `postprocess` on arbitrary model output (what a random or broken model may emit)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dg_lsp.context import build_context, postprocess
from dg_lsp.context.brackets import PAIR, leading_closers, unmatched_openers
from dg_lsp.context.postprocess import bracket_plan

from .conftest import split_cursor

SITES = [
    ("python", "result = compute(a, <|>)\n"),
    ("python", "def f(x):\n    <|>\n"),
    ("python", "items = [\n    1,\n    <|>\n]\n"),
    ("javascript", "function f(a) {\n  if (a) {\n    <|>\n  }\n}\n"),
    ("go", "package main\n\nfunc main() {\n\tfmt.Println(<|>)\n}\n"),
    ("rust", "fn main() {\n    let v = vec![1, <|>];\n}\n"),
    ("c", "int main(void) {\n  <|>\n}\n"),
    ("lua", "local t = { <|> }\n"),
    ("bash", "greet() {\n  <|>\n}\n"),
    (None, "Dear <|>\n"),
]

model_output = st.lists(
    st.sampled_from([*"ab1 _=+,.:;()[]{}\"'\n\t#/", "    ", "return ", "x = 1"]), max_size=40
).map("".join)


@pytest.mark.parametrize(("language", "src"), SITES)
@settings(max_examples=60, deadline=None)
@given(candidate=model_output)
def test_postprocess_invariants(language, src, candidate):
    text, offset = split_cursor(src)
    ctx = build_context(text, offset, language=language)
    out = postprocess(candidate, ctx)
    if out is None:
        return
    assert out.strip(), "empty output must be dropped"
    assert all(line == line.rstrip() for line in out.split("\n")), "no trailing whitespace"
    if ctx.span.single_line:
        assert "\n" not in out
    # never closes a bracket that the suffix already closes, unless it opens it again (`} else {`); the
    # suffix closes the outermost open brackets kind for kind
    closes = leading_closers(out, language)
    theirs, _, _ = bracket_plan(ctx)
    extra = len(closes) - (len(ctx.open_brackets) - len(theirs))
    if extra > 0:
        reopened = unmatched_openers(out, language)[:extra]
        assert [PAIR[c] for c in closes[len(closes) - extra :]] == list(reversed(reopened))
