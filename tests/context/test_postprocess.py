"""Candidate clean-up: suffix overlap, bracket balance, re-indent, stop rules, empty/repeated output."""

from __future__ import annotations

import pytest

from dg_lsp.context import postprocess
from dg_lsp.context.builder import indent_unit
from dg_lsp.context.ranking import rank_candidates

CASES = [
    # --- text that duplicates the suffix right after the cursor
    ("python", "x = foo(a, <|>)\n", "b, c)", "b, c"),
    ("python", "x = foo(a, <|>)\n", "b, c)\ny = 2", "b, c"),
    ("javascript", "console.log('sum', <|>);\n", "total);", "total"),
    ("c", 'int main(void) {\n  printf("%d\\n", <|>);\n}\n', "x + 1);\n}", "x + 1"),
    ("lua", "local t = {1, 2, <|>}\n", "3, 4}", "3, 4"),
    ("python", "def f(a, <|>):\n    return a\n", "b):", "b"),
    (
        "javascript",
        "function f(a) {\n  <|>\n  return b;\n}\n",
        "const b = a * 2;\n  return b;\n}",
        "const b = a * 2;",
    ),
    ("python", "def f(x):\n    y = 1\n    <|>\n    return y\n", "y += 2\n    return y", "y += 2"),
    ("rust", "fn main() {\n    let v = vec![1, <|>];\n}\n", "2, 3];", "2, 3"),
    # --- string spans stop at the closing quote
    ("python", "msg = 'hello <|>'\n", "world' + name", "world"),
    ("go", 'package main\n\nvar s = "abc<|>"\n', 'def"\nvar t = 1', "def"),
    # ... but a string the user is typing, not closed on its line yet, is finished with the rest of the line
    ("python", 'names = {"fi<|>\n', 'lename": 1}', 'lename": 1}'),
    ("javascript", "import { f } from './ut<|>\n", "ils';", "ils';"),
    ("python", 'print("a (b<|>\n', 'c) d")', 'c) d")'),  # brackets inside the string are text
    ("python", 'print("a (b<|>\n', 'c) d") + x', 'c) d") + x'),
    # --- bracket balance
    ("python", "def f(x):\n    return (x +<|>\n", " 1))))", " 1)"),
    ("python", "x = foo(<|>\n", "bar(1, 2", "bar(1, 2)"),
    # ... the suffix closes the outer brackets, so the candidate may close the inner ones
    ("python", "pairs = [(1, 2), (3, <|>]\n", "4)", "4)"),
    ("javascript", "const o = { a: f(<|> };\n", "x)", "x)"),
    ("python", "def f(t: IO[byt<|>\n) -> None:\n", "es],", "es],"),
    ("javascript", "function f(a) {\n  <|>\n}\n", "if (a) {\n    b();", "if (a) {\n    b();\n  }"),
    ("javascript", "function f(a) {\n  <|>\n}\n", "const c = 1;\nif (a) {\n    b();", "const c = 1;"),
    (
        "go",
        "package main\n\nfunc add(a, b int) int {\n\t<|>\n}\n",
        "return a + b\n}\n\nfunc main() {",
        "return a + b",
    ),
    ("java", "class A {\n  int twice(int x) {\n    <|>\n  }\n}\n", "return 2 * x;\n  }\n}", "return 2 * x;"),
    # --- re-indent to the cursor's block
    ("python", "def f(x):\n<|>\n", "return x + 1", "    return x + 1"),
    ("python", "def f(x):\n    <|>\n", "    return x", "return x"),
    (
        "python",
        "def f(x):\n    <|>\n",
        "if x:\n    return 1\nreturn 2",
        "if x:\n        return 1\n    return 2",
    ),
    (
        "go",
        "package main\n\nfunc f() int {\n\t<|>\n}\n",
        "x := 1\n    if x > 0 {\n        return x\n    }\n    return 0\n}",
        "x := 1\n\tif x > 0 {\n\t\treturn x\n\t}\n\treturn 0",
    ),
    (
        "cpp",
        "class S {\n public:\n  int pop() {\n    <|>\n  }\n};\n",
        "int x = top;\n    return x;",
        "int x = top;\n    return x;",
    ),
    ("python", "class A:\n    def f(self):<|>\n", "\n    return 1", "\n        return 1"),
    ("python", "def f():\n    return 1\n\n<|>\n", "def g():\n    return 2", "def g():\n    return 2"),
    ("python", 'def f():\n    """Doc."""\n<|>\n', "return 2", "    return 2"),
    ("javascript", "if (ready) {<|>\n}\n", "\n  go();\n}", "\n    go();"),
    ("javascript", "function f() {\n  if (ready) {<|>\n  }\n}\n", "\ngo();\n}", "\n    go();"),
    ("python", "for i in range(3):<|>\n", "\nprint(i)", "\n    print(i)"),
    # --- stop rules
    ("python", "def f(x):\n    <|>\n", "return x + 1\n\ndef g():\n    pass", "return x + 1"),
    ("bash", "greet() {\n  <|>\n}\n", 'echo "hi $1"\n}\n\nmain() {', 'echo "hi $1"'),
    ("lua", "local function add(a, b)\n  <|>\nend\n", "return a + b\nend\n\nlocal x = 1", "return a + b"),
    ("python", "value = compute<|>\n", "(1, 2)\nprint(value)", "(1, 2)"),
    ("python", "def f():\n    a = 0\n    <|>\n", "a += 1\n    b = 2\n\n    c = 3", "a += 1\n    b = 2"),
    ("python", "def f():\n    a = 0\n    <|>\n", "a += 1\nb = 2", "a += 1"),  # `b = 2` left the block
    # ... but an else: one step out goes on with the if whose body the cursor is in (its own body is below)
    (
        "python",
        "def f(s, k):\n    if k > len(s):\n<|>\n        return s[k:]\n",
        "        return s[::-1]\n    else:",
        "        return s[::-1]\n    else:",
    ),
    ("python", "def f(x):\n    if x:\n<|>\n        y = 2\n", "        y = 1\nelse:", "        y = 1"),
    (
        "typescript",
        "function len(s: string): number {\n  <|>\n}\n",
        "return s.length;   \n}",
        "return s.length;",
    ),
    # --- at the indentation of a code line: whole lines go in above it, and it keeps its own line
    ("python", "def f(x):\n    y = 1\n    <|>return y\n", "y += 2\n", "y += 2\n    "),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    y += 2\n", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "y += 2\n", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    y += 2\n    return y\n", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    y += 2\n    ret", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    y += 2\n    return..", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    y += 2\nz = 3\n", "    y += 2\n"),
    ("python", "def f(x):\n    y = 1\n<|>    return y\n", "    return y\n", None),
    # ... from column 0 the model's own columns stand: a header left of its body, an `else:`, a block's end
    (
        "python",
        "def f(xs):\n    t = 0\n<|>        t += x\n    return t\n",
        "    for x in xs:\n",
        "    for x in xs:\n",
    ),
    ("python", "def f(x):\n    if x:\n        y = 1\n<|>        y = 2\n", "    else:\n", "    else:\n"),
    (
        "python",
        "def f(s, k):\n    if k > len(s):\n<|>        return s[k:]\n",
        "        return s[::-1]\n    else:\n",
        "        return s[::-1]\n    else:\n",
    ),
    ("python", "import os\n\n<|>    return os.sep\n", "def sep():\n", "def sep():\n"),
    ("lua", "local M = {}\n<|>  return x\nend\n", "function M.id(x)\n", "function M.id(x)\n"),
    # ... and a `{` the block's own `}` below already closes stays open
    ("javascript", "function f(x) {\n<|>    go();\n  }\n}\n", "  if (x) {\n", "  if (x) {\n"),
    ("javascript", "function f(a) {\n  <|>return b;\n}\n", "const b = a * 2;\n", "const b = a * 2;\n  "),
    ("python", "def f(x):\n    <|>x.append(1)\n", "self.", "self."),  # no line ended: the line's start
    # --- repeated or empty output
    ("python", "def f(x):\n    <|>\n", "x = 1\nx = 1\nx = 1", "x = 1"),
    ("python", "def f(x):\n    <|>\n", "y = x\n    z = x_to_to_to\n    w = 1", "y = x"),
    ("python", "x = self.<|>\n", "_sock_sock_sock,", None),
    ("python", "x = <|>\n", "'abab' + name_name", "'abab' + name_name"),  # twice is not a stutter
    ("python", "x = '<|>'\n", "hahaha", "hahaha"),  # prose may laugh
    ("python", "style = {<|>}\n", "'bg': '#5a5a5a'", "'bg': '#5a5a5a'"),  # hex digits repeat on purpose
    ("python", "x = foo(<|>)\n", ")", None),
    # --- the empty call just closed, again (an accepted `pop()` then ghost text `()`)
    ("python", "def peek(self):\n    return self.items.pop()<|>\n", "()", None),
    ("javascript", "const xs = list.slice()<|>\n", "();", None),
    ("javascript", "(function () {\n  run();\n})<|>\n", "();", "();"),  # an IIFE is called
    ("python", "x = f()<|>\n", ".strip()", ".strip()"),
    ("python", "x = foo(<|>)\n", "   \n  ", None),
    ("python", "import os\n<|>\n", "import os", None),
    ("tsx", "const a = <div>{<|>}</div>;\n", "items.length}", "items.length"),
]


