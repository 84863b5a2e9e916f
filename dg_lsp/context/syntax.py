"""ERROR/MISSING nodes: the file's syntax errors, and whether a candidate adds any.

A candidate is judged by comparing the document with it against the document without it, both
parsed incrementally from the open document's tree, so a file that is already broken elsewhere
(the user is mid-edit) does not make every candidate look bad.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import tree_sitter

from dg_lsp.context.documents import DocumentSnapshot, edited_snapshot, parse_snapshot
from dg_lsp.context.languages import grammar

MAX_ISSUES = 200
LOCAL_BYTES = 4096
"""Python empty blocks are only counted this close to an edit: they cannot move far."""


@dataclass(frozen=True)
class SyntaxIssue:
    start: int
    end: int
    kind: str
    """`error` (an ERROR node: text the grammar could not place) or `missing` (a token it inserted)."""
    message: str
    repair_start: int
    """Whole-line range around the issue that a "Repair syntax error" action should rewrite."""
    repair_end: int


@dataclass(frozen=True)
class SyntaxVerdict:
    ok: bool
    """False when the candidate adds ERROR/MISSING nodes to the document."""
    new_errors: int
    """Error count with the candidate minus without it (negative: the candidate fixes errors)."""
    errors_before: int
    errors_after: int


def error_nodes(tree: tree_sitter.Tree, limit: int = MAX_ISSUES) -> Iterator[tree_sitter.Node]:
    """Outermost ERROR and every MISSING node, visiting only subtrees that contain an error."""
    root = tree.root_node
    if not root.has_error:
        return
    stack = [root]
    found = 0
    while stack and found < limit:
        node = stack.pop()
        if node.is_error or node.is_missing:
            found += 1
            yield node
            if node.is_error:
                # MISSING tokens inside an ERROR are part of the same problem.
                continue
        stack.extend(c for c in reversed(node.children) if c.has_error or c.is_missing)


@functools.cache
def _block_query() -> tree_sitter.Query:
    return tree_sitter.Query(grammar("python"), "(block) @b")


def indentation_issues(
    snapshot: DocumentSnapshot, start_byte: int = 0, end_byte: int | None = None
) -> list[tuple[tree_sitter.Node, str]]:
    """Python blocks that are empty, or whose statements start at different columns.

    tree-sitter-python accepts both (it has no IndentationError), but Python does not, and both are
    typical of a wrongly indented candidate.
    """
    tree = snapshot.tree
    if tree is None:
        return []
    cursor = tree_sitter.QueryCursor(_block_query())
    cursor.set_byte_range(start_byte, tree.root_node.end_byte if end_byte is None else end_byte)
    out: list[tuple[tree_sitter.Node, str]] = []
    for block in cursor.captures(tree.root_node).get("b", []):
        if block.start_byte == block.end_byte:
            out.append((block, "expected an indented block"))
            continue
        column = None
        for child in block.named_children:
            if child.type == "comment":
                continue
            col = child.start_point[1]
            if snapshot.data[child.start_byte - col : child.start_byte].strip():
                continue  # shares its line with the header (`if x: return 1`)
            if column is None:
                column = col
            elif col != column:
                out.append((child, "unexpected indentation"))
                break
    return out


def error_count(snapshot: DocumentSnapshot, start_byte: int = 0, end_byte: int | None = None) -> int:
    """ERROR/MISSING nodes in the tree, plus (Python) indentation issues within the byte range."""
    if snapshot.tree is None:
        return 0
    count = sum(1 for _ in error_nodes(snapshot.tree, limit=10_000))
    if snapshot.language == "python":
        count += len(indentation_issues(snapshot, start_byte, end_byte))
    return count


def _line_range(text: str, start: int, end: int, max_lines: int = 12) -> tuple[int, int]:
    """Whole lines around [start, end), from the first line's indentation, at most `max_lines` lines."""
    if not text[text.rfind("\n", 0, start) + 1 : max(start, end)].strip():
        # an issue at the end of a line or of the file (a MISSING `fi`): repair the last code line
        back = len(text[:start].rstrip())
        if back:
            start = min(start, back - 1)
    line_start = text.rfind("\n", 0, start) + 1
    while line_start < start and text[line_start] in " \t":
        line_start += 1
    last = max(start, end - 1)
    line_end = text.find("\n", last)
    line_end = len(text) if line_end < 0 else line_end
    limit = start
    for _ in range(max_lines):
        nxt = text.find("\n", limit)
        if nxt < 0:
            return line_start, line_end
        limit = nxt + 1
    return line_start, min(line_end, limit - 1)


def find_syntax_errors(
    snapshot: DocumentSnapshot, start: int | None = None, end: int | None = None
) -> list[SyntaxIssue]:
    """ERROR/MISSING nodes (and Python empty blocks), optionally only those touching `[start, end]`."""
    if snapshot.tree is None:
        return []
    lo = 0 if start is None else snapshot.to_byte(start)
    hi = snapshot.tree.root_node.end_byte if end is None else snapshot.to_byte(end)
    issues = []
    for node in error_nodes(snapshot.tree):
        if node.end_byte < lo or node.start_byte > hi:
            continue
        at, until = snapshot.to_char(node.start_byte), snapshot.to_char(node.end_byte)
        if node.is_missing:
            kind, message = "missing", f"missing {node.type!r}"
        else:
            snippet = snapshot.text[at:until].strip().splitlines()
            shown = snippet[0][:40] if snippet else ""
            kind = "error"
            where = node.parent.type if node.parent is not None else "file"
            message = f"syntax error in {where}" + (f": unexpected {shown!r}" if shown else "")
        repair_start, repair_end = _line_range(snapshot.text, at, until)
        issues.append(SyntaxIssue(at, until, kind, message, repair_start, repair_end))
    if snapshot.language == "python":
        for node, problem in indentation_issues(snapshot, max(lo - 1, 0), hi + 1):
            at = snapshot.to_char(node.start_byte)
            if node.start_byte == node.end_byte:  # empty block: reported right after its header
                header = node.parent.type if node.parent is not None else "statement"
                repair = _line_range(snapshot.text, max(at - 1, 0), at)
                issues.append(SyntaxIssue(at, at, "missing", f"{problem} after {header}", *repair))
            else:
                until = snapshot.to_char(node.end_byte)
                repair = _line_range(snapshot.text, at, until)
                issues.append(SyntaxIssue(at, until, "error", problem, *repair))
    issues.sort(key=lambda i: (i.start, i.end))
    return issues


def verdict(snapshot: DocumentSnapshot, start: int, end: int, candidate: str) -> SyntaxVerdict:
    """Judge replacing `snapshot.text[start:end]` by `candidate`, reusing the snapshot's tree."""
    if snapshot.tree is None:
        return SyntaxVerdict(True, 0, 0, 0)
    base = snapshot if start == end else edited_snapshot(snapshot, start, end, "")
    after = edited_snapshot(base, start, start, candidate)
    lo = max(base.to_byte(start) - LOCAL_BYTES, 0)
    hi = base.to_byte(start) + LOCAL_BYTES
    before_n = error_count(base, lo, hi)
    after_n = error_count(after, lo, hi + len(candidate.encode("utf-8")))
    return SyntaxVerdict(after_n <= before_n, after_n - before_n, before_n, after_n)


def syntax_delta(text: str, start: int, end: int, candidate: str, language: str) -> SyntaxVerdict:
    """`verdict` for a bare text (parsed here); prefer `verdict` with the open document's snapshot."""
    return verdict(parse_snapshot(text, language), start, end, candidate)
