"""Placeholders a "Fill placeholder" code action can replace: `...`, a lone `pass`, TODO/FIXME
comments, `/* fill */`-style markers and Rust's `todo!()` / `unimplemented!()`.

Candidates are found with a regex over the text (fast on big files) and confirmed with the tree, so
that a `...` or `TODO` inside a string, or a `pass` next to real statements, is not offered.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from dg_lsp.context.documents import DocumentSnapshot
from dg_lsp.context.languages import LINE_COMMENT
from dg_lsp.context.spans import ancestors, is_comment, is_string, statements

_ELLIPSIS = re.compile(r"[ \t]*(\.\.\.|…)[ \t]*;?[ \t]*$")
_PASS = re.compile(r"[ \t]*(pass)[ \t]*(#.*)?$")
_MACRO = re.compile(r"\b(todo|unimplemented)!\s*\([^()\n]*\)")
_MARKER = re.compile(r"\b(TODO|FIXME)\b|(#|//|--|/\*)[ \t*]*fill\b", re.IGNORECASE)
_FILL = re.compile(r"^(/\*+|//+|#+|--+)\s*(fill|fill in|fill me|fill here)\s*(\*+/)?$", re.IGNORECASE)
_TODO = re.compile(r"\b(TODO|FIXME)\b")


@dataclass(frozen=True)
class Placeholder:
    start: int
    end: int
    """`text[start:end]` is what the fill replaces."""
    kind: str
    """`ellipsis`, `pass`, `todo` (TODO/FIXME comment), `fill` (`/* fill */`) or `todo_macro`."""
    text: str


def _node_at(snapshot: DocumentSnapshot, offset: int):
    b = snapshot.to_byte(offset)
    return snapshot.tree.root_node.descendant_for_byte_range(b, b + 1)  # type: ignore[union-attr]


def _in_string_or_comment(snapshot: DocumentSnapshot, offset: int) -> bool:
    return any(is_string(a) or is_comment(a) for a in ancestors(_node_at(snapshot, offset)))


def _alone_on_line(text: str, start: int) -> bool:
    return not text[text.rfind("\n", 0, start) + 1 : start].strip()


def _lines_with(text: str, needles: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(start, text) of every line containing one of `needles`, in order: `str.find` runs at C speed
    where a line-anchored regex over a whole file would not."""
    starts: set[int] = set()
    for needle in needles:
        i = text.find(needle)
        while i >= 0:
            starts.add(text.rfind("\n", 0, i) + 1)
            line_end = text.find("\n", i)
            if line_end < 0:
                break
            i = text.find(needle, line_end)
    for start in sorted(starts):
        end = text.find("\n", start)
        yield start, text[start : len(text) if end < 0 else end]


def find_placeholders(snapshot: DocumentSnapshot) -> list[Placeholder]:
    text = snapshot.text
    if snapshot.tree is None:
        return _text_only(snapshot)
    found: dict[int, Placeholder] = {}

    for line_start, line in _lines_with(text, ("...", "…")):
        m = _ELLIPSIS.match(line)
        if m and not _in_string_or_comment(snapshot, line_start + m.start(1)):
            start = line_start + m.start(1)
            found[start] = Placeholder(start, line_start + m.end(1), "ellipsis", m.group(1))

    if snapshot.language == "python":
        for line_start, line in _lines_with(text, ("pass",)):
            m = _PASS.match(line)
            if not m:
                continue
            start = line_start + m.start(1)
            stmt = next((a for a in ancestors(_node_at(snapshot, start)) if a.type == "pass_statement"), None)
            block = stmt.parent if stmt is not None else None
            if block is not None and block.type == "block" and [s.id for s in statements(block)] == [stmt.id]:
                found[start] = Placeholder(start, start + 4, "pass", "pass")

    if snapshot.language == "rust":
        for line_start, line in _lines_with(text, ("todo!", "unimplemented!")):
            for m in _MACRO.finditer(line):
                start = line_start + m.start()
                if not _in_string_or_comment(snapshot, start):
                    found[start] = Placeholder(start, line_start + m.end(), "todo_macro", m.group(0))

    seen_comments: set[int] = set()
    for line_start, line in _lines_with(text, ("TODO", "FIXME", "fill", "Fill", "FILL")):
        for m in _MARKER.finditer(line):
            node = _node_at(snapshot, line_start + m.start())
            comment = next((a for a in ancestors(node) if is_comment(a)), None)
            while comment is not None and comment.parent is not None and is_comment(comment.parent):
                comment = comment.parent  # Lua: `comment_content` inside `comment`
            if comment is None or comment.id in seen_comments:
                continue
            seen_comments.add(comment.id)
            start, end = snapshot.to_char(comment.start_byte), snapshot.to_char(comment.end_byte)
            body = text[start:end].rstrip("\n")
            end = start + len(body)
            if _FILL.match(body.strip()):
                found[start] = Placeholder(start, end, "fill", body)
            elif _TODO.search(body) and _alone_on_line(text, start):
                found[start] = Placeholder(start, end, "todo", body)
    return [found[k] for k in sorted(found)]


def _text_only(snapshot: DocumentSnapshot) -> list[Placeholder]:
    """Without a tree (plain text, huge file): only line comments that are TODO/FIXME/fill markers."""
    marker = LINE_COMMENT.get(snapshot.language)
    if marker is None:
        return []
    out = []
    pattern = re.compile(rf"^[ \t]*({re.escape(marker)}.*)$", re.MULTILINE)
    for m in pattern.finditer(snapshot.text):
        body = m.group(1).rstrip()
        if _FILL.match(body.strip()):
            out.append(Placeholder(m.start(1), m.start(1) + len(body), "fill", body))
        elif _TODO.search(body):
            out.append(Placeholder(m.start(1), m.start(1) + len(body), "todo", body))
    return out
