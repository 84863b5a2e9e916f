"""Span kind at the cursor, on real snippets in every supported language."""

from __future__ import annotations

import pytest

from dg_lsp.context import SPAN_KINDS

# (language, snippet with <|>, expected kind, expected single_line)
CASES = [
    # Python
    ("python", "def area(r):\n    return 3.14 * r<|>\n", "line_rest", True),
    ("python", "total = compute(<|>x) + 1\n", "argument_list", True),
    ("python", "def mean(xs):\n    n = len(xs)\n    <|>\n    return s / n\n", "empty_line", False),
    ("python", "def mean(xs):\n    <|>\n", "function_body", False),
    ("python", "def mean(xs):<|>\n", "function_body", False),
    ("python", 'def mean(xs):\n    """Average of xs."""\n    <|>\n', "function_body", False),
    ("python", "for i in range(10):<|>\n    pass\n", "block", False),
    ("python", "print(max(a, <|>))\n", "argument_list", True),
    ("python", "def f(a, <|>):\n    return a\n", "argument_list", True),
    ("python", "names = [\n    'a',\n    <|>\n]\n", "brackets", False),
    ("python", "point = {'x': 1, <|>}\n", "brackets", True),
    ("python", "msg = 'hello <|>'\n", "string", True),
    ("python", "name = f'{user.<|>}'\n", "line_rest", True),
    ("python", "x = 1  # the <|>\n", "comment", True),
    ("python", 'def f():\n    """Return the <|>\n    """\n', "docstring", False),
    ("python", "result = call(a, <|>\n", "argument_list", True),
    ("python", 'x = "abc<|>\ny = 2\n', "string", True),  # unterminated: the tree only has ERROR
    ("python", 'def f():\n    """<|>\n\nx = 1\n', "docstring", False),
    ("python", "x = foo(a,\n      <|>\n", "argument_list", False),
    ("python", "def mean(xs):\n    n = len(xs)\n    <|>return s / n\n", "line_above", False),
    ("python", "def mean(xs):\n    n = len(xs)\n<|>    return s / n\n", "line_above", False),
    ("python", "def broken(:\n    pass\n\nx = [\n    1,\n]\n<|>\n", "empty_line", False),  # error far away
    # JavaScript
    ("javascript", "function add(a, b) {\n  <|>\n}\n", "function_body", False),
    ("javascript", "const xs = [1, 2, <|>];\n", "brackets", True),
    ("javascript", "console.log('sum', <|>);\n", "argument_list", True),
    ("javascript", "const s = `hi ${name<|>}`;\n", "line_rest", True),
    ("javascript", 'const greeting = "Hello, <|>";\n', "string", True),
    # code in a template the line has not closed: the rest of the line, closing the braces and the string
    ("javascript", "const s = `a ${user.<|>\n", "string", True),
    ("javascript", "// compute the <|>\nlet x = 1;\n", "comment", True),
    ("javascript", "function f(a) {\n  const b = a * 2;\n  <|>\n  return b;\n}\n", "empty_line", False),
    ("javascript", "if (ready) {<|>\n}\n", "block", False),
    ("javascript", "if (x {\n  y = [1, <|>\n", "brackets", True),  # inside error recovery
    # TypeScript / TSX
    ("typescript", "function len(s: string): number {\n  <|>\n}\n", "function_body", False),
    ("typescript", 'const m = new Map<string, number>([["a", <|>]]);\n', "brackets", True),
    ("typescript", "interface P { x: number; }\nconst p: P = { x: <|> };\n", "brackets", True),
    ("tsx", 'const App = () => <div className="app">{items.map(<|>)}</div>;\n', "argument_list", True),
    ("tsx", "function App() {\n  <|>\n}\n", "function_body", False),
    # Go
    ("go", "package main\n\nfunc add(a, b int) int {\n\t<|>\n}\n", "function_body", False),
    ("go", 'package main\n\nfunc main() {\n\tfmt.Println("x", <|>)\n}\n', "argument_list", True),
    ("go", "package main\n\nvar xs = []int{1, <|>}\n", "brackets", True),
    ("go", "package main\n\nfunc main() {\n\tx := 1\n\tif x > 0 {<|>\n\t}\n}\n", "block", False),
    ("go", 'package main\n\nvar s = "abc<|>"\n', "string", True),
    # Rust
    ("rust", "fn main() {\n    let v = vec![1, <|>];\n}\n", "brackets", True),
    ("rust", 'fn main() {\n    println!("{}", <|>);\n}\n', "argument_list", True),
    ("rust", "fn sq(x: i32) -> i32 {\n    <|>\n}\n", "function_body", False),
    ("rust", 'fn main() {\n    let s = "hello <|>";\n}\n', "string", True),
    ("javascript", "function f(a) {\n  <|>return b;\n}\n", "line_above", False),
    ("rust", 'fn main() {\n    let x = 1;\n    <|>\n    println!("{}", x);\n}\n', "empty_line", False),
    # C
    ("c", '#include <stdio.h>\nint main(void) {\n  printf("%d\\n", <|>);\n}\n', "argument_list", True),
    ("c", "int sum(int *a, int n) {\n  <|>\n}\n", "function_body", False),
    ("c", "int xs[] = {1, 2, <|>};\n", "brackets", True),
    ("c", 'char *s = "abc<|>\nint y;\n', "string", True),
    ("c", "int main(void) {\n  /* count the <|> */\n  return 0;\n}\n", "comment", True),
    # C++
    ("cpp", "#include <vector>\nstd::vector<int> v{1, <|>};\n", "brackets", True),
    ("cpp", "class Stack {\n public:\n  int pop() {\n    <|>\n  }\n};\n", "function_body", False),
    ("cpp", 'int main() {\n  std::string s = "ab<|>";\n}\n', "string", True),
    # Java
    ("java", "class A {\n  int twice(int x) {\n    <|>\n  }\n}\n", "function_body", False),
    ("java", "class A {\n  void f() {\n    System.out.println(<|>);\n  }\n}\n", "argument_list", True),
    ("java", "class A {\n  int[] xs = {1, <|>};\n}\n", "brackets", True),
    # Lua
    ("lua", "local function add(a, b)\n  <|>\nend\n", "function_body", False),
    ("lua", "local t = {1, 2, <|>}\n", "brackets", True),
    ("lua", "local function add(a, b)<|>\nend\n", "function_body", False),
    ("lua", "local function f(x)\n  if x > 0 then<|>\n  end\nend\n", "block", False),
    ("lua", 'print("x", <|>)\n', "argument_list", True),
    ("lua", 'local s = "abc<|>"\n', "string", True),
    # Bash
    ("bash", "greet() {\n  <|>\n}\n", "function_body", False),
    ("bash", 'echo "hello <|>"\n', "string", True),
    ("bash", 'for f in *.txt; do\n  echo "$f"\n  <|>\ndone\n', "empty_line", False),
    ("bash", "ls -la <|>\n", "line_rest", True),
]


