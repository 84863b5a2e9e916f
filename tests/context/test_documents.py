"""Incremental trees: every edit must give the same tree as parsing the new text from scratch."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dg_lsp.context import MAX_PARSE_CHARS, SUPPORTED, DocumentTrees, language_for, parse_snapshot

from .snippets import PROGRAMS


def _sexp(snapshot) -> str:
    return str(snapshot.tree.root_node)


@pytest.mark.parametrize(
    ("language_id", "uri", "expected"),
    [
        ("python", None, "python"),
        ("javascriptreact", None, "javascript"),
        ("typescriptreact", None, "tsx"),
        ("typescript", None, "typescript"),
        ("shellscript", None, "bash"),
        ("cpp", None, "cpp"),
        (None, "file:///src/main.rs", "rust"),
        (None, "file:///src/App.TSX", "tsx"),
        ("plaintext", "file:///x/util.go", "go"),
        (None, "file:///home/me/.bashrc", "bash"),
        ("markdown", "file:///README.md", None),
        (None, None, None),
    ],
)
def test_language_for(language_id, uri, expected):
    assert language_for(language_id, uri) == expected


def test_every_program_parses_cleanly():
    assert set(PROGRAMS) == SUPPORTED
    for language, text in PROGRAMS.items():
        snap = parse_snapshot(text, language)
        assert snap.tree is not None and not snap.tree.root_node.has_error, language


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_incremental_edits_match_a_fresh_parse(language):
    text = PROGRAMS[language]
    trees = DocumentTrees()
    trees.open("file:///doc", language, text)
    # type a new line in the middle, one character at a time, then delete a range
    at = text.index("\n", len(text) // 2) + 1
    for i, ch in enumerate("x = foo(1, 'é')\n"):
        trees.edit("file:///doc", at + i, at + i, ch)
    trees.edit("file:///doc", 0, 10, "")
    snap = trees.snapshot("file:///doc")
    assert snap.version == 17
    fresh = parse_snapshot(snap.text, language)
    assert snap.text == fresh.text
    assert _sexp(snap) == _sexp(fresh)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(0, 8), st.text("ab(){}:é\n ", max_size=6)), max_size=12
    )
)
def test_random_edit_sequences_match_a_fresh_parse(edits):
    text = PROGRAMS["python"]
    trees = DocumentTrees()
    trees.open("file:///p.py", "python", text)
    for pos, length, new in edits:
        start = pos % (len(text) + 1)
        end = min(start + length, len(text))
        trees.edit("file:///p.py", start, end, new)
        text = text[:start] + new + text[end:]
    snap = trees.snapshot("file:///p.py")
    assert snap.text == text
    assert _sexp(snap) == _sexp(parse_snapshot(text, "python"))


def test_snapshots_are_immutable_while_edits_continue():
    trees = DocumentTrees()
    trees.open("file:///a.py", "python", PROGRAMS["python"])
    old = trees.snapshot("file:///a.py")
    old_sexp = _sexp(old)
    trees.edit("file:///a.py", 0, 0, "def broken(:\n")
    assert _sexp(old) == old_sexp and not old.tree.root_node.has_error
    assert trees.snapshot("file:///a.py").tree.root_node.has_error


def test_edits_from_one_thread_and_reads_from_another():
    trees = DocumentTrees()
    uri = "file:///t.go"
    trees.open(uri, "go", PROGRAMS["go"])
    errors: list[Exception] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                snap = trees.snapshot(uri)
                assert snap.tree.root_node.end_byte == len(snap.text.encode())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(200):
        at = len(trees.snapshot(uri).text) - 2
        trees.edit(uri, at, at, f"\n// line {i}" if i % 2 else "x")
    stop.set()
    thread.join()
    assert not errors


def test_replace_close_and_unknown_uri():
    trees = DocumentTrees()
    trees.open("file:///a.c", None, "int main(void) { return 0; }\n")
    assert trees.snapshot("file:///a.c").language == "c"
    trees.replace("file:///a.c", "int x = ;\n")
    assert trees.snapshot("file:///a.c").tree.root_node.has_error
    trees.close("file:///a.c")
    assert trees.snapshot("file:///a.c") is None and "file:///a.c" not in trees
    with pytest.raises(KeyError):
        trees.edit("file:///a.c", 0, 0, "x")


def test_huge_documents_and_plain_text_have_no_tree():
    trees = DocumentTrees()
    big = "x = 1\n" * (MAX_PARSE_CHARS // 6 + 1)
    trees.open("file:///big.py", "python", big)
    snap = trees.snapshot("file:///big.py")
    assert snap.tree is None and snap.language == "python"
    trees.edit("file:///big.py", 0, 0, "y = 2\n")
    assert trees.snapshot("file:///big.py").text.startswith("y = 2\nx = 1")
    trees.open("file:///notes.txt", "plaintext", "hello")
    assert trees.snapshot("file:///notes.txt").tree is None


@settings(max_examples=30, deadline=None)
@given(st.text(st.sampled_from(["a", "é", "😀", "\n", "中", " "]), max_size=4500), st.data())
def test_non_ascii_offsets_are_code_points(text, data):
    snap = parse_snapshot(text, "python")
    offset = data.draw(st.integers(0, len(text)))
    byte = len(text[:offset].encode())
    assert snap.to_byte(offset) == byte and snap.to_char(byte) == offset
    assert snap.to_byte(len(text)) == len(text.encode())
