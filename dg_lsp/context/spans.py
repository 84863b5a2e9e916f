"""What kind of span the cursor is in, which decides the canvas length and the stop rule.

| kind | cursor | max_tokens | single_line | stop | on |
|---|---|--:|---|---|---|
| `line_rest` | after code on a line (end or middle) | 32 | yes | line | yes |
| `empty_line` | on a blank line inside a block | 128 | no | blank_line | yes |
| `line_above` | at the indentation of a code line: new lines go above it | 128 | no | blank_line | yes |
| `block` | end of a line opening a block (`:`, `{`) | 64 | no | dedent | yes |
| `function_body` | empty function body, after signature/docstring | 128 | no | dedent | yes |
| `argument_list` | inside call arguments or a parameter list | 24 (128) | if inline | bracket | yes |
| `brackets` | inside a list/dict/array/table literal | 48 (128) | if inline | bracket | yes |
| `string` | inside a string literal (prose; typed, not closed: code) | 16 (48) | unless multi | quote | yes |
| `docstring` | inside a docstring (prose) | 64 | no | quote | yes |
| `comment` | inside a comment (prose) | 24 | yes | line | no |
| `placeholder` | replacing `...`/`pass`/TODO/`/* fill */`/`todo!()` | 128 | no | dedent | yes |
| `selection` | replacing a selection (rewrite) | 1.5x + 16 | if one line | dedent | yes |

`max_tokens` is a ceiling: the effective canvas is `min(kind, caller's max_tokens)`, except for
`selection` and `placeholder`, which must be allowed to be as long as what they replace. In brackets, the
figure in parentheses is for whole lines (the cursor at a line start inside them), as at other line starts.

Stop rules (applied by `postprocess`): `line` cuts at the first newline; `blank_line` cuts at the first
blank line; `dedent` cuts at the first line indented less than the cursor's block; `bracket` cuts where
the candidate closes a bracket the suffix already closes; `quote` cuts at the string's closing quote.
A single-line string the user is typing, its closing quote not on the line yet, is the rest of a line: stop
`line`, 32 tokens, post-processed as code (the candidate closes the string and finishes the line).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import tree_sitter

from dg_lsp.context.brackets import open_string, unmatched_openers
from dg_lsp.context.documents import DocumentSnapshot


@dataclass(frozen=True)
class SpanKind:
    name: str
    max_tokens: int
    single_line: bool
    enabled: bool = True
    stop: str = "line"
    """`line`, `blank_line`, `dedent`, `bracket` or `quote` (see the module docstring)."""
    prose: bool = False
    """Natural language rather than code (strings, docstrings, comments)."""
    quote: str = ""
    """Closing delimiter of the string at the cursor, for the `quote` stop rule."""


SPAN_KINDS: dict[str, SpanKind] = {
    k.name: k
    for k in (
        SpanKind("line_rest", 32, True, stop="line"),
        SpanKind("empty_line", 128, False, stop="blank_line"),
        SpanKind("line_above", 128, False, stop="blank_line"),
        SpanKind("block", 64, False, stop="dedent"),
        SpanKind("function_body", 128, False, stop="dedent"),
        SpanKind("argument_list", 24, True, stop="bracket"),
        SpanKind("brackets", 48, True, stop="bracket"),
        SpanKind("string", 16, True, stop="quote", prose=True),
        SpanKind("docstring", 64, False, stop="quote", prose=True),
        SpanKind("comment", 24, True, enabled=False, stop="line", prose=True),
        SpanKind("placeholder", 128, False, stop="dedent"),
        SpanKind("selection", 48, False, stop="dedent"),
    )
}

FUNCTION_TYPES = frozenset(
    {
        "function_definition",
        "function_declaration",
        "method_declaration",
        "method_definition",
        "function_item",
        "arrow_function",
        "function_expression",
        "generator_function_declaration",
        "generator_function",
        "constructor_declaration",
        "func_literal",
        "lambda_expression",
        "local_function",
        "function",
        "closure_expression",
        "compact_constructor_declaration",
    }
)
DEFINITION_TYPES = FUNCTION_TYPES | frozenset(
    {
        "class_definition",
        "class_declaration",
        "class",
        "abstract_class_declaration",
        "interface_declaration",
        "enum_declaration",
        "record_declaration",
        "impl_item",
        "trait_item",
        "mod_item",
        "namespace_definition",
        "class_specifier",
        "struct_specifier",
        "internal_module",
        "module",
        "object",
        "enum_item",
        "struct_item",
        "union_specifier",
        "annotation_type_declaration",
    }
)
ARG_TYPES = frozenset(
    {
        "argument_list",
        "arguments",
        "parameters",
        "formal_parameters",
        "parameter_list",
        "type_arguments",
        "template_argument_list",
        "lambda_parameters",
        "closure_parameters",
    }
)
BRACKET_TYPES = frozenset(
    {
        "list",
        "dictionary",
        "set",
        "tuple",
        "parenthesized_expression",
        "list_comprehension",
        "dictionary_comprehension",
        "set_comprehension",
        "generator_expression",
        "subscript",
        "array",
        "object",
        "array_expression",
        "tuple_expression",
        "field_initializer_list",
        "literal_value",
        "initializer_list",
        "array_initializer",
        "table_constructor",
        "subscript_expression",
        "index_expression",
        "array_pattern",
        "object_pattern",
        "element_list",
    }
)
_STRING_CODE = frozenset(
    {
        "interpolation",
        "template_substitution",
        "command_substitution",
        "expansion",
        "simple_expansion",
        "format_expression",
        "string_interpolation",
    }
)
_CODE_SCOPES = ("block", "body", "statement", "declaration_list", "statement_list", "chunk", "program")
_PLACEHOLDER_TEXT = re.compile(
    r"^(\.\.\.|…|pass|(todo|unimplemented)!\s*\(.*\);?|(#|//|--|/\*)\s*(fill|fill in|fill me)\s*(\*/)?)$",
    re.IGNORECASE | re.DOTALL,
)
TODO_RE = re.compile(r"\b(TODO|FIXME)\b")
_BLOCK_OPENER = re.compile(
    r"(:|\{|\bthen|\bdo|\belse|\brepeat|\bin|\bfunction\b[^()]*\([^()]*\))$"  # Lua/Bash too
)


def kind(name: str, **changes: object) -> SpanKind:
    base = SPAN_KINDS[name]
    return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]


def is_placeholder_text(text: str) -> bool:
    stripped = text.strip()
    return bool(_PLACEHOLDER_TEXT.match(stripped)) or (
        bool(TODO_RE.search(stripped)) and stripped.startswith(("#", "//", "--", "/*"))
    )


def is_comment(node: tree_sitter.Node) -> bool:
    return "comment" in node.type


def is_string(node: tree_sitter.Node) -> bool:
    t = node.type
    return node.is_named and (
        t in {"string", "raw_string", "template_string", "text_block", "heredoc_body", "ansi_c_string"}
        or t.endswith("string_literal")
        or t in {"char_literal", "character_literal", "rune_literal"}
    )


def body_of(node: tree_sitter.Node) -> tree_sitter.Node | None:
    return node.child_by_field_name("body")


def statements(body: tree_sitter.Node) -> list[tree_sitter.Node]:
    """Named statements of a body, ignoring comments and (Python) a leading docstring."""
    out = []
    for child in body.named_children:
        if child.type == "statement_list":
            out.extend(c for c in child.named_children if not is_comment(c))
        elif not is_comment(child):
            out.append(child)
    if out and out[0].type == "expression_statement" and out[0].named_child_count == 1:
        if out[0].named_children[0].type == "string":
            out = out[1:]
    return out


def ancestors(node: tree_sitter.Node | None) -> list[tree_sitter.Node]:
    out = []
    while node is not None:
        out.append(node)
        node = node.parent
    return out


def _is_docstring(string: tree_sitter.Node) -> bool:
    stmt = string.parent
    if stmt is None or stmt.type != "expression_statement":
        return False
    scope = stmt.parent
    if scope is None or scope.type not in {"block", "module"}:
        return False
    first = scope.named_children[0] if scope.named_child_count else None
    return first is not None and first.id == stmt.id


def _quote(snapshot: DocumentSnapshot, string: tree_sitter.Node) -> str:
    last = string.children[-1] if string.child_count else None
    if last is not None and (not last.is_named or last.type == "string_end") and not last.is_missing:
        return snapshot.data[last.start_byte : last.end_byte].decode("utf-8", errors="replace")
    head = snapshot.data[string.start_byte : string.start_byte + 3].decode("utf-8", errors="replace")
    return head[:3] if head[:3] in ('"""', "'''") else head[:1]


