"""Prefix/suffix windows: token budgets, cuts at statement boundaries, kept headers and imports."""

from __future__ import annotations

import pytest

from dg_lsp.context import build_context, parse_snapshot
from dg_lsp.context.windows import CHARS_PER_TOKEN

from .snippets import PROGRAMS


def _long_python_class(methods: int = 60) -> str:
    body = "".join(
        f"    def method_{i}(self, x: int) -> int:\n"
        f"        y = x * {i}\n"
        f"        if y > 10:\n"
        f"            y -= {i}\n"
        f"        return y + self.offset\n\n"
        for i in range(methods)
    )
    return "import os\nimport sys\n\n\nclass Big:\n    offset = 3\n\n" + body


def _long_java_class(methods: int = 60) -> str:
    body = "".join(
        f"    public int method{i}(int x) {{\n"
        f"        int y = x * {i};\n"
        f"        if (y > 10) {{\n"
        f"            y -= {i};\n"
        f"        }}\n"
        f"        return y;\n"
        f"    }}\n\n"
        for i in range(methods)
    )
    return "package demo;\n\nimport java.util.List;\n\npublic class Big {\n" + body + "}\n"


def _starts_statement(snapshot, offset: int) -> bool:
    text = snapshot.text
    first = offset + len(text[offset:]) - len(text[offset:].lstrip())
    node = snapshot.tree.root_node.named_descendant_for_byte_range(first, first)
    while node.parent is not None and node.parent.start_byte == node.start_byte:
        node = node.parent
    return node.start_byte == first and node.type != "ERROR"


@pytest.mark.parametrize(
    ("make", "language", "headers"),
    [
        (
            _long_python_class,
            "python",
            ["import os", "import sys", "class Big:", "    def method_40(self, x: int) -> int:"],
        ),
        (
            _long_java_class,
            "java",
            [
                "package demo;",
                "import java.util.List;",
                "public class Big {",
                "    public int method40(int x) {",
            ],
        ),
    ],
)
def test_cut_prefix_keeps_imports_and_enclosing_headers(make, language, headers):
    text = make()
    snap = parse_snapshot(text, language)
    cursor = text.index("return y", text.index("method_40" if language == "python" else "method40("))
    ctx = build_context(snap, cursor, max_prefix_tokens=60, max_suffix_tokens=40)
    assert ctx.prefix_cut and ctx.suffix_cut
    lines = ctx.prefix.split("\n")
    for header in headers:
        assert header in lines, header
    # headers come in document order, before the contiguous window
    positions = [lines.index(h) for h in headers]
    assert positions == sorted(positions)
    assert ctx.prefix.endswith(text[ctx.prefix_start : cursor])
    assert text[ctx.prefix_start - 1] == "\n" and _starts_statement(snap, ctx.prefix_start)
    # within budget (headers included), with a little slack for whole lines
    assert len(ctx.prefix) <= 60 * CHARS_PER_TOKEN * 1.25
    # the suffix stops at the end of a line, after a complete statement
    assert ctx.suffix_end == len(text) or text[ctx.suffix_end] == "\n"
    assert len(ctx.suffix) <= 40 * CHARS_PER_TOKEN


def test_window_prefers_a_top_level_boundary_when_it_is_cheap():
    tail = "".join(f"    v{i} = a * {i}\n" for i in range(30))
    text = _long_python_class(8) + "\n\ndef tail(a):\n" + tail + "    return a\n"
    snap = parse_snapshot(text, "python")
    cursor = text.index("return a")
    start = text.index("def tail") - 40  # the budget ends inside method_7, 40 chars before `def tail`
    ctx = build_context(snap, cursor, max_prefix_tokens=int((cursor - start) / CHARS_PER_TOKEN) + 1)
    assert text[ctx.prefix_start :].startswith("def tail")
    # with a budget ending far before it, the window starts at the nearest statement instead
    start = text.index("def tail") - 300
    ctx = build_context(snap, cursor, max_prefix_tokens=int((cursor - start) / CHARS_PER_TOKEN) + 1)
    assert start <= ctx.prefix_start < text.index("def tail") and _starts_statement(snap, ctx.prefix_start)


