"""Ask a running server what it believes a document contains, through ordinary code actions.

"Fill in here" carries the server's offset for a position, and "Fill placeholder" on a `# TODO ...`
line carries that line's text: together they reveal the server's view of the text without any
debug-only request.
"""

from __future__ import annotations

from tests.reliability.rawlsp import RawServer, code_action_params


def actions(server: RawServer, uri: str, start: tuple[int, int], end: tuple[int, int] | None = None) -> list:
    reply = server.request(
        "textDocument/codeAction", code_action_params(uri, start, end or start), timeout=60
    )
    assert "result" in reply, reply
    return reply["result"] or []


def offset_of(server: RawServer, uri: str, line: int, character: int) -> int:
    """The code-point offset the server maps (line, character) to."""
    for action in actions(server, uri, (line, character)):
        if action["title"].startswith("Fill in here"):
            return action["data"]["start"]
    raise AssertionError(f"no 'Fill in here' action at {line}:{character} in {uri}")


def todo_line(server: RawServer, uri: str, line: int) -> str | None:
    """The text of a `# TODO ...` comment on `line`, as the server holds it (first 40 characters)."""
    for action in actions(server, uri, (line, 0)):
        if action["title"].startswith("Fill placeholder (dg-lsp): "):
            return action["title"].removeprefix("Fill placeholder (dg-lsp): ")
    return None


def utf16_position(text: str, offset: int) -> tuple[int, int]:
    """LSP (line, UTF-16 character) of a code-point offset in `text` (lines end at \\n)."""
    line = text.count("\n", 0, offset)
    start = text.rfind("\n", 0, offset) + 1
    return line, len(text[start:offset].encode("utf-16-le")) // 2
