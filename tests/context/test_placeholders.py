"""Placeholders offered to "Fill placeholder", confirmed by the tree."""

from __future__ import annotations

from dg_lsp.context import find_placeholders, parse_snapshot


def _found(text: str, language: str | None) -> list[tuple[str, str]]:
    return [(p.kind, text[p.start : p.end]) for p in find_placeholders(parse_snapshot(text, language))]


def test_python_placeholders():
    text = (
        "def a():\n    pass\n\n"
        "def b():\n    x = 1\n    pass\n\n"  # not the sole statement
        "def c():\n    '''Doc.'''\n    pass\n\n"  # sole statement after a docstring
        "def d():\n    ...\n\n"
        "s = '...'  # TODO in a trailing comment is not offered\n"
        "# TODO: write e()\n"
        "# fill\n"
    )
    assert _found(text, "python") == [
        ("pass", "pass"),
        ("pass", "pass"),
        ("ellipsis", "..."),
        ("todo", "# TODO: write e()"),
        ("fill", "# fill"),
    ]


def test_brace_languages():
    c = 'int main(void) {\n  /* fill */\n  // FIXME: free the buffer\n  char *s = "/* fill */";\n}\n'
    assert _found(c, "c") == [("fill", "/* fill */"), ("todo", "// FIXME: free the buffer")]
    rust = 'fn f() -> i32 {\n    todo!()\n}\nfn g() {\n    unimplemented!("later")\n}\n// TODO later\n'
    assert _found(rust, "rust") == [
        ("todo_macro", "todo!()"),
        ("todo_macro", 'unimplemented!("later")'),
        ("todo", "// TODO later"),
    ]
    js = "function f() {\n  ...\n}\nconst s = '...';\n"
    assert _found(js, "javascript") == [("ellipsis", "...")]
    go = "package main\n\nfunc f() {\n\t// TODO(me): handle errors\n}\n"
    assert _found(go, "go") == [("todo", "// TODO(me): handle errors")]


def test_lua_bash_java_cpp_ts():
    lua = "local function f()\n  -- TODO: implement\nend\n"
    assert _found(lua, "lua") == [("todo", "-- TODO: implement")]
    bash = 'main() {\n  # FIXME quoting\n  echo "# TODO no"\n}\n'
    assert _found(bash, "bash") == [("todo", "# FIXME quoting")]
    java = "class A {\n  void f() {\n    /* fill */\n  }\n}\n"
    assert _found(java, "java") == [("fill", "/* fill */")]
    assert _found("int f() {\n  // fill\n}\n", "cpp") == [("fill", "// fill")]
    assert _found("function f(): void {\n  // TODO: x\n}\n", "typescript") == [("todo", "// TODO: x")]


def test_plain_text_and_untreed_documents():
    assert _found("TODO: buy milk\n", None) == []
    big = "# TODO: a\n" + "x = 1\n" * 200_000
    assert _found(big, "python") == [("todo", "# TODO: a")]
