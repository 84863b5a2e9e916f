"""A small bracket scanner that skips strings and comments.

Used on windows (a few KB) and candidates, where a full parse would be overkill and where the text is
often not a complete program anyway (a prefix ends mid-statement, a candidate is a fragment).
"""

from __future__ import annotations

import functools
import re

OPENERS = "([{"
CLOSERS = ")]}"
PAIR = {")": "(", "]": "[", "}": "{"}
CLOSE_FOR = {"(": ")", "[": "]", "{": "}"}

_LINE_COMMENT = {
    "python": ("#",),
    "bash": ("#",),
    "lua": ("--",),
    "javascript": ("//",),
    "typescript": ("//",),
    "tsx": ("//",),
    "go": ("//",),
    "rust": ("//",),
    "c": ("//",),
    "cpp": ("//",),
    "java": ("//",),
}
_BLOCK_COMMENT_LANGS = frozenset({"javascript", "typescript", "tsx", "go", "rust", "c", "cpp", "java"})
_RUST_CHAR = re.compile(r"'(\\.[^']*|[^\\'])'")


@functools.cache
def _interesting(language: str | None) -> re.Pattern[str]:
    """Everything the scanner must look at; the rest is skipped at C speed."""
    parts = [r"[()\[\]{}\"'`]"]
    parts += [re.escape(m) for m in _LINE_COMMENT.get(language or "", ("//", "#"))]
    if language in _BLOCK_COMMENT_LANGS:
        parts.append(r"/\*")
    return re.compile("|".join(parts))


def bracket_events(text: str, language: str | None) -> list[tuple[int, str]]:
    """(index, char) of every bracket outside string literals and comments, in order."""
    out: list[tuple[int, str]] = []
    find = _interesting(language).search
    i, n = 0, len(text)
    while True:
        m = find(text, i)
        if m is None:
            return out
        i = m.start()
        tok = m.group()
        ch = tok[0]
        if ch in OPENERS or ch in CLOSERS:
            out.append((i, ch))
            i += 1
        elif tok == "/*":
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif ch in "\"'`":
            if ch == "'" and language == "rust":
                lit = _RUST_CHAR.match(text, i)
                i = lit.end() if lit else i + 1  # a lifetime, not a char literal
            else:
                i = _skip_string(text, i, language)
        elif language == "lua" and text.startswith("--[[", i):
            end = text.find("]]", i + 4)
            i = n if end < 0 else end + 2
        elif language == "bash" and i > 0 and not text[i - 1].isspace() and text[i - 1] not in ";&|(":
            i += 1  # `$#`, `${#x}`: not a comment
        else:
            end = text.find("\n", i)
            i = n if end < 0 else end


def _skip_string(text: str, i: int, language: str | None) -> int:
    quote = text[i]
    if language == "python" and text.startswith(quote * 3, i):
        end = text.find(quote * 3, i + 3)
        return len(text) if end < 0 else end + 3
    multiline = quote == "`" or (language == "bash" and quote in "\"'")
    j = i + 1
    while j < len(text):
        c = text[j]
        if c == "\\" and not (language == "bash" and quote == "'"):
            j += 2
            continue
        if c == quote:
            return j + 1
        if c == "\n" and not multiline:
            return j  # unterminated on this line: stop skipping at the newline
        j += 1
    return len(text)


def unmatched_openers(text: str, language: str | None, opened: str = "") -> str:
    """Openers still open at the end of `text`, outermost first (mismatched closers are ignored).
    `opened`: the openers already open where `text` starts, which its closers may close."""
    stack: list[str] = list(opened)
    for _, ch in bracket_events(text, language):
        if ch in OPENERS:
            stack.append(ch)
        elif stack and stack[-1] == PAIR[ch]:
            stack.pop()
    return "".join(stack)


def leading_closers(text: str, language: str | None) -> str:
    """Closers in `text` that match no opener inside it, in order: what `text` closes of its context."""
    stack: list[str] = []
    out: list[str] = []
    for _, ch in bracket_events(text, language):
        if ch in OPENERS:
            stack.append(ch)
        elif stack:
            if stack[-1] == PAIR[ch]:
                stack.pop()
        else:
            out.append(ch)
    return "".join(out)


def open_string(line: str, language: str | None) -> tuple[str, int]:
    """The quote a string left open at the end of `line` started with ('' when none, or in a comment), and
    how many f-string or template braces are open inside that string there (`f"{x.` is code in a string:
    ('"', 1)).

    For unterminated strings, where tree-sitter has only an ERROR node to offer.
    """
    line_comments = _LINE_COMMENT.get(language or "", ("//", "#"))
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if language == "python" and line.startswith(('"""', "'''"), i):
            end = line.find(line[i : i + 3], i + 3)
            if end < 0:
                return line[i : i + 3], 0
            i = end + 3
            continue
        if ch in "\"'`":
            if ch == "'" and language == "rust" and not _RUST_CHAR.match(line, i):
                i += 1
                continue
            # f-strings and template literals hold code between braces: `f"{x.`, `${a.`
            fmt = (language == "python" and line[max(i - 2, 0) : i].lower().count("f") > 0) or ch == "`"
            depth = 0
            j = i + 1
            while j < n and (depth or line[j] != ch):
                c = line[j]
                if fmt and c == "{" and not line.startswith("{{", j):
                    depth += 1
                elif fmt and c == "}" and depth:
                    depth -= 1
                elif fmt and c == "{":
                    j += 1  # `{{` is a literal brace
                j += 2 if c == "\\" and not depth and not (language == "bash" and ch == "'") else 1
            if j >= n:
                return ch, depth
            i = j + 1
            continue
        if any(line.startswith(m, i) for m in line_comments):
            if not (language == "bash" and i > 0 and not line[i - 1].isspace()):
                return "", 0
        i += 1
    return "", 0