@pytest.mark.parametrize(("language", "src", "candidate", "expected"), CASES)
def test_postprocess(ctx_at, language, src, candidate, expected):
    ctx, _ = ctx_at(src, language)
    assert postprocess(candidate, ctx) == expected


def test_placeholder_fill_that_changes_nothing_is_dropped(ctx_at):
    from dg_lsp.context import build_context

    ctx, snap = ctx_at("def f(x):\n    <|>pass\n", "python")
    fill = build_context(snap, ctx.cursor_offset, end_offset=ctx.cursor_offset + 4)
    assert postprocess("pass", fill) is None
    assert postprocess("return x * 2", fill) == "return x * 2"


def test_todo_placeholder_keeps_the_note_in_the_prompt(ctx_at):
    from dg_lsp.context import build_context

    ctx, snap = ctx_at("def area(r):\n    <|># TODO: circle area\n", "python")
    end = snap.text.index("\n", ctx.cursor_offset)
    fill = build_context(snap, ctx.cursor_offset, end_offset=end)
    assert fill.span.name == "placeholder"
    assert fill.prefix.endswith("    # TODO: circle area\n    ")
    assert postprocess("return 3.14159 * r * r", fill) == "return 3.14159 * r * r"


def _long_js_test_file(last: str) -> str:
    case = (
        "  it('case {0}', () => {{\n    const x{0} = f({0}, [1, 2]);\n    expect(x{0}).toBe({0});\n  }});\n\n"
    )
    cases = "".join(case.format(i) for i in range(120))
    return "describe('math', () => {\n" + cases + last + "});\n"


