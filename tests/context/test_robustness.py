"""Any text, any cursor, any language: the context layer answers and keeps its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dg_lsp.context import (
    SUPPORTED,
    build_context,
    find_placeholders,
    find_syntax_errors,
    parse_snapshot,
    rank_candidates,
)

from .snippets import PROGRAMS

code_text = st.lists(
    st.sampled_from(
        [*"ab1 _=+,.:;()[]{}\"'`\n\t#/\\", "    ", "def ", "if ", "{\n", "}\n", "é", "😀", "TODO", "..."]
    ),
    max_size=60,
).map("".join)


@pytest.mark.parametrize("language", [*sorted(SUPPORTED), None])
@settings(max_examples=40, deadline=None)
@given(text=code_text, data=st.data())
def test_any_text_any_cursor(language, text, data):
    snap = parse_snapshot(text, language)
    offset = data.draw(st.integers(0, len(text)))
    end = data.draw(st.one_of(st.none(), st.integers(offset, len(text))))
    ctx = build_context(snap, offset, end_offset=end, max_prefix_tokens=8, max_suffix_tokens=4)
    stop = offset if end is None else end
    assert ctx.prefix.endswith(text[ctx.prefix_start : offset]) or ctx.span.name == "placeholder"
    assert ctx.suffix == text[stop : ctx.suffix_end]
    assert ctx.span.max_tokens > 0
    for issue in find_syntax_errors(snap):
        assert 0 <= issue.start <= issue.end <= len(text)
        assert 0 <= issue.repair_start <= issue.repair_end <= len(text)
    for ph in find_placeholders(snap):
        assert 0 <= ph.start < ph.end <= len(text) and text[ph.start : ph.end] == ph.text
    rank_candidates([("x", -1.0), (text[:5], -2.0)], ctx, snap)


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_every_cursor_of_a_real_program(language):
    text = PROGRAMS[language]
    snap = parse_snapshot(text, language)
    kinds = set()
    for offset in range(0, len(text) + 1, 3):
        ctx = build_context(snap, offset)
        assert ctx.prefix == text[:offset] and ctx.suffix == text[offset:]
        kinds.add(ctx.span.name)
    assert "line_rest" in kinds and len(kinds) >= 4, kinds


def test_empty_and_blank_documents():
    for language in [*sorted(SUPPORTED), None]:
        for text in ("", "\n", "\n\n   \n"):
            ctx = build_context(parse_snapshot(text, language), len(text))
            assert ctx.prefix == text and ctx.suffix == ""
