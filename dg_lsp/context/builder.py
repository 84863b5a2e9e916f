"""Turn (document, cursor) into the prefix/suffix/span the engine infills."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass

from dg_lsp.context.brackets import CLOSERS, OPENERS, PAIR, leading_closers, unmatched_openers
from dg_lsp.context.documents import DocumentSnapshot, parse_snapshot
from dg_lsp.context.languages import SUPPORTED, language_for
from dg_lsp.context.spans import TODO_RE, SpanKind, ancestors, classify
from dg_lsp.context.windows import build_windows, estimate_tokens
from dg_lsp.engine.types import InfillRequest

OPENS_BLOCK = re.compile(r"(:|\{|\(|\[|\bthen|\bdo|\belse|\bfunction\b.*\))\s*$")
CPP_ACCESS = re.compile(r"^[ \t]*(public|private|protected|signals|Q_SIGNALS)(\s+(slots|Q_SLOTS))?\s*:\s*$")
"""A C++ access specifier: a label, not a block; the members after it sit at the class body's column."""
_CPP_NAMESPACE = re.compile(
    r"^[ \t]*((inline\s+)?namespace\b[^{;]*|extern\s+\"C(\+\+)?\"\s*)\{[ \t]*$", re.MULTILINE
)
SELECTION_MAX_TOKENS = 512
CLOSERS_SCAN = 8_000
"""Characters past a cut suffix window read as text for the closers of what is open at the cursor; the
syntax tree says the rest. A block longer than the window closes below it: counted from the window alone,
a candidate closed a `{` that the block's own `}` further down closes (`if (x) {}`), or closed the
function its cursor is in. The text near the cursor, where a removed line leaves the tree broken, is
read as text."""
UNPARSED_SCAN = 20_000
"""Without a syntax tree (a document over the parse limit, a language with no grammar) brackets beyond the
windows are read as text this far: a whole 10 MB file took 0.2-0.4 s per request."""
LINE_START_KINDS = frozenset({"line_above", "empty_line", "function_body"})


@dataclass(frozen=True)
class InfillContext:
    prefix: str
    suffix: str
    span: SpanKind
    language: str | None
    cursor_offset: int
    indent: str
    """Indentation of the block the inserted lines belong to."""
    end_offset: int = -1
    """End of the replaced range (== cursor_offset for a plain insertion)."""
    indent_unit: str = "    "
    line_prefix: str = ""
    """Text of the cursor line before the cursor."""
    line_suffix: str = ""
    """Text of the cursor line after the cursor (or after the replaced range)."""
    prefix_start: int = 0
    suffix_end: int = 0
    prefix_cut: bool = False
    suffix_cut: bool = False
    open_brackets: str = ""
    """Brackets open at the cursor (from the prefix window), outermost first."""
    suffix_closers: str = ""
    """Brackets the suffix closes without opening them, in order."""
    replaced: str = ""
    """The text being replaced (selection / placeholder), empty for an insertion."""
    version: int = 0

    def __post_init__(self) -> None:
        if self.end_offset < 0:
            object.__setattr__(self, "end_offset", self.cursor_offset)

    @property
    def blank_start(self) -> bool:
        """Whether the infill may begin with a blank line. Not at the start of a line, where the new
        lines go (above code, on a blank line, in an empty body): `postprocess` drops a leading blank
        line there, and a model that starts with one usually goes on to end the block."""
        return bool(self.line_prefix.strip()) or self.span.name not in LINE_START_KINDS

    def to_request(self, **overrides: object) -> InfillRequest:
        fields = {
            "prefix": self.prefix,
            "suffix": self.suffix,
            "max_tokens": self.span.max_tokens,
            "single_line": self.span.single_line,
            "language": self.language,
            "blank_start": self.blank_start,
        }
        fields.update(overrides)
        return InfillRequest(**fields)  # type: ignore[arg-type]


def as_snapshot(snapshot_or_text: DocumentSnapshot | str, language: str | None = None) -> DocumentSnapshot:
    if isinstance(snapshot_or_text, DocumentSnapshot):
        return snapshot_or_text
    if language is not None and language not in SUPPORTED:
        language = language_for(language)
    return parse_snapshot(snapshot_or_text, language)