@pytest.mark.parametrize(("language", "src", "expected", "single_line"), CASES)
def test_span_kind(ctx_at, language, src, expected, single_line):
    ctx, _ = ctx_at(src, language)
    assert ctx.span.name == expected
    assert ctx.span.single_line is single_line


def test_every_kind_in_the_table_is_exercised():
    seen = {c[2] for c in CASES} | {"placeholder", "selection"}
    assert seen == set(SPAN_KINDS)


def test_comments_are_off_unless_asked(ctx_at):
    src = "x = 1  # the <|>\n"
    assert not ctx_at(src, "python")[0].span.enabled
    assert ctx_at(src, "python", comments=True)[0].span.enabled


def test_string_kind_carries_its_closing_quote(ctx_at):
    assert ctx_at("msg = 'hello <|>'\n", "python")[0].span.quote == "'"
    assert ctx_at('def f():\n    """Doc <|>\n    """\n', "python")[0].span.quote == '"""'
    assert ctx_at("const s = `a <|>`;\n", "javascript")[0].span.quote == "`"


def test_a_string_being_typed_is_the_rest_of_a_line(ctx_at):
    """Not closed on its line yet: the candidate may close it and finish the line, as code. Closed (or
    auto-closed by the editor): the candidate completes the string and stops at its quote."""
    typed = ctx_at('names = {"fi<|>\n', "python")[0].span
    closed = ctx_at('names = {"fi<|>"}\n', "python")[0].span
    assert (typed.name, typed.stop, typed.prose, typed.quote) == ("string", "line", False, '"')
    assert typed.max_tokens == SPAN_KINDS["line_rest"].max_tokens
    assert (closed.name, closed.stop, closed.prose) == ("string", "quote", True)
    assert closed.max_tokens == SPAN_KINDS["string"].max_tokens


@pytest.mark.parametrize(
    ("language", "src"),
    [
        # the parser runs the unterminated string on to the next line's quote: still one being typed
        ("javascript", "var rsRegional = '(?:\\\\ud83c[\\\\ud<|>\n    rsSurrPair = '[\\\\ud800]';\n"),
        ("python", "names = ['fi<|>\nother = 'x'\n"),
        ("go", 'package main\n\nvar s = "ab<|>\nvar t = "c"\n'),
    ],
)
def test_a_string_being_typed_that_the_parser_runs_across_lines(ctx_at, language, src):
    span = ctx_at(src, language)[0].span
    assert (span.name, span.stop, span.single_line, span.prose) == ("string", "line", True, False)


def test_strings_that_do_span_lines_stay_multi_line(ctx_at):
    assert ctx_at('def f():\n    """Doc <|>\n    more\n    """\n', "python")[0].span.name == "docstring"
    assert not ctx_at("const s = `a <|>\nb`;\n", "javascript")[0].span.single_line
    assert not ctx_at('fn main() {\n    let s = "a <|>\nb";\n}\n', "rust")[0].span.single_line