def test_a_cut_prefix_window_still_counts_the_brackets_open_above_it(ctx_at):
    """Deep in a long test file the window starts inside `describe(..., () => {`: the `)` that ends the
    line being typed is the candidate's to write, and the removed `it(...) {` line's `{` and `(` are the
    suffix's to close. Counted from the window's start alone, the first was cut and the second closed."""
    src = _long_js_test_file("  it('last', () => {\n    expect(total(items)).toBe(<|>\n  });\n")
    ctx, _ = ctx_at(src, "javascript")
    assert ctx.prefix_cut and ctx.open_brackets == "({({("
    assert postprocess("42);", ctx) == "42);"

    line = "  it('last', () => {\n"
    src = _long_js_test_file("<|>    expect(total(items)).toBe(3);\n  });\n")
    ctx, snap = ctx_at(src, "javascript")
    assert ctx.prefix_cut and ctx.span.name == "line_above"
    assert rank_candidates([(line, 0.0)], ctx, snap) == [line]


def test_a_cut_prefix_window_that_closes_what_was_open_above_it(ctx_at):
    src = _long_js_test_file("") + "\nrun(<|>\n"
    ctx, _ = ctx_at(src, "javascript")
    assert ctx.prefix_cut and ctx.open_brackets == "("
    assert postprocess("1);", ctx) == "1);"


def test_a_cut_prefix_window_inside_a_long_literal(ctx_at):
    entries = "".join(f"    'key{i}': [{i}, {i + 1}, dict(a={i})],\n" for i in range(400))
    ctx, _ = ctx_at("CONFIG = {\n" + entries + "    'last': [f(<|>\n}\n", "python")
    assert ctx.prefix_cut and ctx.open_brackets == "{[("
    assert postprocess("1), 2],", ctx) == "1), 2],"


def test_the_indent_step_is_the_commonest_step_into_a_deeper_line():
    """A common divisor of every indentation is thrown off by one odd line: C++'s one-space access
    specifiers, a continuation aligned under its opening bracket."""
    cpp = "class A {\n public:\n  int f() {\n    return 1;\n  }\n\n private:\n  int x_;\n};\n"
    assert indent_unit(cpp, len(cpp), "cpp") == "  "
    py = "def f(a, b):\n    total = compute(a,\n                    b)\n    if total:\n        return total\n"
    assert indent_unit(py, len(py), "python") == "    "
    assert indent_unit("x = 1\n", 6, "go") == "\t"