def _leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


_LINE_INDENT = re.compile(r"^([ \t]*)(\S.*)$", re.MULTILINE)
"""The leading whitespace and the code of each non-blank line."""
DEFAULT_UNIT = {"go": "\t", "javascript": "  ", "typescript": "  ", "tsx": "  "}
"""Where the document shows no step: gofmt's tab; two spaces, as Prettier and most JS/TS styles write."""


_GOES_ON_FROM = re.compile(r"^([?:.,+*/%=<>|&)\]}]|-(?!-)|and\b|or\b)")
"""A line that starts by going on with the statement above it (`? a : b`, `.then(`, `&& x`)."""


def _indent_steps(lines: list[tuple[str, str]]) -> tuple[Counter[int], Counter[int]]:
    """Steps into a deeper line after a line that opens a block, and after any line: a continuation line
    is deeper than its statement by whatever aligns it, so those count only where nothing else shows.

    A deeper line that goes on with a statement is a continuation even after an opener: the block's first
    statement, broken over lines, where a blank line (or a removed one) hides the statement's start."""
    block: Counter[int] = Counter()
    every: Counter[int] = Counter()
    for (a, code), (b, deeper) in itertools.pairwise(lines):
        step = len(b) - len(a)
        if 2 <= step <= 8:
            every[step] += 1
            if OPENS_BLOCK.search(code) and not _GOES_ON_FROM.match(deeper):
                block[step] += 1
    return block, every


def indent_unit(text: str, offset: int, language: str | None, window: int = 6000) -> str:
    """The document's indentation step, read from the text around the cursor.

    The commonest step from one line into a deeper one, as editors detect it: a common divisor of every
    indentation is thrown off by one odd line (C++'s one-space ` public:`, a continuation line aligned
    under an opening bracket). Both sides count: a file's first lines (its imports' continuation lines,
    `namespace x {` then ` public:`) may not show the step that the code below them is written in."""
    lines = _LINE_INDENT.findall(text, max(offset - window, 0), offset + window)
    block_steps, steps = _indent_steps(lines)
    indents = [ws for ws, _ in lines if ws]
    if any(ws[0] == "\t" for ws in indents):
        return "\t"
    if not block_steps and language in DEFAULT_UNIT:
        return DEFAULT_UNIT[language]
    if block_steps or steps:
        return " " * max(sorted(block_steps or steps), key=(block_steps or steps).__getitem__)
    step = functools.reduce(math.gcd, {len(ws) for ws in indents}, 0)
    if 2 <= step <= 8:
        return " " * step
    return "    "


def _prev_code_line(text: str, line_start: int) -> tuple[int, str]:
    """The last non-blank line before `line_start`, with the offset it starts at."""
    end = line_start - 1
    while end > 0:
        start = text.rfind("\n", 0, end) + 1
        line = text[start:end]
        if line.strip():
            return start, line
        end = start - 1
    return 0, ""


def statement_lead(text: str, line_start: int, language: str | None, max_lines: int = 24) -> str:
    """The indentation of the line that starts the statement whose line begins at `line_start`.

    A header broken over lines (`def copy(self, src,` then `         dst):` aligned under its bracket) opens
    its block at its first line's column plus a step, not its last line's."""
    end = text.find("\n", line_start)
    end = len(text) if end < 0 else end
    start = line_start
    for _ in range(max_lines):
        if not leading_closers(text[start:end], language):
            return _leading_ws(text[start:end])
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
    return _leading_ws(text[line_start:end])


