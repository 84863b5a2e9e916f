"""Prefix and suffix windows within a token budget, cut at statement/definition boundaries.

When the prefix is cut, the imports and the headers of the enclosing classes/functions that fell out
of the window are put back above it, so the model still sees what scope the cursor is in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tree_sitter

from dg_lsp.context.documents import DocumentSnapshot
from dg_lsp.context.spans import DEFINITION_TYPES, ancestors, body_of

CHARS_PER_TOKEN = 3.5
"""Cheap token estimate for code with a BPE vocabulary; no tokenizer needed to size windows."""

IMPORT_TYPES = frozenset(
    {
        "import_statement",
        "import_from_statement",
        "future_import_statement",  # python, js/ts
        "import_declaration",
        "package_clause",  # go
        "use_declaration",
        "extern_crate_declaration",  # rust
        "preproc_include",
        "using_declaration",
        "alias_declaration",  # c/cpp
        "package_declaration",  # java
    }
)
HEADER_CHARS = 400
"""A header longer than this (a huge signature) is cut to its first line."""


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def budget_chars(tokens: int) -> int:
    return int(tokens * CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Windows:
    prefix: str
    suffix: str
    prefix_start: int
    """Document offset where the contiguous part of the prefix starts (after kept imports/headers)."""
    suffix_end: int
    headers: tuple[str, ...] = ()
    """Kept imports and enclosing headers, in document order, that precede the contiguous prefix."""


def _line_start(text: str, offset: int) -> int:
    return text.rfind("\n", 0, offset) + 1


def _first_child_ending_after(node: tree_sitter.Node, byte: int) -> tree_sitter.Node | None:
    """What `Node.first_child_for_byte` should return: py-tree-sitter 0.26.1 segfaults when no child
    ends after `byte` (it returns the null node unchecked), so that method is not used."""
    return next((c for c in node.children if c.end_byte > byte), None)


def _line_aligned_start(snapshot: DocumentSnapshot, node: tree_sitter.Node | None) -> int | None:
    """Start of the first node from `node` on (siblings) that begins its own line."""
    text = snapshot.text
    while node is not None:
        start = snapshot.to_char(node.start_byte)
        ls = _line_start(text, start)
        if not text[ls:start].strip():
            return ls
        node = node.next_sibling
    return None


def _boundary_after(snapshot: DocumentSnapshot, cut: int, slack: int) -> int:
    """A line-starting statement/definition boundary at or after `cut`.

    Descends from the root through the nodes that contain `cut`; at each level the next sibling is
    a boundary. The outermost one within `slack` chars of `cut` wins, so the window starts at a
    top-level definition rather than deep inside an unrelated block whenever that costs little.
    """
    text = snapshot.text
    fallback = text.find("\n", cut)
    fallback = len(text) if fallback < 0 else fallback + 1
    if snapshot.tree is None:
        return fallback
    cut_b = snapshot.to_byte(cut)
    node = snapshot.tree.root_node
    best = None  # the closest boundary seen so far (deeper levels are closer)
    while True:
        child = _first_child_ending_after(node, cut_b)
        if child is None:
            break
        if child.start_byte >= cut_b:
            best = _line_aligned_start(snapshot, child) or best
            break
        found = _line_aligned_start(snapshot, child.next_sibling)
        if found is not None:
            if found - cut <= slack:
                return found
            best = found
        if child.child_count == 0:
            break
        node = child
    # a boundary that would waste much of the budget is worse than a plain line start
    return best if best is not None and best - cut <= 2 * slack else fallback


def _boundary_before(snapshot: DocumentSnapshot, cut: int) -> int:
    """End (a line end) of the last statement/definition that ends at or before `cut`."""
    text = snapshot.text
    fallback = text.rfind("\n", 0, cut)
    if snapshot.tree is None or fallback < 0:
        return max(fallback, 0)
    cut_b = snapshot.to_byte(cut)
    node = snapshot.tree.root_node
    while True:
        child = _first_child_ending_after(node, cut_b)
        if child is None:
            return fallback
        if child.start_byte >= cut_b:
            end = text.rfind("\n", 0, snapshot.to_char(child.start_byte))
            return max(end, 0)
        if child.child_count == 0:
            return fallback
        node = child


def _header(snapshot: DocumentSnapshot, node: tree_sitter.Node) -> str | None:
    body = body_of(node)
    if body is None:
        return None
    text = snapshot.text
    start = _line_start(text, snapshot.to_char(node.start_byte))
    body_start = snapshot.to_char(body.start_byte)
    if text.startswith("{", body_start):
        body_start += 1
    header = text[start:body_start].rstrip()
    if len(header) > HEADER_CHARS:
        header = header.split("\n", 1)[0][:HEADER_CHARS]
    return header or None


def _imports(snapshot: DocumentSnapshot, before: int, budget: int) -> list[str]:
    if snapshot.tree is None:
        return []
    text = snapshot.text
    out: list[str] = []
    used = 0
    for child in snapshot.tree.root_node.children:
        start = snapshot.to_char(child.start_byte)
        if start >= before:
            break
        is_import = child.type in IMPORT_TYPES or (
            snapshot.language == "lua"
            and child.type == "variable_declaration"
            and "require" in text[start : snapshot.to_char(child.end_byte)]
        )
        if not is_import:
            continue
        end = snapshot.to_char(child.end_byte)
        piece = text[_line_start(text, start) : end]
        if used + len(piece) + 1 > budget:
            break
        out.append(piece)
        used += len(piece) + 1
    return out


def _enclosing_headers(snapshot: DocumentSnapshot, offset: int) -> list[tuple[int, str]]:
    """(start offset, header) of definitions enclosing `offset`, outermost first."""
    if snapshot.tree is None:
        return []
    b = snapshot.to_byte(offset)
    node = snapshot.tree.root_node.descendant_for_byte_range(b, b)
    out = []
    for anc in ancestors(node):
        if anc.type in DEFINITION_TYPES and anc.start_byte < b:
            header = _header(snapshot, anc)
            if header is not None:
                out.append((_line_start(snapshot.text, snapshot.to_char(anc.start_byte)), header))
    out.reverse()
    return out


def build_windows(
    snapshot: DocumentSnapshot, start: int, end: int, max_prefix_tokens: int, max_suffix_tokens: int
) -> Windows:
    """Prefix ending at `start` and suffix starting at `end`, each within its token budget."""
    text = snapshot.text
    cursor_line = _line_start(text, start)
    budget = budget_chars(max_prefix_tokens)
    headers: list[str] = []
    if start <= budget:
        prefix_start = 0
    else:
        prefix_start = min(_boundary_after(snapshot, start - budget, budget // 4), cursor_line)
        enclosing = _enclosing_headers(snapshot, start)
        imports = _imports(snapshot, prefix_start, budget // 4)
        kept = _fit([h for s, h in enclosing if s < prefix_start], budget // 4)
        spent = sum(len(h) + 1 for h in [*imports, *kept]) + (1 if imports else 0)
        if spent:
            # make room for them; a later start may drop more headers out of the window
            window = max(budget - spent, 0)
            prefix_start = min(_boundary_after(snapshot, start - window, window // 4), cursor_line)
            kept = _fit([h for s, h in enclosing if s < prefix_start], budget // 4)
        headers = [*imports, "", *kept] if imports else kept
    body = text[prefix_start:start]
    prefix = "\n".join([*headers, body]) if headers else body

    suffix_budget = budget_chars(max_suffix_tokens)
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    if len(text) - end <= suffix_budget:
        suffix_end = len(text)
    else:
        suffix_end = max(_boundary_before(snapshot, end + suffix_budget), line_end)
    return Windows(prefix, text[end:suffix_end], prefix_start, suffix_end, tuple(headers))


def _fit(headers: list[str], budget: int) -> list[str]:
    """Keep the innermost headers that fit: they matter most for the cursor."""
    out: list[str] = []
    used = 0
    for h in reversed(headers):
        if used + len(h) + 1 > budget:
            break
        out.append(h)
        used += len(h) + 1
    out.reverse()
    return out