_ONE_LINE_QUOTES = frozenset({"python", "javascript", "typescript", "tsx", "java", "c", "cpp", "go", "lua"})
"""Languages whose `'...'` and `"..."` strings end on their line (Rust's and the shell's may not)."""


def _typed_across_lines(raw: bytes, language: str | None) -> bool:
    """A `'...'` or `"..."` string spans lines where such strings end on their line: it is unterminated, a
    string the user is typing, and the parser ran it on to the next quote."""
    one_quote = raw[:1] in (b"'", b'"') and raw[:3] not in (b"'''", b'"""')
    return one_quote and language in _ONE_LINE_QUOTES and b"\n" in raw and b"\\\n" not in raw


def _typed_string(quote: str) -> SpanKind:
    """A string the user is typing, its closing quote not on the line yet: the rest of the line is theirs to
    write, so the candidate may close the string and finish the line as code."""
    rest_of_line = SPAN_KINDS["line_rest"].max_tokens
    return kind("string", quote=quote, stop="line", prose=False, max_tokens=rest_of_line)


def _string_or_comment(snapshot: DocumentSnapshot, b: int, comments: bool) -> SpanKind | None:
    if b == 0:
        return None
    node = snapshot.tree.root_node.descendant_for_byte_range(b - 1, b)  # type: ignore[union-attr]
    for anc in ancestors(node):
        if anc.type in _STRING_CODE:
            return None
        if is_comment(anc):
            tail = snapshot.data[anc.end_byte - 2 : anc.end_byte]
            inside = anc.start_byte < b < anc.end_byte or (b == anc.end_byte and tail not in (b"*/", b"]]"))
            return kind("comment", enabled=comments) if inside else None
        if is_string(anc):
            if not anc.start_byte < b < anc.end_byte:
                return None
            quote = _quote(snapshot, anc)
            raw = snapshot.data[anc.start_byte : anc.end_byte]
            if _typed_across_lines(raw, snapshot.language):
                return _typed_string(raw[:1].decode())
            multiline = b"\n" in raw or quote in ('"""', "'''")
            if snapshot.language == "python" and multiline and _is_docstring(anc):
                return kind("docstring", quote=quote)
            return kind("string", quote=quote, single_line=not multiline, max_tokens=48 if multiline else 16)
        if anc.type.endswith(_CODE_SCOPES):
            return None
    return None


