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
    # ... from code between an f-string's or a template's braces: close them, then the string, then the line
    ("python", 'def f(name):\n    print(f"Hello {na<|>\n    return 1\n', 'me}!")', 'me}!")'),
    ("javascript", "function f(a) {\n  log(`x ${a.na<|>\n  return 1;\n}\n", "me}`);", "me}`);"),
    ("python", "    (rf'([{_squot<|>\n", "e}])',", "e}])',"),
    # --- bracket balance
    ("python", "def f(x):\n    return (x +<|>\n", " 1))))", " 1)"),
    ("python", "x = foo(<|>\n", "bar(1, 2", "bar(1, 2)"),
    # ... the suffix closes the outer brackets, so the candidate may close the inner ones
    ("python", "pairs = [(1, 2), (3, <|>]\n", "4)", "4)"),
    ("javascript", "const o = { a: f(<|> };\n", "x)", "x)"),
    ("python", "def f(t: IO[byt<|>\n) -> None:\n", "es],", "es],"),
    # ... and they close kind for kind: a `}` below closes the block the candidate opens, not the `(` typed
    ("javascript", "function baseNth(<|>\n  return n;\n}\n", "array, n) {", "array, n) {"),
    ("javascript", "function f(n) {\n  if (<|>\n    return 0;\n  }\n  return n;\n}\n", "!n) {", "!n) {"),
    ("typescript", "function f(k: T) {\n  if (!s.<|>\n    s.add(k);\n  }\n}\n", "has(k)) {", "has(k)) {"),
    # ... and in a file still being written, the `)` after the cursor is the call's, whatever is left open
    ("javascript", "const config = {\n  items: [\n    foo(<|>)", "a, b)", "a, b"),
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
    # no step shown: Prettier's two spaces
    ("javascript", "if (ready) {<|>\n}\n", "\n  go();\n}", "\n  go();"),
    ("javascript", "if (ready) {<|>\n}\n", "\ngo();\n}", "\n  go();"),
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
    # ... and so does a `} else {` (`} catch (e) {`, Lua's `else`): the `}` below then closes the else branch
    (
        "javascript",
        "function f(a) {\n  if (a) {\n    <|>\n  }\n}\n",
        "b();\n  } else {\n    c();\n  }\n}",
        "b();\n  } else {\n    c();",
    ),
    (
        "go",
        "package main\n\nfunc f(a bool) {\n\tif a {\n\t\t<|>\n\t}\n}\n",
        "b()\n\t} else {\n\t\tc()\n\t}",
        "b()\n\t} else {\n\t\tc()",
    ),
    (
        "java",
        "class A {\n  void f() {\n    try {\n      <|>\n    }\n  }\n}\n",
        "b();\n    } catch (Exception e) {\n      c();\n    }\n  }",
        "b();\n    } catch (Exception e) {\n      c();",
    ),
    (
        "lua",
        "local function f(a)\n  if a then\n    <|>\n  end\nend\n",
        "b()\n  else\n    c()\n  end",
        "b()\n  else\n    c()",
    ),
    (
        "javascript",
        "function f(a) {\n  if (a) {\n    b();\n<|>\n  }\n}\n",
        "  } else {\n    c();\n  }",
        "  } else {\n    c();",
    ),
    # ... but a candidate that ends the block and goes on outside it is cut where it leaves
    ("javascript", "function f(a) {\n  if (a) {\n    <|>\n  }\n}\n", "b();\n  }\n  c();", "b();"),
    (
        "javascript",
        "function f(a) {\n  if (a) {\n    <|>\n  }\n}\n",
        "b();\n}\nfunction g() {\n  c();\n}",
        "b();",
    ),
    # (an else branch left for the user to write: the `}` below closes it)
    ("javascript", "function f(a) {\n  if (a) {\n    <|>\n  }\n}\n", "b();\n  } else {", "b();\n  } else {"),
    ("javascript", "if (a) { f(<|>); }\n", "x); }", "x"),
    # ... on one line too: the parameters' `)`, then the arrow body's `(` whose `)` is below
    (
        "tsx",
        "const l = (\n  <ul>\n    {xs.map((<|>\n      <li>{x}</li>\n    ))}\n  </ul>\n);\n",
        "x) => (",
        "x) => (",
    ),
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
    # the top of a file may not show the step yet: the text after the cursor does
    top = "namespace text {\n\nclass A {\n public:\n"
    cpp = top + "\n  int f() {\n    return 1;\n  }\n};\n\n}  // namespace text\n"
    assert indent_unit(cpp, len(top), "cpp") == "  "


