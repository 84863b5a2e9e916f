"""One incrementally updated tree-sitter tree per open document.

The server thread applies `didChange` edits; worker threads take immutable snapshots. A snapshot
owns its own `Tree` (trees are copied before `Tree.edit`, which mutates in place), so a worker can
keep reading an old snapshot while the server moves on.
"""

from __future__ import annotations

import bisect
import functools
import threading
from dataclasses import dataclass, field

import tree_sitter

from dg_lsp.context.languages import language_for, parser

_CHUNK = 2048
MAX_PARSE_CHARS = 1_000_000
"""Documents above this size are served with plain text windows: parsing them would stall typing."""


@dataclass(frozen=True, eq=False)
class DocumentSnapshot:
    text: str
    tree: tree_sitter.Tree | None
    language: str | None
    """Grammar name (see `language_for`), or None for plain text."""
    version: int = 0
    data: bytes = field(default=b"", repr=False)
    """`text` encoded as UTF-8: the bytes `tree` was parsed from (empty without a tree)."""

    @functools.cached_property
    def ascii(self) -> bool:
        """Byte offsets equal str offsets (the common case, which skips every conversion)."""
        return len(self.data) == len(self.text) if self.data else self.text.isascii()

    @functools.cached_property
    def _chunk_bytes(self) -> list[int]:
        """UTF-8 byte offset of every `_CHUNK`-th code point, so conversions touch one chunk only."""
        out = [0]
        for i in range(_CHUNK, len(self.text), _CHUNK):
            out.append(out[-1] + len(self.text[i - _CHUNK : i].encode("utf-8")))
        return out

    def to_byte(self, offset: int) -> int:
        if self.ascii:
            return offset
        k = min(offset // _CHUNK, len(self._chunk_bytes) - 1)
        return self._chunk_bytes[k] + len(self.text[k * _CHUNK : offset].encode("utf-8"))

    def to_char(self, byte: int) -> int:
        if self.ascii:
            return byte
        k = bisect.bisect_right(self._chunk_bytes, byte) - 1
        data = self.data or self.text.encode("utf-8")
        return k * _CHUNK + len(data[self._chunk_bytes[k] : byte].decode("utf-8", errors="replace"))


def parse_snapshot(text: str, language: str | None, version: int = 0) -> DocumentSnapshot:
    """Parse `text` from scratch (the stateless path used by tests, benchmarks and one-off requests)."""
    if language is None or len(text) > MAX_PARSE_CHARS:
        return DocumentSnapshot(text, None, language, version)
    data = text.encode("utf-8")
    return DocumentSnapshot(text, parser(language).parse(data), language, version, data)


def _point(text: str, offset: int) -> tuple[int, int]:
    """(row, UTF-8 byte column) of a str offset, as tree-sitter counts points."""
    row = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return row, len(text[line_start:offset].encode("utf-8"))


def edited_snapshot(old: DocumentSnapshot, start: int, old_end: int, new_text: str) -> DocumentSnapshot:
    """The snapshot after replacing `old.text[start:old_end]` by `new_text`, reparsed incrementally."""
    text = old.text[:start] + new_text + old.text[old_end:]
    version = old.version + 1
    if old.tree is None or old.language is None or len(text) > MAX_PARSE_CHARS:
        return parse_snapshot(text, old.language, version)
    start_byte = old.to_byte(start)
    old_end_byte = old.to_byte(old_end)
    new_end_byte = start_byte + len(new_text.encode("utf-8"))
    start_point = _point(old.text, start)
    old_end_point = _point(old.text, old_end)
    new_end_point = _point(text, start + len(new_text))
    tree = old.tree.copy()
    tree.edit(
        start_byte=start_byte,
        old_end_byte=old_end_byte,
        new_end_byte=new_end_byte,
        start_point=start_point,
        old_end_point=old_end_point,
        new_end_point=new_end_point,
    )
    data = text.encode("utf-8")
    return DocumentSnapshot(text, parser(old.language).parse(data, tree), old.language, version, data)


class DocumentTrees:
    """Open documents by URI. Thread-safe: every method takes the lock; snapshots are immutable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._docs: dict[str, DocumentSnapshot] = {}

    def open(self, uri: str, language_id: str | None, text: str) -> None:
        snap = parse_snapshot(text, language_for(language_id, uri))
        with self._lock:
            self._docs[uri] = snap

    def edit(self, uri: str, start: int, old_end: int, new_text: str) -> None:
        """Replace `text[start:old_end]` with `new_text` (str offsets), reusing the old tree."""
        with self._lock:
            old = self._docs.get(uri)
            if old is None:
                raise KeyError(uri)
            if not 0 <= start <= old_end <= len(old.text):
                raise ValueError(f"edit range {start}:{old_end} outside document of {len(old.text)} chars")
            self._docs[uri] = edited_snapshot(old, start, old_end, new_text)

    def replace(self, uri: str, text: str) -> None:
        with self._lock:
            old = self._docs.get(uri)
            language = old.language if old is not None else language_for(None, uri)
            version = old.version + 1 if old is not None else 0
            self._docs[uri] = parse_snapshot(text, language, version)

    def close(self, uri: str) -> None:
        with self._lock:
            self._docs.pop(uri, None)

    def snapshot(self, uri: str) -> DocumentSnapshot | None:
        with self._lock:
            return self._docs.get(uri)

    def __contains__(self, uri: object) -> bool:
        with self._lock:
            return uri in self._docs