def _container(snapshot: DocumentSnapshot, b: int) -> str | None:
    node = snapshot.tree.root_node.descendant_for_byte_range(b, b)  # type: ignore[union-attr]
    for anc in ancestors(node):
        if not anc.start_byte < b < anc.end_byte:
            continue
        if anc.type in ARG_TYPES:
            return "argument_list"
        if anc.type in BRACKET_TYPES and anc.child_count and not anc.children[0].is_named:
            return "brackets"
        if anc.type == "token_tree" and anc.child_count:  # Rust macro: `println!(..)`, `vec![..]`
            return "argument_list" if anc.children[0].type == "(" else "brackets"
        if anc.is_error:
            return None
        if anc.type.endswith(_CODE_SCOPES) or anc.type in DEFINITION_TYPES:
            return None
    return None


def _container_from_text(text: str, offset: int, language: str | None) -> str | None:
    """Bracket context from the text of the current paragraph (up to 10 lines, no blank line)."""
    start = text.rfind("\n", 0, offset) + 1
    for _ in range(10):
        if start == 0:
            break
        prev = text.rfind("\n", 0, start - 1) + 1
        if not text[prev:start].strip():
            break
        start = prev
    window = text[start:offset]
    openers = unmatched_openers(window, language)
    if not openers:
        return None
    inner = openers[-1]
    pos = len(window) - 1
    depth = 0
    # locate the innermost unmatched opener to see whether it follows a callee
    for i in range(len(window) - 1, -1, -1):
        ch = window[i]
        if ch in ")]}":
            depth += 1
        elif ch in "([{":
            if depth == 0:
                pos = i
                break
            depth -= 1
    if inner == "(":
        before = window[:pos].rstrip()
        return "argument_list" if before and (before[-1].isalnum() or before[-1] in "_)]>") else "brackets"
    if inner == "[":
        return "brackets"
    if language in ("python", "lua"):
        return "brackets"  # `{` is always a literal there
    return None


def _near_error(snapshot: DocumentSnapshot, b: int) -> bool:
    """Whether the tree around the cursor is error recovery, so its shape cannot be trusted."""
    root = snapshot.tree.root_node  # type: ignore[union-attr]
    if not root.has_error:
        return False
    node = root.descendant_for_byte_range(max(b - 1, 0), b)
    return node is not None and (node.has_error or any(a.is_error or a.is_missing for a in ancestors(node)))