def open_brackets_at(snapshot: DocumentSnapshot, offset: int) -> str:
    """Brackets open at `offset`, outermost first.

    A cut prefix window starts inside whatever encloses it (a test file's `describe(..., () => {`, a long
    dict literal), and a candidate may close only the brackets the suffix leaves open, so counting from the
    window's start alone lets a candidate close too few. Up to the window, the syntax tree says which
    brackets are open: the nodes around it whose opening bracket lies before it and closing one after.
    """
    tree = snapshot.tree
    if offset <= 0:
        return ""
    if tree is None:  # unparsed (too large, or no grammar): as text, as far as a bounded scan reaches
        return unmatched_openers(snapshot.text[max(0, offset - UNPARSED_SCAN) : offset], snapshot.language)
    b = snapshot.to_byte(offset)
    out: list[str] = []
    for node in reversed(ancestors(tree.root_node.descendant_for_byte_range(b, b))):
        if node.start_byte >= b:
            continue
        stack: list[str] = []
        for child in node.children:
            if child.start_byte >= b:
                break
            if child.type in OPENERS and len(child.type) == 1:
                stack.append(child.type)
            elif child.type in CLOSERS and len(child.type) == 1 and stack and stack[-1] == PAIR[child.type]:
                stack.pop()
        out += stack
    return "".join(out)


_LITERAL = re.compile(r"(^|_)comment$|string$|string_literal$|^heredoc_body$")
"""Tree-sitter node types of comments and strings across the grammars (not `template_argument_list`)."""


def past_literal(snapshot: DocumentSnapshot, offset: int) -> int:
    """`offset`, or the end of the comment or string it falls inside.

    A cut prefix window often starts inside a doc comment; scanned from there as code, its prose (an
    example's ``` fence reads as a template string) hides every bracket after it."""
    tree = snapshot.tree
    if tree is None or offset <= 0:
        return offset
    b = snapshot.to_byte(offset)
    node = tree.root_node.descendant_for_byte_range(b, b)
    for n in ancestors(node):
        if n.start_byte < b < n.end_byte and _LITERAL.search(n.type):
            return snapshot.to_char(n.end_byte)
    return offset


def closing_brackets_at(snapshot: DocumentSnapshot, offset: int) -> str:
    """Closers after `offset` of the brackets open at it, innermost first: `open_brackets_at` read from the
    other end, for the text past a cut suffix window."""
    tree = snapshot.tree
    if offset >= len(snapshot.text):
        return ""
    if tree is None:
        return leading_closers(snapshot.text[offset : offset + UNPARSED_SCAN], snapshot.language)
    b = snapshot.to_byte(offset)
    out: list[str] = []
    for node in ancestors(tree.root_node.descendant_for_byte_range(b, b)):
        if node.end_byte <= b:
            continue
        stack: list[str] = []
        for child in reversed(node.children):
            if child.end_byte <= b:
                break
            if child.type in CLOSERS and len(child.type) == 1:
                stack.append(child.type)
            elif child.type == "ERROR" and child.start_byte >= b:  # a closer nothing opens, where a line went
                stack += reversed(
                    leading_closers(
                        snapshot.text[snapshot.to_char(child.start_byte) : snapshot.to_char(child.end_byte)],
                        snapshot.language,
                    )
                )
            elif child.type in OPENERS and len(child.type) == 1 and stack and PAIR[stack[-1]] == child.type:
                stack.pop()
        out += reversed(stack)
    return "".join(out)


def block_indent(text: str, offset: int, span: SpanKind, unit: str, language: str | None = None) -> str:
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line = text[line_start : len(text) if line_end < 0 else line_end]
    before = text[line_start:offset]
    own = _leading_ws(line)
    if before.strip():
        if span.name in ("function_body", "block"):
            return statement_lead(text, line_start, language) + unit
        return own
    if before:
        return before
    if line.strip():
        return own
    # a blank line with the cursor at column 0: deeper only where code must go (after an opener, or
    # in an empty function body); otherwise the column the user chose is the intent
    prev_start, prev = _prev_code_line(text, line_start)
    if language == "cpp" and OPENS_BLOCK.search(prev):
        return _cpp_body_indent(text, line_start, prev, unit)
    if OPENS_BLOCK.search(prev):
        return statement_lead(text, prev_start, language) + unit
    return statement_lead(text, prev_start, language) if span.name == "function_body" else ""


