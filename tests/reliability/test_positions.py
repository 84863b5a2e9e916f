"""LSP positions ↔ offsets for every negotiable encoding and every LSP line ending, and edits.

The server converts with `Document` alone (pygls's text store is bypassed), so these are the rules
every request and every didChange follow.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types

from dg_lsp.server.documents import Document, DocumentStore, clean_text

TEXT = "a😀b\r\nxé\rq\n𝕏z"


def _pos(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


@pytest.mark.parametrize(
    ("encoding", "after_emoji", "after_e_acute"),
    [("utf-16", 3, 2), ("utf-8", 5, 3), ("utf-32", 2, 2)],
)
def test_offsets_in_each_encoding(encoding, after_emoji, after_e_acute):
    doc = Document("u", "python", 1, TEXT, encoding)
    assert doc.line_starts == [0, 5, 8, 10]  # \r\n, lone \r and \n all end lines
    assert doc.offset_at(_pos(0, after_emoji)) == 2
    assert doc.offset_at(_pos(1, after_e_acute)) == 7
    assert doc.offset_at(_pos(2, 99)) == 9  # clamped before the line end
    assert doc.offset_at(_pos(9, 0)) == len(TEXT)
    assert doc.position_at(2) == _pos(0, after_emoji)
    assert doc.position_at(len(TEXT)) == _pos(3, {"utf-16": 3, "utf-8": 5, "utf-32": 2}[encoding])


def test_inside_a_surrogate_pair_rounds_down():
    doc = Document("u", "python", 1, "😀x")
    assert doc.offset_at(_pos(0, 1)) == 0
    assert doc.offset_at(_pos(0, 2)) == 1


def test_lone_surrogates_become_replacement_characters_of_the_same_width():
    assert clean_text("a\ud83db\udc00") == "a\ufffdb\ufffd"
    assert clean_text("a😀") == "a😀"
    store = DocumentStore()
    store.open("file:///s.py", "python", 1, "x = '\ud83d'\n")
    assert store.get("file:///s.py").text == "x = '\ufffd'\n"
    assert store.snapshot("file:///s.py").text == "x = '\ufffd'\n"


class _Change:
    def __init__(self, start: types.Position | None, end: types.Position | None, text: str) -> None:
        self.range = None if start is None else types.Range(start=start, end=end)
        self.text = text


@settings(max_examples=150, deadline=None)
@given(
    base=st.text(alphabet=st.sampled_from(list("ab \n\r😀é{}")), max_size=40),
    edits=st.lists(
        st.tuples(
            st.integers(0, 45), st.integers(0, 45), st.text(st.sampled_from(list("xy\n😀")), max_size=4)
        ),
        max_size=5,
    ),
)
def test_store_edits_match_plain_string_edits(base, edits):
    """The store (text and parse tree) equals slicing the client's string, for any edit sequence."""
    store = DocumentStore()
    store.open("file:///e.py", "python", 1, base)
    expected = base
    for version, (a, b, new) in enumerate(edits, start=2):
        a, b = sorted((min(a, len(expected)), min(b, len(expected))))
        doc = store.get("file:///e.py")
        change = _Change(doc.position_at(a), doc.position_at(b), new)
        # position_at may land between \r and \n; the client's view is that same offset.
        a2, b2 = doc.offset_at(change.range.start), doc.offset_at(change.range.end)
        expected = expected[:a2] + new + expected[b2:]
        assert store.apply_changes("file:///e.py", version, [change])
        assert store.get("file:///e.py").text == expected
        assert store.snapshot("file:///e.py").text == expected
    assert store.apply_changes("file:///e.py", 99, [_Change(None, None, "whole")])
    assert store.get("file:///e.py").text == "whole" == store.snapshot("file:///e.py").text
    assert not store.apply_changes("file:///never-opened.py", 2, [_Change(None, None, "x")])