def _line_has_error(snapshot: DocumentSnapshot, start: int, end: int) -> bool:
    """Whether an ERROR or MISSING node lies on the line `[start, end]` (an unterminated string...)."""
    root = snapshot.tree.root_node  # type: ignore[union-attr]
    if not root.has_error:
        return False
    lo, hi = snapshot.to_byte(start), snapshot.to_byte(end)
    stack = [root.descendant_for_byte_range(lo, hi) or root]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if node.is_error or node.is_missing:
            return True
        stack.extend(c for c in node.children if c.has_error or c.is_missing)
    return False


def _function_owning(snapshot: DocumentSnapshot, b: int) -> tree_sitter.Node | None:
    """The function whose (empty or docstring-only) body the position just after byte `b` starts."""
    node = snapshot.tree.root_node.descendant_for_byte_range(b, b)  # type: ignore[union-attr]
    for anc in ancestors(node):
        if anc.type in FUNCTION_TYPES:
            body = body_of(anc)
            return anc if body is None or not statements(body) else None
        if anc.type in DEFINITION_TYPES:
            return None
    return None


def classify(snapshot: DocumentSnapshot, offset: int, end: int, *, comments: bool = False) -> SpanKind:
    """The span kind at `offset` (or of the replaced range `[offset, end)`)."""
    text = snapshot.text
    if end > offset:
        selected = text[offset:end]
        if is_placeholder_text(selected):
            return kind("placeholder")
        return kind("selection", single_line="\n" not in selected.strip("\n"), stop="dedent")
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line_end = len(text) if line_end < 0 else line_end
    before, after = text[line_start:offset], text[offset:line_end]
    inline = bool(before.strip())
    tree = snapshot.tree
    b = snapshot.to_byte(offset) if tree is not None else offset

    if tree is not None:
        found = _string_or_comment(snapshot, b, comments)
        if found is not None:
            return found
        container = _container(snapshot, b)
    else:
        container = None
    untrusted = tree is None or _near_error(snapshot, b) or _line_has_error(snapshot, line_start, line_end)
    if untrusted:
        quote, braces = open_string(before, snapshot.language)
        if braces and quote not in after:
            # code between an f-string's or template's braces, the string not closed on the line: the
            # candidate closes the braces, then the string, and finishes the line
            return _typed_string(quote)
        quote = "" if braces else quote
        if len(quote) == 3:
            prev = text[:line_start].rstrip()
            docstring = snapshot.language == "python" and (prev.endswith(":") or not prev)
            return kind("docstring" if docstring else "string", quote=quote, single_line=False, max_tokens=48)
        if quote and quote in after:
            return kind("string", quote=quote)
        if quote:
            return _typed_string(quote)
    if container is None and untrusted:
        container = _container_from_text(text, offset, snapshot.language)
    if container is not None:
        if inline:
            return kind(container, single_line=True)
        # whole lines of a literal or an argument list: as long as lines at a blank line may be
        return kind(container, single_line=False, max_tokens=SPAN_KINDS["empty_line"].max_tokens)

    if after.strip():
        # nothing but indentation before the cursor: what fits here is whole lines above that code
        return kind("line_rest" if inline else "line_above")
    if inline:
        code = before.rstrip()
        if _BLOCK_OPENER.search(code):
            if tree is not None and _function_owning(snapshot, snapshot.to_byte(line_start + len(code) - 1)):
                return kind("function_body")
            return kind("block")
        return kind("line_rest")
    # blank line: an empty function body, or just a line in a block
    prev_end = line_start - 1
    while prev_end > 0 and text[prev_end - 1].isspace():
        prev_end -= 1
    if tree is not None and prev_end > 0:
        last = snapshot.to_byte(prev_end - 1)
        if _function_owning(snapshot, last) or _blank_in_empty_body(snapshot, b):
            return kind("function_body")
    return kind("empty_line")


def _blank_in_empty_body(snapshot: DocumentSnapshot, b: int) -> bool:
    node = snapshot.tree.root_node.descendant_for_byte_range(b, b)  # type: ignore[union-attr]
    for anc in ancestors(node):
        if not anc.start_byte < b < anc.end_byte:
            continue
        if anc.type in FUNCTION_TYPES:
            return body_of(anc) is None  # Lua: an empty function has no body node at all
        parent = anc.parent
        if parent is not None and parent.type in FUNCTION_TYPES:
            body = body_of(parent)
            return body is not None and body.id == anc.id and not statements(anc)
        if anc.type.endswith(_CODE_SCOPES) or anc.type in DEFINITION_TYPES:
            return False
    return False