def _cpp_body_indent(text: str, line_start: int, prev: str, unit: str) -> str:
    """C++ bodies that do not go one step deeper than the line opening them.

    Most C++ styles (Google, LLVM, Mozilla, WebKit) do not indent a namespace's body, nor an `extern "C"`
    block's: the document's other namespaces say whether it does. Members after an access specifier sit
    at the class body's column, whether the specifier is at the class's column, one space in or a step in.
    """
    prev_indent = _leading_ws(prev)
    if _CPP_NAMESPACE.match(prev):
        for m in _CPP_NAMESPACE.finditer(text):
            nxt = _LINE_INDENT.search(text, m.end())
            if nxt and not m.end() < line_start <= nxt.start() and len(nxt[1]) > len(_leading_ws(m[0])):
                return prev_indent + unit
        return prev_indent
    if CPP_ACCESS.match(prev):
        end = text.rfind("\n", 0, line_start - 1)
        while end > 0:  # up to the class's own `{`, at or left of the specifier
            start = text.rfind("\n", 0, end) + 1
            line = text[start:end]
            if line.rstrip().endswith("{") and len(_leading_ws(line)) <= len(prev_indent):
                return _leading_ws(line) + unit
            end = start - 1
    return prev_indent + unit


def replaced_indent(text: str, start: int, end: int) -> str:
    """Indentation of the least indented line of a replaced range (the block a rewrite must keep)."""
    line_start = text.rfind("\n", 0, start) + 1
    lines = text[line_start:end].split("\n")
    leads = [_leading_ws(ln) for ln in lines if ln.strip()]
    return min(leads, key=len) if leads else _leading_ws(text[line_start:start])


def build_context(
    snapshot_or_text: DocumentSnapshot | str,
    offset: int,
    *,
    language: str | None = None,
    max_prefix_tokens: int = 1024,
    max_suffix_tokens: int = 256,
    max_tokens: int = 48,
    end_offset: int | None = None,
    comments: bool = False,
) -> InfillContext:
    """Context for inserting at `offset`, or for replacing `[offset, end_offset)` when given.

    `language` is only used for a bare text (grammar name or LSP languageId). `comments=True` turns
    completion inside comments on (as prose); by default the `comment` span is disabled.
    """
    snap = as_snapshot(snapshot_or_text, language)
    text = snap.text
    offset = max(0, min(offset, len(text)))
    end = offset if end_offset is None else max(offset, min(end_offset, len(text)))
    span = classify(snap, offset, end, comments=comments)
    replaced = text[offset:end]
    if span.name == "selection":
        need = int(estimate_tokens(replaced) * 1.5) + 16
        span = dataclasses.replace(span, max_tokens=min(max(need, max_tokens), SELECTION_MAX_TOKENS))
    elif span.name == "placeholder":
        span = dataclasses.replace(span, max_tokens=max(min(span.max_tokens, max_tokens * 2), max_tokens))
    else:
        span = dataclasses.replace(span, max_tokens=min(span.max_tokens, max_tokens))
    unit = indent_unit(text, offset, snap.language)
    if end > offset:
        indent = replaced_indent(text, offset, end)
    else:
        indent = block_indent(text, offset, span, unit, snap.language)

    win = build_windows(snap, offset, end, max_prefix_tokens, max_suffix_tokens)
    prefix = win.prefix
    if span.name == "placeholder" and TODO_RE.search(replaced):
        # keep the TODO note in front of the model: it says what to write in its place
        prefix = prefix + replaced.rstrip() + "\n" + indent
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    scan_from = min(past_literal(snap, win.prefix_start), offset)
    scan_to = max(win.suffix_end + CLOSERS_SCAN, end)
    scan_to = past_literal(snap, scan_to) if scan_to < len(text) else len(text)
    return InfillContext(
        prefix=prefix,
        suffix=win.suffix,
        span=span,
        language=snap.language,
        cursor_offset=offset,
        indent=indent,
        end_offset=end,
        indent_unit=unit,
        line_prefix=text[line_start:offset],
        line_suffix=text[end:line_end],
        prefix_start=win.prefix_start,
        suffix_end=win.suffix_end,
        prefix_cut=win.prefix_start > 0,
        suffix_cut=win.suffix_end < len(text),
        open_brackets=unmatched_openers(
            text[scan_from:offset], snap.language, opened=open_brackets_at(snap, scan_from)
        ),
        suffix_closers=leading_closers(
            text[end:scan_to] + closing_brackets_at(snap, scan_to) if scan_to < len(text) else text[end:],
            snap.language,
        ),
        replaced=replaced,
        version=snap.version,
    )