def test_kind_caps_the_canvas_length(ctx_at):
    line = ctx_at("x = compute<|>\n", "python", max_tokens=100)[0]
    body = ctx_at("def f(x):\n    <|>\n", "python", max_tokens=100)[0]
    assert line.span.max_tokens == SPAN_KINDS["line_rest"].max_tokens < body.span.max_tokens == 100
    assert ctx_at("def f(x):\n    <|>\n", "python", max_tokens=20)[0].span.max_tokens == 20


def test_line_start_spans_are_as_long_as_the_user_allows(ctx_at):
    """A blank line in a block, the start of a code line and a line of a literal or argument list took at
    most 48 (24) tokens whatever `maxTokens` said, which cut 23 of HumanEval's 73 sampled multi-line answers
    even for a perfect model. Inside a line the kind's own cap stays."""
    from dg_lsp.pipeline import plan
    from dg_lsp.settings import Settings

    for src, kind in (
        ("def mean(xs):\n    n = len(xs)\n    <|>\n    return s / n\n", "empty_line"),
        ("def mean(xs):\n    n = len(xs)\n    <|>return s / n\n", "line_above"),
        ("NUMBERS = {\n    'one': 1,\n    <|>\n}\n", "brackets"),
        ("total = add(\n    first,\n    <|>\n)\n", "argument_list"),
    ):
        ctx, snap = ctx_at(src, "python", max_tokens=128)
        assert (ctx.span.name, ctx.span.max_tokens) == (kind, 128)
        _, request = plan(snap, src.index("<|>"), Settings(max_tokens=128))
        assert request.max_tokens == 128
        assert ctx_at(src, "python")[0].span.max_tokens == 48  # the default maxTokens still rules
    inline = ctx_at("total = add(first, <|>)\n", "python", max_tokens=128)[0].span
    assert (inline.name, inline.max_tokens) == ("argument_list", SPAN_KINDS["argument_list"].max_tokens)


def test_replaced_range_is_selection_or_placeholder(ctx_at):
    src = "def f(x):\n    <|>pass\n"
    ctx, snap = ctx_at(src, "python")
    start = ctx.cursor_offset
    from dg_lsp.context import build_context

    fill = build_context(snap, start, end_offset=start + 4)
    assert fill.span.name == "placeholder"
    assert fill.prefix.endswith("def f(x):\n    ") and fill.suffix == "\n"
    rewrite = build_context(snap, 0, end_offset=start + 4, max_tokens=8)
    assert rewrite.span.name == "selection" and not rewrite.span.single_line
    assert rewrite.span.max_tokens > 8  # room for at least the selection itself


def test_plain_text_has_line_kinds():
    from dg_lsp.context import build_context

    text = "Dear reader,\n\nThis is a note\n"
    assert build_context(text, text.index("note") + 4).span.name == "line_rest"
    assert build_context(text, text.index("\n\n") + 1).span.name == "empty_line"
    assert build_context(text, 3).language is None


@pytest.mark.parametrize(
    ("line", "language", "opened"),
    [
        ("x = 'ab", "python", ("'", 0)),
        ("name = f'{user.", "python", ("'", 1)),  # code inside an f-string
        ("name = f'{user.name} is ", "python", ("'", 0)),
        ("x = f'{{literal", "python", ("'", 0)),
        ('    """Summary', "python", ('"""', 0)),
        ("s = `a ${b.", "javascript", ("`", 1)),
        ('x = "a\\"b', "c", ('"', 0)),
        ("fn f<'a>(x: &'a str) { let s = \"ab", "rust", ('"', 0)),  # lifetimes are not quotes
        ("echo it's # done", "bash", ("'", 0)),
        ("x = 1  # it's", "python", ("", 0)),  # in a comment
    ],
)
def test_open_string(line, language, opened):
    from dg_lsp.context.brackets import open_string

    assert open_string(line, language) == opened


@pytest.mark.parametrize(
    ("src", "blank_start"),
    [
        ("def mean(xs):\n    n = len(xs)\n<|>    return s / n\n", False),  # line_above
        ("def mean(xs):\n    n = len(xs)\n    <|>\n    return s / n\n", False),  # empty_line
        ("def mean(xs):\n    <|>\n", False),  # function_body on its blank line
        ("def mean(xs):<|>\n", True),  # function_body after the signature: the newline comes first
        ("def area(r):\n    return 3.14 * r<|>\n", True),  # line_rest
    ],
)
def test_a_blank_first_line_is_barred_only_where_lines_start(ctx_at, src, blank_start):
    ctx, _ = ctx_at(src, "python")
    assert ctx.blank_start is blank_start
    assert ctx.to_request().blank_start is blank_start
