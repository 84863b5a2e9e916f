"""Map editor language ids and file names onto the tree-sitter grammars we ship with.

Grammars come from the per-language wheels (`tree-sitter-python`, ...), never from a downloader, so
the server works offline. Parsers are thread-local because a `tree_sitter.Parser` is not safe to share
between the server thread (incremental edits) and the worker thread (syntax checks).
"""

from __future__ import annotations

import functools
import importlib
import os
import threading

import tree_sitter

# grammar name -> (module, factory function)
_GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "java": ("tree_sitter_java", "language"),
    "lua": ("tree_sitter_lua", "language"),
    "bash": ("tree_sitter_bash", "language"),
}

SUPPORTED: frozenset[str] = frozenset(_GRAMMARS)

_LANGUAGE_IDS: dict[str, str] = {
    "python": "python",
    "javascript": "javascript",
    "javascriptreact": "javascript",  # the JavaScript grammar parses JSX
    "jsx": "javascript",
    "typescript": "typescript",
    "typescriptreact": "tsx",
    "tsx": "tsx",
    "go": "go",
    "rust": "rust",
    "c": "c",
    "cpp": "cpp",
    "c++": "cpp",
    "cuda-cpp": "cpp",
    "java": "java",
    "lua": "lua",
    "shellscript": "bash",
    "bash": "bash",
    "sh": "bash",
    "zsh": "bash",
}

_EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".pyw": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".cxx": "cpp",
    ".c++": "cpp",
    ".hpp": "cpp",
    ".hh": "cpp",
    ".hxx": "cpp",
    ".cu": "cpp",
    ".ipp": "cpp",
    ".inl": "cpp",
    ".java": "java",
    ".lua": "lua",
    ".sh": "bash",
    ".bash": "bash",
    ".zsh": "bash",
}

# How each grammar marks comments; used to render a marker when we need to write one.
LINE_COMMENT: dict[str | None, str] = {
    "python": "#",
    "bash": "#",
    "lua": "--",
    "javascript": "//",
    "typescript": "//",
    "tsx": "//",
    "go": "//",
    "rust": "//",
    "c": "//",
    "cpp": "//",
    "java": "//",
}

# Languages whose blocks are delimited by indentation rather than brackets.
INDENT_BLOCKS: frozenset[str] = frozenset({"python"})


def language_for(language_id: str | None, uri: str | None = None) -> str | None:
    """Our grammar name for an LSP languageId, else for the file extension of `uri`; None = plain text."""
    if language_id:
        name = _LANGUAGE_IDS.get(language_id.lower())
        if name:
            return name
    if uri:
        path = uri.split("?", 1)[0].split("#", 1)[0]
        base = os.path.basename(path)
        _, ext = os.path.splitext(base)
        if ext.lower() in _EXTENSIONS:
            return _EXTENSIONS[ext.lower()]
        if base in {".bashrc", ".bash_profile", ".profile", ".zshrc"}:
            return "bash"
    return None


@functools.cache
def grammar(name: str) -> tree_sitter.Language:
    module_name, factory = _GRAMMARS[name]
    module = importlib.import_module(module_name)
    return tree_sitter.Language(getattr(module, factory)())


_local = threading.local()


def parser(name: str) -> tree_sitter.Parser:
    """A parser for `name` owned by the calling thread."""
    cache: dict[str, tree_sitter.Parser] | None = getattr(_local, "parsers", None)
    if cache is None:
        cache = _local.parsers = {}
    found = cache.get(name)
    if found is None:
        found = cache[name] = tree_sitter.Parser(grammar(name))
    return found
