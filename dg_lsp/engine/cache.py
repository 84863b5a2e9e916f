"""Per-document caches: reusable prompt state (encoder/KV) and the suggestion currently shown.

Both are keyed by `InfillRequest.doc_key`, bounded LRU, and hold no model code: backends decide what
a prompt entry contains; this module only decides when it can be reused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class LRU(Generic[T]):
    """A small bounded mapping; one entry per open document is plenty."""

    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._data: OrderedDict[str, T] = OrderedDict()

    def get(self, key: str | None) -> T | None:
        if key is None or key not in self._data:
            return None
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: str | None, value: T) -> None:
        if key is None or self.capacity <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def pop(self, key: str | None) -> None:
        if key is not None:
            self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


@dataclass(frozen=True)
class Shown:
    prefix: str
    suffix: str
    texts: tuple[str, ...]


class ContinuationCache:
    """Serves the rest of a shown suggestion while the user types it, without any forward pass.

    Valid only when the suffix is unchanged and the newly typed characters are a prefix of a shown
    candidate; anything else (deletions, edits after the cursor, divergence) is a miss.
    """

    def __init__(self, capacity: int = 8):
        self._lru: LRU[Shown] = LRU(capacity)

    def remember(self, doc_key: str | None, prefix: str, suffix: str, texts: Sequence[str]) -> None:
        texts = tuple(t for t in texts if t)
        if texts:
            self._lru.put(doc_key, Shown(prefix, suffix, texts))
        else:
            self._lru.pop(doc_key)

    def lookup(self, doc_key: str | None, prefix: str, suffix: str) -> list[str] | None:
        shown = self._lru.get(doc_key)
        if shown is None or suffix != shown.suffix or not prefix.startswith(shown.prefix):
            return None
        typed = prefix[len(shown.prefix) :]
        if not typed:
            return None  # same position: the caller asked again on purpose (e.g. different settings)
        rest = [t[len(typed) :] for t in shown.texts if t.startswith(typed) and len(t) > len(typed)]
        return rest or None

    def forget(self, doc_key: str | None) -> None:
        self._lru.pop(doc_key)

    def resize(self, capacity: int) -> None:
        """Grow to at least `capacity` documents (never shrinks: entries are cheap text)."""
        self._lru.capacity = max(self._lru.capacity, capacity)

    def clear(self) -> None:
        self._lru.clear()
