"""Token healing: a cursor in the middle of a word is a token boundary only for the user.

Typing `return self.ite` leaves the prompt ending in the token `ite`; a model trained on whole words then
continues as if `ite` were complete (`self.ites[-1]` in real VS Code). Healing takes that last token's
text back out of the prefix and makes the completion start with it: the first generated token must be
one whose text begins with `ite` (`items`, `item`, `iter`...), and the engine strips `ite` from what it
returns. Pure functions over the tokenizer's per-token texts, shared by the masked and AR engines.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

TAIL_CHARS = 256
"""Only the end of the prefix is tokenized to find its last token (from a line start within it)."""


def word_char(c: str) -> bool:
    return c.isalnum() or c == "_"


@dataclass(frozen=True)
class Healed:
    prefix: str
    """The prefix without its last token's text."""
    fragment: str
    """That text: every completion must start with it."""


class TokenIndex:
    """The vocabulary's token texts, sorted, for 'every token whose text starts with F' in O(log V + k)."""

    def __init__(self, texts: Sequence[str]):
        self.texts = list(texts)
        pairs = sorted((t, i) for i, t in enumerate(self.texts) if t)
        self._keys = [t for t, _ in pairs]
        self._ids = [i for _, i in pairs]

    def starting_with(self, fragment: str) -> list[int]:
        lo = bisect.bisect_left(self._keys, fragment)
        hi = bisect.bisect_left(self._keys, fragment + "\U0010ffff")
        return self._ids[lo:hi]


def heal(prefix: str, encode: Callable[[str], list[int]], index: TokenIndex) -> Healed | None:
    """The prefix's last token when the cursor sits right after a word character, else None. None also
    when the tokens' texts do not spell the prefix's end (a tokenizer whose per-token text is not the
    text it stands for, e.g. SentencePiece's dropped leading spaces): healing would then corrupt it."""
    if not prefix or not word_char(prefix[-1]):
        return None
    tail = prefix
    if len(prefix) > TAIL_CHARS:  # start at a line boundary, where the tokenizer starts a word too
        tail = prefix[-TAIL_CHARS:]
        tail = tail[tail.find("\n") + 1 :]
    ids = encode(tail)
    if not ids or any(not 0 <= i < len(index.texts) for i in ids):
        return None
    if "".join(index.texts[i] for i in ids) != tail:
        return None
    fragment = index.texts[ids[-1]]
    return Healed(prefix[: len(prefix) - len(fragment)], fragment) if fragment else None