def test_short_documents_are_not_cut():
    text = PROGRAMS["go"]
    ctx = build_context(parse_snapshot(text, "go"), text.index("fmt.Println"))
    assert not ctx.prefix_cut and not ctx.suffix_cut
    assert ctx.prefix + ctx.suffix == text


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_windows_in_every_language_end_on_line_boundaries(language):
    text = PROGRAMS[language] * 6
    snap = parse_snapshot(text, language)
    cursor = len(text) // 2
    ctx = build_context(snap, cursor, max_prefix_tokens=80, max_suffix_tokens=30)
    assert ctx.prefix.endswith(text[ctx.prefix_start : cursor])
    assert ctx.prefix_start == 0 or text[ctx.prefix_start - 1] == "\n"
    assert text[cursor:].startswith(ctx.suffix)
    assert ctx.suffix_end == len(text) or text[ctx.suffix_end] == "\n"
    # the rest of the cursor line is always part of the suffix
    assert text[cursor:].split("\n", 1)[0] in ctx.suffix


def test_plain_text_windows_cut_at_lines():
    text = "".join(f"line {i} of the notes\n" for i in range(400))
    cursor = text.index("line 200")
    ctx = build_context(text, cursor, max_prefix_tokens=50, max_suffix_tokens=20)
    assert ctx.language is None and ctx.prefix_cut
    assert ctx.prefix.startswith("line ") and ctx.prefix == text[ctx.prefix_start : cursor]
    assert ctx.suffix.endswith("notes")


def test_replaced_span_is_excluded_from_both_windows():
    text = PROGRAMS["rust"]
    start = text.index("for word")
    end = text.index("}", start) + 1
    ctx = build_context(parse_snapshot(text, "rust"), start, end_offset=end)
    assert ctx.prefix == text[:start] and ctx.suffix == text[end:]
    assert ctx.replaced == text[start:end] and ctx.span.name == "selection"


HEADER_CASES = [
    (
        "python",
        "import os\n\nclass A:\n    def f(self):\n",
        "        x = 1\n",
        "        <|>return x\n",
        ["import os", "class A:", "    def f(self):"],
    ),
    (
        "javascript",
        "import fs from 'fs';\n\nexport class A {\n  f() {\n",
        "    x = 1;\n",
        "    <|>return x;\n  }\n}\n",
        ["import fs from 'fs';", "export class A {", "  f() {"],
    ),
    (
        "typescript",
        "import { X } from './x';\n\nclass A {\n  f(): number {\n",
        "    x = 1;\n",
        "    <|>return x;\n  }\n}\n",
        ["import { X } from './x';", "class A {", "  f(): number {"],
    ),
    (
        "tsx",
        "import React from 'react';\n\nexport function App() {\n",
        "  x = 1;\n",
        "  <|>return <div />;\n}\n",
        ["import React from 'react';", "export function App() {"],
    ),
    (
        "go",
        'package main\n\nimport "fmt"\n\nfunc (c *C) F() int {\n',
        "\tx = 1\n",
        "\t<|>return x\n}\n",
        ["package main", 'import "fmt"', "func (c *C) F() int {"],
    ),
    (
        "rust",
        "use std::io;\n\nimpl A {\n    fn f(&self) -> i32 {\n",
        "        x += 1;\n",
        "        <|>x\n    }\n}\n",
        ["use std::io;", "impl A {", "    fn f(&self) -> i32 {"],
    ),
    (
        "c",
        "#include <stdio.h>\n\nint f(void) {\n",
        "  x += 1;\n",
        "  <|>return x;\n}\n",
        ["#include <stdio.h>", "int f(void) {"],
    ),
    (
        "cpp",
        "#include <vector>\n\nnamespace n {\nclass A {\n public:\n  int f() {\n",
        "    x += 1;\n",
        "    <|>return x;\n  }\n};\n}\n",
        ["#include <vector>", "namespace n {", "class A {", "  int f() {"],
    ),
    (
        "lua",
        'local json = require("json")\n\nfunction M.f(x)\n',
        "  x = x + 1\n",
        "  <|>return x\nend\n",
        ['local json = require("json")', "function M.f(x)"],
    ),
    ("bash", "set -e\n\nf() {\n", "  x=1\n", '  <|>echo "$x"\n}\n', ["f() {"]),
]


@pytest.mark.parametrize(("language", "head", "filler", "tail", "headers"), HEADER_CASES)
def test_headers_are_kept_in_every_language(language, head, filler, tail, headers):
    from .conftest import split_cursor

    text, cursor = split_cursor(head + filler * 300 + tail)
    snap = parse_snapshot(text, language)
    assert not snap.tree.root_node.has_error
    ctx = build_context(snap, cursor, max_prefix_tokens=100)
    assert ctx.prefix_cut
    lines = ctx.prefix.split("\n")
    assert [h for h in headers if h in lines] == headers
    assert ctx.prefix.endswith(filler + tail.split("<|>")[0])
