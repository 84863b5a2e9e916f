"""Draw (prefix, middle, suffix) triples from source files the way editors ask for infills.

Middles are cut at character level and the three parts are tokenized separately afterwards,
exactly as the engine tokenizes a request, so token boundaries at the cursor match inference.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SPAN_KINDS = ("rest_of_line", "lines", "block", "span", "empty")


@dataclass(frozen=True)
class Fim:
    prefix: str
    middle: str
    suffix: str
    kind: str


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            starts.append(i + 1)
    return starts


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _rest_of_line(text: str, starts: list[int], rng: random.Random) -> tuple[int, int] | None:
    for _ in range(8):
        i = rng.randrange(len(starts))
        end = text.find("\n", starts[i])
        end = len(text) if end < 0 else end
        line = text[starts[i] : end]
        if not line.strip():
            continue
        lo = starts[i] + _indent(line)
        return rng.randrange(lo, end), end
    return None


def _lines(text: str, starts: list[int], rng: random.Random) -> tuple[int, int] | None:
    i = rng.randrange(len(starts) - 1) if len(starts) > 1 else 0
    k = rng.choice((1, 1, 2, 3))
    j = min(len(starts) - 1, i + k)
    a, b = starts[i], starts[j] if j > i else len(text)
    line = text[a:b]
    if rng.random() < 0.5:  # cursor after the indentation, as after pressing Enter
        a += _indent(line)
    return a, b


def _block(text: str, starts: list[int], rng: random.Random) -> tuple[int, int] | None:
    openers = [
        i for i in range(len(starts) - 1)
        if text[starts[i] : starts[i + 1]].rstrip().endswith((":", "{"))
    ]  # fmt: skip
    if not openers:
        return None
    i = rng.choice(openers)
    head = text[starts[i] : starts[i + 1]]
    base = _indent(head)
    j = i + 1
    while j < len(starts) - 1 and j - i <= 12:
        line = text[starts[j] : starts[j + 1]]
        if line.strip() and _indent(line) <= base:
            break
        j += 1
    if j == i + 1:
        return None
    a = starts[i + 1]
    return a + _indent(text[a : starts[i + 2]]), starts[j]


def _span(text: str, rng: random.Random) -> tuple[int, int]:
    n = min(len(text), max(1, int(rng.expovariate(1 / 40))))
    a = rng.randrange(0, len(text) - n + 1)
    return a, a + n


def sample_fim(text: str, rng: random.Random, weights: dict[str, float]) -> Fim:
    """One infill example from `text`; falls back to a random span when a kind does not apply."""
    kinds = [k for k in SPAN_KINDS if weights.get(k, 0) > 0]
    kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
    starts = _line_starts(text)
    cut = None
    if kind == "rest_of_line":
        cut = _rest_of_line(text, starts, rng)
    elif kind == "lines":
        cut = _lines(text, starts, rng)
    elif kind == "block":
        cut = _block(text, starts, rng)
    elif kind == "empty":
        a = rng.randrange(len(text) + 1)
        cut = (a, a)
    if cut is None:
        kind, cut = "span", _span(text, rng)
    a, b = cut
    return Fim(text[:a], text[a:b], text[b:], kind)
