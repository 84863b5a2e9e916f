"""Syntax check verdicts, candidate ranking and the ERROR/MISSING nodes code actions need."""

from __future__ import annotations

import pytest

from dg_lsp.context import (
    build_context,
    find_syntax_errors,
    parse_snapshot,
    rank_candidates,
    syntax_delta,
    verdict,
)

from .conftest import split_cursor
from .snippets import PROGRAMS

# (language, snippet, candidate that fits, candidate that breaks the file)
VERDICTS = [
    ("python", "def area(r):\n    return <|>\n", "3.14 * r * r", "3.14 * (r"),
    ("python", "def f(x):\n    <|>\n", "return x", "return x +"),
    ("javascript", "function add(a, b) {\n  return <|>;\n}\n", "a + b", "a + {"),
    ("typescript", "function f(s: string): number {\n  return <|>;\n}\n", "parseInt(s, 10)", "parseInt(s, "),
    ("tsx", "const el = <div><|></div>;\n", "<span>hi</span>", "<span>hi"),
    ("go", "package main\n\nfunc f() int {\n\treturn <|>\n}\n", "len(xs) * 2", "len(xs) *"),
    ("rust", "fn f(v: &[i32]) -> i32 {\n    <|>\n}\n", "v.iter().sum()", "v.iter().sum("),
    ("c", "int f(int x) {\n  return <|>;\n}\n", "x * x", "x * "),
    ("cpp", "int f(std::vector<int>& v) {\n  return <|>;\n}\n", "v.size()", "v.size("),
    ("java", "class A {\n  int f(int x) {\n    return <|>;\n  }\n}\n", "x * 2", "x * "),
    ("lua", "local function f(x)\n  return <|>\nend\n", "x * 2", "x *"),
    ("bash", 'if [ -f "$1" ]; then\n  <|>\nfi\n', 'cat "$1"', 'cat "$1'),
]


@pytest.mark.parametrize(("language", "src", "good", "bad"), VERDICTS)
def test_syntax_delta_accepts_fitting_and_rejects_breaking_candidates(language, src, good, bad):
    text, offset = split_cursor(src)
    ok = syntax_delta(text, offset, offset, good, language)
    broken = syntax_delta(text, offset, offset, bad, language)
    assert ok.ok and ok.new_errors <= 0
    assert not broken.ok and broken.new_errors > 0 and broken.errors_after > broken.errors_before


def test_a_candidate_that_fixes_the_file_has_negative_delta():
    text, offset = split_cursor("x = compute(1, <|>\ny = 2\n")
    judged = syntax_delta(text, offset, offset, "2)", "python")
    assert judged.ok and judged.new_errors < 0 and judged.errors_after == 0


def test_an_existing_error_elsewhere_does_not_reject_candidates():
    text, offset = split_cursor("def broken(:\n    pass\n\n\ndef f(x):\n    return <|>\n")
    judged = syntax_delta(text, offset, offset, "x + 1", "python")
    assert judged.ok and judged.errors_before > 0


def test_replacing_a_range_is_judged_against_the_text_without_it():
    text = PROGRAMS["java"]
    start = text.index("items.size()")
    end = start + len("items.size()")
    snap = parse_snapshot(text, "java")
    assert verdict(snap, start, end, "items.isEmpty() ? 0 : items.size()").ok
    assert not verdict(snap, start, end, "items.size(").ok


def test_python_empty_blocks_count_as_errors():
    text, offset = split_cursor("def f(x):\n    <|>\n")
    snap = parse_snapshot(text, "python")
    assert not snap.tree.root_node.has_error  # tree-sitter accepts an empty block...
    issues = find_syntax_errors(snap)
    assert [i.kind for i in issues] == ["missing"] and "indented block" in issues[0].message
    # ...so a candidate that leaves a new block empty is rejected, one that fills it is preferred
    assert not syntax_delta(text, offset, offset, "if x:\n    y = 1", "python").new_errors < 0
    assert syntax_delta(text, offset, offset, "return x", "python").new_errors == -1


def test_rank_candidates_cleans_dedupes_rejects_and_orders():
    src = "def area(r):\n    return <|>\n\n\nprint(area(2))\n"
    text, offset = split_cursor(src)
    snap = parse_snapshot(text, "python")
    ctx = build_context(snap, offset)
    ranked = rank_candidates(
        [
            ("3.14 * r +", -0.1),  # breaks the file
            ("r * r   ", -0.9),
            ("3.14159 * r ** 2\n", -0.3),
            ("r * r", -0.5),  # same as the second once cleaned; keeps the better score
            ("", -0.01),  # empty
        ],
        ctx,
        snap,
    )
    assert ranked == ["3.14159 * r ** 2", "r * r"]


def test_rank_prefers_candidates_that_fix_errors():
    text, offset = split_cursor("total = add(1, <|>\nprint(total)\n")
    snap = parse_snapshot(text, "python")
    ctx = build_context(snap, offset)
    ranked = rank_candidates([("2", -0.1), ("2)", -0.4)], ctx, snap)
    assert ranked[0] == "2)"