@pytest.mark.parametrize(
    ("src", "indent"),
    [
        # most C++ styles leave a namespace's body (and an `extern "C"` block's) where the namespace is
        ("namespace text {\n\n<|>\n}  // namespace text\n", ""),
        ('extern "C" {\n<|>\n}\n', ""),
        # ... unless the document's other namespaces indent theirs
        ("namespace a {\n  int x;\n}\n\nnamespace b {\n<|>\n}\n", "  "),
        # members after an access specifier sit at the class body's column, wherever the label sits
        ("class A {\n public:\n<|>\n};\n", "    "),
        ("class A {\npublic:\n  int x;\n\nprivate:\n<|>\n};\n", "  "),
        ("namespace n {\n  class A {\n    public:\n<|>\n  };\n}\n", "    "),
        ("void f() {\n  if (x) {\n<|>\n  }\n}\n", "    "),  # other blocks do go one step deeper
    ],
)
def test_cpp_bodies_that_do_not_go_one_step_deeper(ctx_at, src, indent):
    ctx, _ = ctx_at(src, "cpp")
    assert ctx.indent == indent


def test_a_cpp_access_specifier_keeps_the_column_the_model_wrote(ctx_at):
    ctx, _ = ctx_at("class A {\n\n<|>\n  int x_;\n};\n", "cpp")
    assert postprocess(" private:", ctx) == " private:"
    assert postprocess("int y_;", ctx) == "  int y_;"


def test_a_block_longer_than_the_suffix_window_keeps_its_removed_header_open(ctx_at):
    """The block's own `}` lies past the cut suffix window: counted from the window alone, the header the
    user removed came back closed (`if (ready) {}`) and the file no longer parsed."""
    body = "".join(f"    total += step({i}, ready);\n" for i in range(300))
    head = "function f(ready) {\n  let total = 0;\n"
    ctx, _ = ctx_at(head + "<|>" + body + "  }\n  return total;\n}\n", "javascript")
    assert ctx.suffix_cut and ctx.suffix_closers == "}}"
    assert postprocess("  if (ready) {\n", ctx) == "  if (ready) {\n"
    # ... and a candidate deep in a long block may not close the function around it
    ctx, _ = ctx_at(head + "  <|>\n" + body + "  return total;\n}\n", "javascript")
    assert postprocess("total = 1;\n}\n\nfunction g() {", ctx) == "total = 1;"


def test_a_prefix_window_that_starts_inside_a_doc_comment(ctx_at):
    """Scanned as code from inside a comment, an example's ``` fence reads as a template string and hides
    every bracket after it."""
    doc = "/**\n * ```ts\n" + "".join(f" * f({i});\n" for i in range(400)) + " * ```\n */\n"
    src = doc + "function f(xs) {\n  for (const x of xs) {\n    if (x) {\n      go(x);\n<|>\n  }\n}\n"
    ctx, _ = ctx_at(src, "typescript", max_prefix_tokens=200)
    assert ctx.prefix_cut and ctx.open_brackets == "{{{"
    assert postprocess("    }\n", ctx) == "    }"


