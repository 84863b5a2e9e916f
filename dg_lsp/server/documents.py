"""Open documents: text, version, language, parse tree, and LSP position ↔ offset conversion.

LSP positions count UTF-16 code units; Python strings count code points. Every conversion goes
through `Document`, clamping out-of-range positions to the nearest valid place instead of failing,
because editors do send positions past the end during fast edits.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

from lsprotocol import types

from dg_lsp import context


@dataclass
class Document:
    uri: str
    language_id: str
    version: int
    text: str
    _line_starts: list[int] | None = field(default=None, repr=False)

    @property
    def line_starts(self) -> list[int]:
        if self._line_starts is None:
            starts = [0]
            find = self.text.find
            i = find("\n")
            while i != -1:
                starts.append(i + 1)
                i = find("\n", i + 1)
            self._line_starts = starts
        return self._line_starts

    def offset_at(self, position: types.Position) -> int:
        starts = self.line_starts
        if position.line < 0:
            return 0
        if position.line >= len(starts):
            return len(self.text)
        start = starts[position.line]
        end = starts[position.line + 1] - 1 if position.line + 1 < len(starts) else len(self.text)
        line = self.text[start:end]
        if line.endswith("\r"):
            line = line[:-1]
        units = max(0, position.character)
        col = 0
        for ch in line:
            width = 2 if ord(ch) > 0xFFFF else 1
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
        return types.Position(line=line, character=len(prefix.encode("utf-16-le")) // 2)


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
    """Documents by URI, safe to read from the worker thread while the event loop edits."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self._lock = threading.Lock()
        self.trees = context.DocumentTrees()

    def open(self, uri: str, language_id: str, version: int, text: str) -> None:
        with self._lock:
            self._docs[uri] = Document(uri, language_id, version, text)
        self.trees.open(uri, language_id, text)

    def change(self, uri: str, version: int, text: str) -> None:
        with self._lock:
            doc = self._docs.get(uri)
            if doc is None:
                return
            old = doc.text
            self._docs[uri] = Document(uri, doc.language_id, version, text)
        start, old_end, new_end = changed_span(old, text)
        self.trees.edit(uri, start, old_end, text[start:new_end])

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
