"""Clean one model candidate so it can be inserted at the cursor as is.

Diffusion models fill a fixed-length canvas, so candidates often run past the natural end of the
span: they re-type the closing brackets or the next line that are already in the suffix, close the
enclosing function, or repeat themselves. Each step below removes one such failure.
"""

from __future__ import annotations

import dataclasses
import functools
import re

from dg_lsp.context.brackets import CLOSE_FOR, CLOSERS, OPENERS, PAIR, bracket_events, unmatched_openers
from dg_lsp.context.builder import CPP_ACCESS, OPENS_BLOCK, InfillContext
from dg_lsp.context.languages import INDENT_BLOCKS
from dg_lsp.context.spans import kind

TAB_WIDTH = 4
_TRIVIAL_LINE = re.compile(r"^[\s)\]};,]*$|^\s*(end|fi|done|esac|else|\}\s*else\s*\{?)\s*;?$")
_RULE_LINE = re.compile(r"^\s*(#+|/{2,}|--|;+|/?\*+)\s*([-=*#~_+/]\s*){3,}(\*/)?\s*$")
"""A separator comment (`# -------`, `// =====`): it starts a section as often as it ends one."""
_CLOSING_LINE = re.compile(r"^\s*([)\]}]|(end|fi|done|esac)\b)")
_OPENS_BLOCK = re.compile(r"(:|\{|\bthen|\bdo)\s*$")
_PLAN_LIMIT = 1024
_CLOSERS_ONLY = re.compile(r"[\s)\]};,]+")
_TAIL_PUNCT = set(")]}\"'`;:,")
_EMPTY_PAIRS = re.compile(r"^(\(\)|\[\]|\{\})+;?$")
_GOES_ON = re.compile(r"([,\\+\-*/%&|^=<>?]|\band|\bor)\s*$")
"""A line that goes on in the next: a trailing comma, operator or backslash."""
_TRAILING_COMMENT = re.compile(r"\s+(#|//)[^'\"]*$")
_CONTINUES = re.compile(r"^\s*(else|elif|except|finally)\b")
_CONTINUES_BRACED = re.compile(r"^\s*(\}\s*(else|catch|finally)\b.*\{|(else|elseif|elif)\b.*)$")
"""`} else {`, `} else if (x) {`, `} catch (e) {`, Lua's and the shell's `else` / `elseif` / `elif`: the end
of one branch and the start of the next."""
_COMMENT_LINE = re.compile(r"^\s*(#|//|/\*|\*|--)")
_DEFINITION = re.compile(
    r"^\s*(@|(async\s+)?def\b|class\b|(export\s+)?(async\s+)?function\b|func\b|(pub\s+)?fn\b)"
)
"""A line that starts a definition: what follows it is not the previous block's code."""


def _ws_width(ws: str) -> int:
    return sum(TAB_WIDTH if c == "\t" else 1 for c in ws)