@pytest.mark.parametrize(
    ("language", "src", "line"),
    [
        # from column 0, a statement that the code line below continues keeps its column
        ("javascript", "<|>    keys = require('./keys');\n\nexport default f;\n", "var b = require('./b'),"),
        ("python", "<|>    Number, Operator\n", "from pygments.token import Comment, \\"),
        ("python", "import sys\n<|>           ['a'])\n", "__all__ = (['b'] +"),
        # ... so do a docstring and a block comment the code line is inside
        ("python", '<|>    Lexers for CodeQL.\n"""\n', '"""'),
        ("javascript", "<|> * Gets the size.\n */\nfunction size() {}\n", "/**"),
        # ... and a block's header with a comment after its colon
        ("python", "import sys\n<|>    import msvcrt\n", "if sys.platform == 'win32':  # pragma: no cover"),
        # several lines: a comment, a bracket or a block they open and the code line goes on with
        ("javascript", "<|> * @returns {number}\n */\nfunction size() {}\n", "/**\n * Gets the size.\n *"),
        ("javascript", "<|>  'every': f,\n};\n", "module.exports = {\n  'countBy': g,\n  'each': h,"),
        ("javascript", "<|>    c = require('./c');\n", "var a = require('./a'),\n    b = require('./b'),"),
        ("python", "<|>    return x\n", 'def f(x):\n    """Identity."""'),
        ("python", "<|>        return 1\n", "class A:\n    def f(self):"),
    ],
)
def test_lines_above_a_code_line_that_continues_them_keep_their_column(ctx_at, language, src, line):
    """From column 0 a candidate left of the code line below it is moved right unless it leads into it."""
    ctx, _ = ctx_at(src, language)
    assert ctx.span.name == "line_above"
    assert postprocess(line + "\n", ctx) == line + "\n" + ctx.line_prefix


@pytest.mark.parametrize(
    ("src", "indent"),
    [
        ("class C:\n    def copy(self, src,\n             dst):\n<|>\n", "        "),
        ("class C:\n    def copy(self, src,\n             dst):<|>\n", "        "),
        ("def f():\n    if (a and\n            b):\n<|>\n        pass\n", "        "),
    ],
)
def test_a_header_broken_over_lines_opens_its_block_from_its_first_line(ctx_at, src, indent):
    ctx, _ = ctx_at(src, "python")
    assert ctx.indent == indent


def test_a_docstring_quote_in_the_suffix_is_not_taken_for_the_candidate_typing_it_again(ctx_at):
    """A lone triple quote (or `}`) opens as often as it closes: the candidate's docstring opener is not
    the suffix's closer, unless the line after it matches too."""
    ctx, _ = ctx_at('x = 1\n\n\n<|>    """\n    __slots__ = ()\n', "python")
    candidate = 'class Frame:\n    """\n    Frame of a traceback.\n'
    assert postprocess(candidate, ctx) == candidate + ctx.line_prefix
    ctx, _ = ctx_at('def f():\n    """Doc.\n    <|>\n    """\n    return 1\n', "python")
    assert postprocess('More.\n    """\n    return 1', ctx) == "More."


def test_continuation_lines_do_not_set_the_indent_step():
    """lodash: `var a = require('a'),` then `    b = require('b');` at four, every body at two."""
    js = "var a = require('a'),\n    b = require('b'),\n    c = 1;\n\nfunction f(x) {\n  return x;\n}\n"
    assert indent_unit(js, len(js), "javascript") == "  "
    # no step shown at all: the language's usual one
    assert indent_unit("var a = require('a'),\n    b = 1;\n", 0, "javascript") == "  "
    # a block's first statement emptied: the line after the opener goes on with it, four in
    lone = "function f(s) {\n\n    ? g(s)\n    : h(s);\n}\n"
    assert indent_unit(lone, lone.index("\n\n") + 1, "javascript") == "  "


GAP_FUNCTION = "def f(xs):\n    out = []\n    for x in xs:\n        out.append(x)\n        <|>\n"


@pytest.mark.parametrize(
    ("below", "candidate", "expected"),
    [
        # the code below sits at the function's body: the lines may end the loop and go on before it
        ("    return out\n", "out.append(-x)\n    out.sort()", "out.append(-x)\n    out.sort()"),
        # ... but not leave the function
        ("    return out\n", "out.append(-x)\nprint(f)", "out.append(-x)"),
        # at the end of the file: the function's last lines, never a new top-level statement
        ("", "out.append(-x)\n    return out", "out.append(-x)\n    return out"),
        ("", "out.append(-x)\n    return out\nprint(f([1]))", "out.append(-x)\n    return out"),
        # an `else:` below closes the loop's block: the lines stay in it
        ("    else:\n        pass\n", "out.append(-x)\n    out.sort()", "out.append(-x)"),
        # a definition below starts something new: the lines stay in the loop
        ("\n\ndef g():\n    pass\n", "out.append(-x)\nprint(1)", "out.append(-x)"),
    ],
)
def test_lines_on_a_blank_line_at_a_block_end_may_go_down_to_the_code_below(
    ctx_at, below, candidate, expected
):
    ctx, _ = ctx_at(GAP_FUNCTION + below, "python")
    assert ctx.span.name == "empty_line"
    assert postprocess(candidate, ctx) == expected


