"""Position conversion (UTF-16, as LSP defines it) and change tracking, on real parse trees."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from lsprotocol import types

from dg_lsp.server.documents import Document, DocumentStore, changed_span


def test_utf16_positions_round_trip_with_astral_characters():
    doc = Document("file:///e.py", "python", 1, 's = "😀x"\nnext\n')
    # 😀 is one code point but two UTF-16 units: character 6 is its second half, 7 is "x".
    assert doc.offset_at(types.Position(line=0, character=5)) == 5
    assert doc.text[doc.offset_at(types.Position(line=0, character=7))] == "x"
    assert doc.position_at(doc.text.index("x")) == types.Position(line=0, character=7)
    assert doc.position_at(doc.text.index("next")) == types.Position(line=1, character=0)


def test_positions_outside_the_document_are_clamped():
    doc = Document("file:///e.py", "python", 1, "ab\ncd")
    assert doc.offset_at(types.Position(line=0, character=99)) == 2
    assert doc.offset_at(types.Position(line=42, character=0)) == len(doc.text)
    assert doc.position_at(10_000) == types.Position(line=1, character=2)


@given(st.text(max_size=60), st.text(max_size=60), st.text(max_size=60), st.text(max_size=20))
def test_changed_span_reconstructs_the_edit(head, middle, tail, replacement):
    old = head + middle + tail
    new = head + replacement + tail
    start, old_end, new_end = changed_span(old, new)
    assert old[:start] + new[start:new_end] + old[old_end:] == new
    assert old[:start] == new[:start]


def test_store_keeps_tree_in_sync_with_incremental_edits():
    store = DocumentStore()
    uri = "file:///s.py"
    store.open(uri, "python", 1, "def f(x):\n    return x\n")
    store.change(uri, 2, "def f(x, y):\n    return x\n")
    store.change(uri, 3, "def f(x, y):\n    return x + y\n")
    snap = store.snapshot(uri)
    assert snap.text == "def f(x, y):\n    return x + y\n"
    assert store.version(uri) == 3
    assert snap.tree is not None
    assert not snap.tree.root_node.has_error
    assert snap.tree.root_node.text.decode() == snap.text
    store.close(uri)
    assert store.get(uri) is None
