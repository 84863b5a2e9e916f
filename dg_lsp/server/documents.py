"""Open documents: text, version, language, parse tree, and LSP position ↔ offset conversion.

LSP positions count UTF-16 code units; Python strings count code points. Every conversion goes
through `Document`, clamping out-of-range positions to the nearest valid place instead of failing,
because editors do send positions past the end during fast edits.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
from dataclasses import dataclass, field

from lsprotocol import types

from dg_lsp import context

log = logging.getLogger(__name__)


_TERMINATOR = re.compile(r"\r\n|\r|\n")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Replace lone UTF-16 surrogates (legal in JSON strings) by U+FFFD.

    Such text cannot be encoded as UTF-8 for tree-sitter or the tokenizer. The replacement has the
    same width in UTF-16 and in code points, so every position the client computes stays valid.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)
    return text


def _units(ch: str, encoding: str) -> int:
    code = ord(ch)
    if encoding == "utf-8":
        return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4
    if encoding == "utf-32":
        return 1
    return 2 if code > 0xFFFF else 1


@dataclass
class Document:
    uri: str
    language_id: str
    version: int
    text: str
    encoding: str = "utf-16"
    """The position encoding negotiated at `initialize` (LSP's default is UTF-16 code units)."""
    _line_starts: list[int] | None = field(default=None, repr=False)

    @property
    def line_starts(self) -> list[int]:
        """Offsets where lines start; LSP ends lines at \\n, \\r\\n and a lone \\r."""
        if self._line_starts is None:
            text = self.text
            if "\r" in text:
                starts = [0] + [m.end() for m in _TERMINATOR.finditer(text)]
            else:
                starts = [0]
                find = text.find
                i = find("\n")
                while i != -1:
                    starts.append(i + 1)
                    i = find("\n", i + 1)
            self._line_starts = starts
        return self._line_starts

    def _line(self, index: int) -> tuple[int, str]:
        starts = self.line_starts
        start = starts[index]
        end = starts[index + 1] if index + 1 < len(starts) else len(self.text)
        line = self.text[start:end]
        if line.endswith("\n"):
            line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
        return start, line

    def offset_at(self, position: types.Position) -> int:
        """Clamp, never fail: editors send positions past the end during fast edits."""
        starts = self.line_starts
        if position.line < 0:
            return 0
        if position.line >= len(starts):
            return len(self.text)
        start, line = self._line(position.line)
        units = max(0, position.character)
        if line.isascii():
            return start + min(units, len(line))
        col = 0
        for ch in line:
            width = _units(ch, self.encoding)
            if units < width:
                break
            units -= width
            col += 1
        return start + col

    def position_at(self, offset: int) -> types.Position:
        offset = max(0, min(offset, len(self.text)))
        starts = self.line_starts
        line = bisect.bisect_right(starts, offset) - 1
        prefix = self.text[starts[line] : offset]
        if prefix.isascii() or self.encoding == "utf-32":
            character = len(prefix)
        elif self.encoding == "utf-8":
            character = len(prefix.encode("utf-8", "surrogatepass"))
        else:
            character = len(prefix.encode("utf-16-le", "surrogatepass")) // 2
        return types.Position(line=line, character=character)

    def apply(self, change: object) -> tuple[str, int, int, str]:
        """Text after one `contentChanges` entry, and the (start, old_end, inserted) it replaced."""
        new_text = clean_text(getattr(change, "text", "") or "")
        change_range = getattr(change, "range", None)
        if change_range is None:  # whole-document change
            return new_text, 0, len(self.text), new_text
        start = self.offset_at(change_range.start)
        end = self.offset_at(change_range.end)
        if end < start:  # a reversed range from a confused client: replace what it spans
            start, end = end, start
        return self.text[:start] + new_text + self.text[end:], start, end, new_text


def changed_span(old: str, new: str) -> tuple[int, int, int]:
    """(start, old_end, new_end) of the one region where `old` and `new` differ.

    Binary search on slice equality keeps this at O(n log n) memcmp work, fast for 10 MB buffers,
    and lets the parse tree be edited incrementally whatever mix of changes the client sent.
    """
    limit = min(len(old), len(new))
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if old[:mid] == new[:mid]:
            lo = mid
        else:
            hi = mid - 1
    start = lo
    lo, hi = 0, limit - start
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if old[len(old) - mid :] == new[len(new) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return start, len(old) - lo, len(new) - lo


class DocumentStore:
    """Documents by URI, safe to read from the worker thread while the event loop edits.

    The text is kept here and edited here (not in pygls's workspace): one conversion of LSP positions
    for edits and requests alike, so the server's view of a document cannot drift from what it
    answers about. Only text the client sent is ever held; nothing is read from disk.
    """

    def __init__(self, encoding: str = "utf-16") -> None:
        self._docs: dict[str, Document] = {}
        self._lock = threading.Lock()
        self.trees = context.DocumentTrees()
        self.encoding = encoding

    def open(self, uri: str, language_id: str, version: int, text: str) -> None:
        text = clean_text(text)
        try:
            self.trees.open(uri, language_id, text)
        except Exception:  # a parser failure must not lose the document: serve it without a tree
            log.exception("could not parse %s; serving it as plain text", uri)
            self.trees.open(uri, "plaintext", text)
        with self._lock:
            self._docs[uri] = Document(uri, language_id, version, text, self.encoding)

    def change(self, uri: str, version: int, text: str) -> None:
        """Replace the whole text of an open document (unknown URIs are ignored)."""
        with self._lock:
            doc = self._docs.get(uri)
            if doc is None:
                return
            old = doc.text
            text = clean_text(text)
            self._docs[uri] = Document(uri, doc.language_id, version, text, self.encoding)
        start, old_end, new_end = changed_span(old, text)
        self._edit_tree(uri, start, old_end, text[start:new_end], text)

    def apply_changes(self, uri: str, version: int, changes: list) -> bool:
        """Apply `didChange` content changes in order; False when the document is not open."""
        with self._lock:
            doc = self._docs.get(uri)
        if doc is None:
            return False
        old = doc.text
        edit: tuple[int, int, str] | None = None
        for change in changes:
            text, start, end, inserted = doc.apply(change)
            edit = (start, end, inserted) if edit is None and len(changes) == 1 else None
            doc = Document(uri, doc.language_id, version, text, self.encoding)
        with self._lock:
            if uri not in self._docs:
                return False
            self._docs[uri] = doc
        if edit is None:
            start, old_end, new_end = changed_span(old, doc.text)
            edit = (start, old_end, doc.text[start:new_end])
        self._edit_tree(uri, *edit, doc.text)
        return True

    def _edit_tree(self, uri: str, start: int, old_end: int, inserted: str, text: str) -> None:
        try:
            self.trees.edit(uri, start, old_end, inserted)
        except Exception:  # keep the tree in step with the text whatever the incremental path did
            log.exception("incremental parse failed for %s; reparsing", uri)
            self.trees.replace(uri, text)

    def close(self, uri: str) -> None:
        with self._lock:
            self._docs.pop(uri, None)
        self.trees.close(uri)

    def get(self, uri: str) -> Document | None:
        with self._lock:
            return self._docs.get(uri)

    def version(self, uri: str) -> int | None:
        doc = self.get(uri)
        return doc.version if doc else None

    def snapshot(self, uri: str) -> context.DocumentSnapshot | None:
        return self.trees.snapshot(uri)

    def __len__(self) -> int:
        with self._lock:
            return len(self._docs)