def test_a_closing_brace_below_keeps_the_lines_in_the_block_it_ends(ctx_at):
    ctx, _ = ctx_at("function f(xs) {\n  if (xs) {\n    a();\n    <|>\n  }\n  b();\n}\n", "javascript")
    assert ctx.span.name == "empty_line"
    assert postprocess("c();\n  d();", ctx) == "c();"


def test_a_deeper_python_line_is_not_the_suffix_retyped(ctx_at):
    src = "def f(xs):\n    if not xs:\n<|>        return False\n    return True\n"
    ctx, _ = ctx_at(src, "python")
    # `return False` one block deeper than the code line is the candidate's own branch, not that line
    candidate = "    for x in xs:\n        if x:\n            return False\n    if len(xs) > 3:\n"
    assert postprocess(candidate, ctx) == candidate
    # at the code line's column it is that line, typed again
    assert postprocess("    if xs[0]:\n        return False\n", ctx) == "    if xs[0]:\n"
    # at another column, as the candidate's last line or going on with the lines below, too
    assert postprocess("    if xs[0]:\n            return False\n", ctx) == "    if xs[0]:\n"
    retyped = "    if xs[0]:\n            return False\n        return True\n"
    assert postprocess(retyped, ctx) == "    if xs[0]:\n"


@pytest.mark.parametrize(
    ("language", "rule", "before", "after"),
    [
        ("python", "# -------", "x = 1\n", "y = 2\n"),
        ("javascript", "// ======", "const x = 1;\n", "const y = 2;\n"),
    ],
)
def test_a_separator_comment_is_the_suffix_retyped_only_with_the_line_after_it(
    ctx_at, language, rule, before, after
):
    """A section's separator comment also closes the section above it (`# -------`, `# urllib3`,
    `# -------`): the candidate's own separator, going on with its own section, was cut as the suffix's."""
    ctx, _ = ctx_at(f"{before}<|>\n{rule}\n{after}", language)
    own = f"z = 3\n\n{rule}\n{rule.split()[0]} section"
    assert postprocess(own, ctx, stopped=True) == own
    assert postprocess(f"z = 3\n{rule}\n{after}", ctx, stopped=True) == "z = 3"  # the suffix, typed again


def test_a_blank_line_ends_a_candidate_only_where_the_model_may_have_run_on(ctx_at):
    src = "def f(xs):\n    if not xs:\n        return []\n<|>\n    return out\n"
    ctx, snap = ctx_at(src, "python")
    assert ctx.span.name == "empty_line"
    candidate = "    out = []\n\n    for x in xs:\n        out.append(x)\n"
    # a canvas filled to its end may have run past the span: the blank line is where it ends
    assert postprocess(candidate, ctx) == "    out = []"
    # a model that stopped by itself wrote the blank line and what follows as one span
    assert postprocess(candidate, ctx, stopped=True) == candidate.rstrip()
    assert rank_candidates([(candidate, 0.0)], ctx, snap, stopped=[True]) == [candidate.rstrip()]
    assert rank_candidates([(candidate, 0.0)], ctx, snap) == ["    out = []"]


def test_a_candidate_ended_by_its_model_as_its_engine_says_or_short_of_its_canvas():
    from dg_lsp.engine.types import Candidate, ended_by_model

    assert ended_by_model(Candidate("x", token_ids=[1, 2]), max_tokens=3)
    assert not ended_by_model(Candidate("x", token_ids=[1, 2, 3]), max_tokens=3)  # it may have gone on
    assert not ended_by_model(Candidate("x"), max_tokens=3)  # no ids, no word from the engine
    assert ended_by_model(Candidate("x", stopped=True), max_tokens=3)
    assert not ended_by_model(Candidate("x", token_ids=[1], stopped=False), max_tokens=3)