def test_lines_inserted_above_the_code_at_the_cursor_keep_it_on_its_own_line():
    text, offset = split_cursor("def mean(xs):\n    n = len(xs)\n<|>    return s / n\n")
    snap = parse_snapshot(text, "python")
    ctx = build_context(snap, offset)
    candidates = [("    s = sum(xs)\n    return", -0.2), ("    s = sum(xs) +\n", -0.1)]
    ranked = rank_candidates(candidates, ctx, snap)
    assert ranked == ["    s = sum(xs)\n"]
    filled = text[:offset] + ranked[0] + text[offset:]
    assert not parse_snapshot(filled, "python").tree.root_node.has_error


def test_a_multi_line_candidate_cut_short_shows_its_lines_that_parse():
    """The canvas ended inside a block: `if p % k == 0:` with no body, then the suffix's line at a column
    the block never returns to. Rejected whole, its first lines are a right answer still."""
    src = "def prime_fib(n):\n    def is_prime(p):\n<|>        f.append(f[-1] + f[-2])\n"
    text, offset = split_cursor(src)
    snap = parse_snapshot(text, "python")
    ctx = build_context(snap, offset)
    first = "        if p < 2:\n            return False\n"
    cut = first + "        for k in range(2, p):\n            if p % k == 0:\n"
    assert not verdict(snap, offset, offset, cut).ok
    assert rank_candidates([(cut, -0.1)], ctx, snap) == [first]
    # a whole candidate that parses comes first, whatever its score
    whole = "        return p > 1\n"
    assert rank_candidates([(cut, -0.1), (whole, -0.9)], ctx, snap)[0] == whole


def test_rank_without_tree_only_postprocesses():
    ctx = build_context("hello wor", 9)
    assert rank_candidates([("ld\nmore", -1.0)], ctx, None) == ["ld"]


@pytest.mark.parametrize(
    ("language", "text", "kind", "needle"),
    [
        ("python", "def f(x):\n    return (x +\n\ny = 2\n", "error", "return (x +"),
        ("c", "int main(void) {\n  int x = 1\n  return x;\n}\n", "missing", "';'"),
        ("javascript", "function f() {\n  return [1, 2;\n}\n", None, None),
        ("go", "package main\n\nfunc main() {\n\tx := \n}\n", None, None),
        ("rust", "fn main() {\n    let x = ;\n}\n", None, None),
        ("java", "class A {\n  void f() {\n    int x = 1\n  }\n}\n", "missing", "';'"),
        ("lua", "local function f(\n  return 1\nend\n", None, None),
        ("bash", "if [ -f x ]; then\n  echo hi\n", None, None),
    ],
)
def test_find_syntax_errors(language, text, kind, needle):
    issues = find_syntax_errors(parse_snapshot(text, language))
    assert issues, "the broken snippet must report at least one issue"
    for issue in issues:
        assert 0 <= issue.start <= issue.end <= len(text)
        assert issue.repair_start <= issue.start and issue.repair_end >= min(issue.end, len(text) - 1)
        assert text[issue.repair_start : issue.repair_end].strip()
    if kind is not None:
        assert any(i.kind == kind and needle in (i.message + text[i.start : i.end]) for i in issues)


def test_clean_programs_have_no_issues():
    for language, text in PROGRAMS.items():
        assert find_syntax_errors(parse_snapshot(text, language)) == [], language


def test_python_misindented_statements_are_errors():
    text, offset = split_cursor("def f():\n    <|>\n    return x\n")
    assert syntax_delta(text, offset, offset, "x = 1", "python").ok
    judged = syntax_delta(text, offset, offset, "x = 1\n        y = 2", "python")
    assert not judged.ok and judged.new_errors == 1
    issues = find_syntax_errors(parse_snapshot("def f():\n    x = 1\n        y = 2\n", "python"))
    assert [(i.kind, i.message) for i in issues] == [("error", "unexpected indentation")]
    # a one-line body is not a column mismatch
    assert find_syntax_errors(parse_snapshot("if x: y = 1\nelse:\n    y = 2\n", "python")) == []


def test_find_syntax_errors_in_a_range():
    text = "def a(:\n    pass\n\n\ndef b():\n    return [1,\n\n\ndef c():\n"
    snap = parse_snapshot(text, "python")
    everything = find_syntax_errors(snap)
    second = text.index("def b")
    local = find_syntax_errors(snap, second, second + 20)
    assert local and len(local) < len(everything)
    assert all(i.end >= second and i.start <= second + 20 for i in local)


def test_a_string_s_closing_quote_is_kept_only_where_the_document_does_not_close_it():
    q = "'" * 3
    typed = f"def mean(xs):\n    {q}Running <|>\n    return sum(xs) / len(xs)\n"
    closed = f"def mean(xs):\n    {q}Running <|>\n\n    More.\n    {q}\n    return sum(xs) / len(xs)\n"
    for src, shown in ((typed, f"mean.{q}"), (closed, "mean.")):
        text, offset = split_cursor(src)
        snap = parse_snapshot(text, "python")
        ctx = build_context(snap, offset)
        assert ctx.span.stop == "quote"
        assert rank_candidates([(f"mean.{q}\n    return 1", -0.1)], ctx, snap) == [shown]