def _lead(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _render(width: int, unit: str) -> str:
    if unit == "\t":
        return "\t" * (width // TAB_WIDTH) + " " * (width % TAB_WIDTH)
    return " " * width


def _cut_at_quote(text: str, quote: str) -> str:
    if not quote:
        return text
    i = 0
    while True:
        j = text.find(quote, i)
        if j < 0:
            return text
        if j > 0 and text[j - 1] == "\\":
            i = j + 1
            continue
        return text[:j]


def _cut_at_blank_line(text: str) -> str:
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if i > 0 and not line.strip() and any(ln.strip() for ln in lines[:i]):
            return "\n".join(lines[:i])
    return text


def reindent(text: str, ctx: InfillContext) -> str:
    """Put the candidate's block at `ctx.indent`, in the document's indent style.

    Lines after the first are taken as absolute (the model saw the whole prefix), so they only move
    when the candidate as a whole sits left of the block: the model started at column 0 on a blank
    line, or wrote a block's body no deeper than its header.
    """
    lines = text.split("\n")
    target = _ws_width(ctx.indent)
    # closing lines (`}`, `end`, `fi`) sit at the outer level: they do not tell where the block is
    rest = [_ws_width(_lead(ln)) for ln in lines[1:] if ln.strip() and not _CLOSING_LINE.match(ln)]
    delta = 0
    if ctx.line_prefix and not ctx.line_prefix.strip():
        lines[0] = lines[0].lstrip(" \t")  # the cursor already sits at the indentation
        if rest and min(rest) == 0 < target and _OPENS_BLOCK.search(lines[0]):
            delta = target  # the model indented relative to the cursor, not to the file
    elif not ctx.line_prefix:
        anchor = _ws_width(_lead(lines[0])) if lines[0].strip() else min(rest, default=target)
        delta = 0 if _own_column(lines, anchor, target, ctx) else max(target - anchor, 0)
        if lines[0].strip():
            lines[0] = _render(anchor + delta, ctx.indent_unit) + lines[0].lstrip(" \t")
    elif rest:
        floor = target if ctx.span.name in ("block", "function_body") else _ws_width(_lead(ctx.line_prefix))
        delta = max(floor - min(rest), 0)
    for i in range(1, len(lines)):
        line = lines[i]
        if not line.strip():
            lines[i] = ""
            continue
        width = max(_ws_width(_lead(line)) + delta, 0)
        lines[i] = _render(width, ctx.indent_unit) + line.lstrip(" \t")
    return "\n".join(lines)


def _dedent_floor(text: str, ctx: InfillContext) -> int:
    """Lines indented less than this leave the block the candidate belongs to: the cursor's block.

    Lines going in above a code line from column 0 may close a block that the code line sits in (an
    `else:` above the else branch's body, after the if branch's header or body), so there the floor is
    the least of the code line's, the previous code line's and the candidate's first line's indentation."""
    target = _ws_width(ctx.indent)
    if ctx.span.name == "empty_line" and not ctx.line_prefix.strip():
        return _gap_floor(ctx, target)
    if ctx.span.name != "line_above" or ctx.line_prefix:
        return target
    prev = next((ln for ln in reversed(ctx.prefix.split("\n")) if ln.strip()), "")
    first = next((ln for ln in text.split("\n") if ln.strip()), "")
    return min(target, _ws_width(_lead(prev)), _ws_width(_lead(first)))


def _gap_floor(ctx: InfillContext, target: int) -> int:
    """On a blank line at the end of a block, the lines going in may leave it for the block the code
    below sits in: they go between the two, where the code after the gap would be.

    The code below is the first code line after the cursor's. A line that closes a block (`}`, `else:`)
    or starts a definition (`def`, a decorator) keeps the lines inside the block it ends; the others let
    them down to their own column. With no code below, at the end of a Python file, the lines may go on
    with the body of the function the cursor is in (the function's last lines), never past it.
    """
    unit = _ws_width(ctx.indent_unit) or TAB_WIDTH
    for line in ctx.suffix.split("\n")[1:]:
        if not line.strip() or _COMMENT_LINE.match(line):
            continue
        width = _ws_width(_lead(line))
        if width >= target:
            return target
        ends_block = _CLOSING_LINE.match(line) or _CONTINUES.match(line) or _CONTINUES_BRACED.match(line)
        return min(target, width + unit) if ends_block or _DEFINITION.match(line) else width
    if ctx.suffix_cut or ctx.language not in INDENT_BLOCKS:
        return target
    lowest = target
    for line in reversed(ctx.prefix.split("\n")):
        if not line.strip() or _COMMENT_LINE.match(line):
            continue
        width = _ws_width(_lead(line))
        if width < lowest:
            if _DEFINITION.match(line) and not line.lstrip().startswith(("@", "class")):
                return min(target, width + unit)
            lowest = width
            if width == 0:
                break
    return target


def _own_column(lines: list[str], anchor: int, target: int, ctx: InfillContext) -> bool:
    """Whether lines going in above a code line from column 0 keep the columns the model wrote.

    There any column can be right: the header of the code line's block sits to its left, the end of a
    deeper block to its right. Only a candidate at column 0 that does not lead into the code line ignored
    indentation: a block's header, a statement the code line continues (`var a = require('a'),`, `x = (a +`,
    a `\\` line end) and a docstring or block comment the code line is inside all sit left of it.
    A C++ access specifier is a label: styles put it anywhere from the class's column to its members'.
    """
    if ctx.language == "cpp" and CPP_ACCESS.match(lines[0]):
        return True
    if ctx.span.name != "line_above":
        return False
    if anchor > 0:
        return True
    whole = "\n".join(lines)
    last = next((ln for ln in reversed(lines) if ln.strip()), "")
    code = _TRAILING_COMMENT.sub("", last)
    if unmatched_openers(whole, ctx.language) or _opens_text(whole) or _GOES_ON.search(code):
        return True
    return _opens_block_below(lines, target)


def _opens_block_below(lines: list[str], target: int) -> bool:
    """A line of the candidate left of the code line opens a block that every line after it stays in: the
    code line, deeper, goes on with that block (a header, a header and its body's first lines)."""
    code = [(_ws_width(_lead(ln)), _TRAILING_COMMENT.sub("", ln)) for ln in lines if ln.strip()]
    for i, (width, line) in enumerate(code):
        if width < target and OPENS_BLOCK.search(line) and all(w > width for w, _ in code[i + 1 :]):
            return True
    return False


def _opens_text(text: str) -> bool:
    """The text starts a docstring or block comment that it does not end."""
    if text.count('"""') % 2 or text.count("'''") % 2:
        return True
    start = text.rfind("/*")
    return start >= 0 and "*/" not in text[start + 2 :]


def _cut_at_dedent(text: str, ctx: InfillContext, floor: int | None = None) -> str:
    target = _ws_width(ctx.indent) if floor is None else floor
    lines = text.split("\n")
    for i in range(1, len(lines)):
        line = lines[i]
        if line.strip() and _ws_width(_lead(line)) < target:
            closer = ctx.language not in INDENT_BLOCKS and line.strip()[0] in CLOSERS
            if closer and _closes_own(lines[:i], ctx):
                continue  # closes a bracket the candidate itself opened
            if _continues_block_statement(line, ctx):
                continue
            return "\n".join(lines[:i])
    return text


def _continues_block_statement(line: str, ctx: InfillContext) -> bool:
    """An `else:` / `elif` / `except` / `finally:` (`} else {`, `} catch (e) {` in brace languages) one
    step left of the cursor's block goes on with the statement that block belongs to (the if branch's body,
    then its else), so it does not end the candidate; cut there, the code below, the else branch's body,
    would be left in the if branch, or the else branch would never be written."""
    outer = _ws_width(ctx.indent) - _ws_width(ctx.indent_unit)
    if _ws_width(_lead(line)) < outer:
        return False
    if ctx.language in INDENT_BLOCKS:
        return bool(_CONTINUES.match(line))
    return bool(_CONTINUES_BRACED.match(line))


def _closes_own(lines: list[str], ctx: InfillContext) -> bool:
    depth = 0
    for _, ch in bracket_events("\n".join(lines), ctx.language):
        depth += 1 if ch in OPENERS else -1
    return depth > 0


def _cut_repeats(text: str, ctx: InfillContext) -> str:
    lines = text.split("\n")
    prev = None
    for i, line in enumerate(lines):
        key = line.strip()
        if not key or _TRIVIAL_LINE.match(line):
            continue
        if key == prev:
            return "\n".join(lines[:i])
        prev = key
    return text


_STUTTER = re.compile(r"(\w{2,8}?)\1{2,}")
_HEX = frozenset("0123456789abcdefABCDEF_")


def _cut_stutter(text: str) -> str:
    """Cut from the first line with a stuttering word (`max_size_size_size`, `_to_to_to`).

    Positions decoded in parallel can each settle on the same likely subword, so a diffusion canvas
    sometimes repeats one within a word; such a line is never what the user meant.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if any(_stutters(m[1]) for m in _STUTTER.finditer(line)):
            return "\n".join(lines[:i])
    return text


def _stutters(unit: str) -> bool:
    # hex digits repeat on purpose (`#5a5a5a`, `0xFFFF_FFFF_FFFF`); with them left out, 6 lines in the
    # 556k of the training corpus match (`rwxrwxrwx`, `dotdotdot`, `eqeqeq`)
    return len(set(unit)) > 1 and not all(c in _HEX for c in unit)


def _suffix_lines(ctx: InfillContext, n: int = 3) -> list[tuple[int, str]]:
    """The first `n` code lines after the cursor's line: (column, stripped text)."""
    out = []
    for line in ctx.suffix.split("\n")[1:]:
        if line.strip():
            out.append((_ws_width(_lead(line)), line.strip()))
            if len(out) == n:
                break
    return out


def _goes_its_own_way(after: list[str], following: list[tuple[int, str]]) -> bool:
    """The candidate's lines after one that matches the suffix's next line are not the suffix's lines
    after it: the match is the candidate's own statement."""
    mine = [ln.strip() for ln in after if ln.strip()]
    theirs = [text for _, text in following]
    return bool(mine) and (not theirs or any(a != b for a, b in zip(mine, theirs, strict=False)))


def remove_suffix_overlap(text: str, ctx: InfillContext) -> str:
    """Drop the part of the candidate that re-types what follows the cursor.

    In Python a line's column is part of its meaning: the next line's text at another column that the
    candidate goes on from with lines of its own is another statement (`for x in xs:` then its own body,
    above the same loop one block deeper). Where the candidate ends there, or goes on with the next lines
    too, it is those lines re-typed at the wrong column, as models often do.
    """
    lines = text.split("\n")
    following = _suffix_lines(ctx, 6)
    above = ctx.span.name == "line_above"
    if above:  # the code after the cursor is the next line once these lines go in above it
        code_line = _ws_width(_lead(ctx.line_prefix + ctx.line_suffix))
        following = [(code_line, ctx.line_suffix.strip()), *following]
    columns = ctx.language in INDENT_BLOCKS
    for i in range(0 if above else 1, len(lines)) if following else ():
        if lines[i].strip() != following[0][1]:
            continue
        column = _ws_width(_lead(ctx.line_prefix + lines[i] if i == 0 else lines[i]))
        if columns and column != following[0][0] and _goes_its_own_way(lines[i + 1 :], following[1:]):
            continue
        if (
            _TRIVIAL_LINE.match(following[0][1])
            or following[0][1] in ('"""', "'''")
            or _RULE_LINE.match(following[0][1])
        ):
            # a lone closer, docstring quote or separator comment opens as often as it closes: only
            # with the line after it
            if len(following) < 2 or i + 1 >= len(lines) or lines[i + 1].strip() != following[1][1]:
                continue
        lines = lines[:i]
        break
    text = "\n".join(lines).rstrip()
    rest = ctx.line_suffix.strip()
    if not rest or above:
        return text
    if text.endswith(rest):
        return text[: -len(rest)].rstrip() if "\n" in text else text[: -len(rest)]
    # the longest run of closing punctuation the rest of the line starts with: `)`, `);`, `"]`
    k = 0
    while k < len(rest) and rest[k] in _TAIL_PUNCT:
        k += 1
    for j in range(k, 0, -1):
        if text.endswith(rest[:j]):
            return text[:-j]
    return text


def bracket_plan(ctx: InfillContext) -> tuple[str, str, str]:
    """(the prefix's open brackets the candidate may not close, those it may, the suffix's closers that
    close something the candidate must open).

    The candidate closes the innermost `c` of the brackets open at the cursor and opens some of its own;
    the suffix's closers then close those (`u` of them), then the rest of the open ones, innermost first,
    kind for kind (`r` of them); a file being written at its end may leave outer ones unclosed. The
    reading that asks least of the candidate and leaves least unclosed wins: `function f(` typed above its
    body's `}` leaves `(` to the candidate and `{` for it to open (`a, b) {`), where a count of closers
    took the `}` for the `(`'s; `foo(|)` at the end of an unfinished file leaves the `)` to the suffix."""
    # brackets no one closes: only where the file ends after the cursor's closers (it is being written)
    unclosed_cost = 1.5 if not ctx.suffix_cut and not _CLOSERS_ONLY.sub("", ctx.suffix) else 10.0
    return _plan(ctx.open_brackets, ctx.suffix_closers, unclosed_cost)


@functools.lru_cache(maxsize=256)
def _plan(opened: str, closers: str, unclosed_cost: float) -> tuple[str, str, str]:
    n, m = len(opened), len(closers)
    if n * m > _PLAN_LIMIT:  # a broken document's hundreds of brackets: count them
        c = max(n - m, 0)
        return opened[: n - c], opened[n - c :], closers[: max(m - n, 0)]
    best = (float("inf"), n, 0)
    for c in range(n + 1):
        rest = n - c
        for r in range(min(rest, m), -1, -1):
            u = m - r
            if all(PAIR[closers[u + t]] == opened[rest - 1 - t] for t in range(r)):
                best = min(best, (u + c + unclosed_cost * (rest - r), c, r))
    _, c, r = best
    return opened[: n - c], opened[n - c :], closers[: m - r]


def _scan_brackets(text: str, ctx: InfillContext) -> tuple[int | None, list[str]]:
    """Where the candidate first closes more than it may (None: nowhere), and the openers it leaves open
    that are its own to close, outermost first.

    The suffix closes the brackets it closes last, so the candidate may close only the innermost others.
    It may also close one of the suffix's when it opens the same kind again before it ends: a `} else {` or
    `} catch (e) {` ends the block the cursor is in and starts the one whose `}` is below, `item) => (`
    ends the parameters and starts the arrow's body, whose `)` is below."""
    theirs_str, closable, _ = bracket_plan(ctx)
    theirs = list(theirs_str)
    stack: list[str] = []
    owed: list[tuple[int, str]] = []  # the suffix's brackets the candidate closed, to be opened again
    for i, ch in bracket_events(text, ctx.language):
        if ch in OPENERS:
            if not stack and owed and owed[-1][1] == ch:
                theirs.append(owed.pop()[1])
            else:
                stack.append(ch)
        elif stack and stack[-1] == PAIR[ch]:
            stack.pop()
        elif not stack and closable and closable[-1] == PAIR[ch]:
            closable = closable[:-1]
        elif not stack and theirs and theirs[-1] == PAIR[ch]:
            owed.append((i, theirs.pop()))
        else:
            return (owed[0][0] if owed else i), stack
    return (owed[0][0] if owed else None), stack


def balance(text: str, ctx: InfillContext, inside: str = "") -> str:
    """Cut where the candidate closes more than it may, then close what it opened itself. `inside`: the
    quote of a string the candidate starts in."""
    if inside:
        done = balance(inside + text, ctx)
        return done[len(inside) :] if done.startswith(inside) else text
    cut, stack = _scan_brackets(text, ctx)
    while cut is not None:
        text = text[:cut].rstrip()
        cut, stack = _scan_brackets(text, ctx)
    # closers in the suffix that nothing in the prefix opened close the candidate's innermost openers
    # first (the user removed a line that opens a block and the block's end is still there)
    for closer in bracket_plan(ctx)[2]:
        if not stack or stack[-1] != PAIR[closer]:
            break
        stack.pop()
    if not stack:
        return text
    closing = [CLOSE_FOR[c] for c in reversed(stack)]
    if ctx.span.single_line or "\n" not in text:
        return text + "".join(closing)
    # unfinished multi-line candidate: keep up to the last line where everything it opened is closed
    p = text.rfind("\n")
    while p > 0:
        head = text[:p]
        if head.strip() and _scan_brackets(head, ctx) == (None, []):
            return head.rstrip()
        p = text.rfind("\n", 0, p)
    if ctx.language in INDENT_BLOCKS:
        return text + "".join(closing)
    return text + "".join("\n" + ctx.indent + c for c in closing)


def _recalls_closed_call(text: str, ctx: InfillContext) -> bool:
    """After `items.pop()` (typed, or a suggestion just accepted) the model's likeliest next words are the
    empty call again, `pop()()`: it parses, so the syntax check keeps it, and it is almost never meant. Only
    a candidate made of nothing but the empty pair the line already ends with; an IIFE's `})()` stays."""
    body = text.strip()
    return bool(_EMPTY_PAIRS.match(body)) and ctx.line_prefix.rstrip().endswith(body[:2])


def postprocess(candidate: str, ctx: InfillContext, stopped: bool = False) -> str | None:
    """The candidate ready to insert at the cursor, or None to drop it. `stopped`: the model ended the
    span itself (`ended_by_model`), so a blank line inside it is its own, not a run past the span's end."""
    text = candidate.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    if ctx.span.name == "line_above":
        if "\n" not in text:
            # no line ended: the model writes the start of the cursor's line, not lines above it
            ctx = dataclasses.replace(ctx, span=kind("line_rest"))
        else:
            text = text[: text.rfind("\n") + 1]  # an unfinished last line cannot go above the code
    span = ctx.span
    if span.single_line:
        text = text.split("\n", 1)[0]
    if span.stop == "quote":
        text = _cut_at_quote(text, span.quote)
    if span.stop == "blank_line":
        if not ctx.line_prefix.strip():
            text = text.lstrip("\n")
        if not stopped:
            text = _cut_at_blank_line(text)
    if not span.single_line and not span.prose:
        text = reindent(text, ctx)
        if span.stop in ("dedent", "blank_line"):
            text = _cut_at_dedent(text, ctx, _dedent_floor(text, ctx))
    text = _cut_repeats(text, ctx)
    if not span.prose:
        text = _cut_stutter(text)
    text = remove_suffix_overlap(text, ctx)
    if not span.prose:
        # a string the user is typing (`stop = line`) ends in the candidate: scan it from inside that string
        text = balance(text, ctx, inside=span.quote if span.stop == "line" else "")
    text = "\n".join(line.rstrip() for line in text.split("\n")).rstrip()
    if not text.strip():
        return None
    if ctx.replaced and text.strip() == ctx.replaced.strip():
        return None
    if _recalls_closed_call(text, ctx):
        return None
    prev = ctx.prefix.rstrip().rsplit("\n", 1)[-1].strip()
    copies_above = text.strip() == prev and not _TRIVIAL_LINE.match(prev)
    if copies_above and not span.single_line and not ctx.line_prefix.strip():
        return None  # copies the line above
    if span.name == "line_above":
        return text + "\n" + ctx.line_prefix  # the code after the cursor keeps its own line
    return text
