"""The real `dg-lsp` process over stdio, driven by pygls's LSP client, with a real tiny model."""

from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from tests.lsp_harness import lsp_session, open_doc, wait_loaded

URI = "file:///tmp/example.py"
SOURCE = (
    "import os\n\n\ndef add(a, b):\n    return \n\n\ndef main():\n    total = add(1, 2)\n    print(total)\n"
)


def _opts(model_dir, **extra):
    return {
        "dgLsp": {"model": str(model_dir), "debounceMs": 0, "maxTokens": 16, "denoisingSteps": 4, **extra}
    }


def _inline(
    line: int, character: int, uri: str = URI, automatic: bool = False
) -> types.InlineCompletionParams:
    kind = (
        types.InlineCompletionTriggerKind.Automatic
        if automatic
        else types.InlineCompletionTriggerKind.Invoked
    )
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
        context=types.InlineCompletionContext(trigger_kind=kind),
    )


def _change(client, version: int, line: int, character: int, text: str, uri: str = URI) -> None:
    pos = types.Position(line=line, character=character)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(range=types.Range(start=pos, end=pos), text=text)
            ],
        )
    )


def _apply(text: str, edit: types.TextEdit) -> str:
    lines = text.splitlines(keepends=True)

    def off(p: types.Position) -> int:
        return sum(len(x) for x in lines[: p.line]) + p.character

    return text[: off(edit.range.start)] + edit.new_text + text[off(edit.range.end) :]


def test_initialize_advertises_features(tmp_path, tiny_model_dir):
    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir)) as client:
            caps = client.init_result.capabilities
            assert caps.inline_completion_provider
            assert caps.completion_provider is not None
            assert caps.code_action_provider.resolve_provider is True
            assert caps.text_document_sync.change == types.TextDocumentSyncKind.Incremental
            assert "dg-lsp.applyAction" in caps.execute_command_provider.commands
            await wait_loaded(client)
            kinds = [p["kind"] if isinstance(p, dict) else p.kind for p in client.progress]
            assert kinds[0] == "begin" and kinds[-1] == "end"

    asyncio.run(scenario())


def test_inline_completion_change_and_cancel(tmp_path, tiny_model_dir):
    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir)) as client:
            open_doc(client, URI, SOURCE)
            await wait_loaded(client)
            result = await asyncio.wait_for(client.text_document_inline_completion_async(_inline(4, 11)), 60)
            assert isinstance(result, types.InlineCompletionList)
            for item in result.items:
                assert item.range.start == types.Position(line=4, character=11)
                assert item.insert_text.strip()

            # Type a character: the document changes, and a request for the new text still answers.
            _change(client, 2, 4, 11, "a")
            result = await asyncio.wait_for(client.text_document_inline_completion_async(_inline(4, 12)), 60)
            assert isinstance(result, types.InlineCompletionList)

            # Cancel a request while it is in flight: the server answers RequestCancelled or empty.
            request = client.text_document_inline_completion_async(_inline(4, 12))
            task = asyncio.ensure_future(request)
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # ...and keeps serving afterwards.
            result = await asyncio.wait_for(client.text_document_inline_completion_async(_inline(4, 12)), 60)
            assert isinstance(result, types.InlineCompletionList)

    asyncio.run(scenario())


def test_stale_request_is_answered_empty_at_once(tmp_path, tiny_model_dir):
    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir, debounceMs=400)) as client:
            open_doc(client, URI, SOURCE)
            await wait_loaded(client)
            task = asyncio.ensure_future(
                client.text_document_inline_completion_async(_inline(4, 11, automatic=True))
            )
            await asyncio.sleep(0.05)
            _change(client, 2, 4, 11, "x")  # the user typed during the debounce window
            result = await asyncio.wait_for(task, 10)
            assert len(result.items) == 0

    asyncio.run(scenario())


def test_requests_while_loading_return_empty(tmp_path, tiny_model_dir):
    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir)) as client:
            open_doc(client, URI, SOURCE)
            # Ask immediately after `initialized`, before the load can have finished.
            result = await asyncio.wait_for(client.text_document_inline_completion_async(_inline(4, 11)), 10)
            if not client.loaded.is_set():
                assert len(result.items) == 0
            await wait_loaded(client)

    asyncio.run(scenario())


def test_completion_fallback_inserts_at_cursor(tmp_path, tiny_model_dir):
    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir)) as client:
            open_doc(client, URI, SOURCE)
            await wait_loaded(client)
            result = await asyncio.wait_for(
                client.text_document_completion_async(
                    types.CompletionParams(
                        text_document=types.TextDocumentIdentifier(uri=URI),
                        position=types.Position(line=4, character=11),
                    )
                ),
                60,
            )
            assert isinstance(result, types.CompletionList)
            assert result.is_incomplete is True
            for item in result.items:
                assert item.text_edit.range.start == types.Position(line=4, character=11)
                assert item.text_edit.range.end == types.Position(line=4, character=11)

    asyncio.run(scenario())


def test_code_actions_resolve_and_execute_apply_edit(tmp_path, tiny_model_dir):
    text = "def area(r):\n    ...\n\n\ndef f(:\n    return 1\n"

    async def scenario():
        async with lsp_session(tmp_path, _opts(tiny_model_dir)) as client:
            open_doc(client, URI, text)
            await wait_loaded(client)
            actions = await client.text_document_code_action_async(
                types.CodeActionParams(
                    text_document=types.TextDocumentIdentifier(uri=URI),
                    range=types.Range(
                        start=types.Position(line=1, character=4), end=types.Position(line=1, character=4)
                    ),
                    context=types.CodeActionContext(diagnostics=[]),
                )
            )
            titles = [a.title for a in actions]
            assert any(t.startswith("Fill in here") for t in titles)
            assert any(t.startswith("Fill placeholder") for t in titles), titles
            placeholder = next(a for a in actions if a.title.startswith("Fill placeholder"))

            resolved = await asyncio.wait_for(client.code_action_resolve_async(placeholder), 60)
            if resolved.edit is not None:
                (doc_edit,) = resolved.edit.document_changes
                (edit,) = doc_edit.edits
                assert edit.range.start == types.Position(line=1, character=4)
                assert edit.range.end == types.Position(line=1, character=7)

            errors = await client.text_document_code_action_async(
                types.CodeActionParams(
                    text_document=types.TextDocumentIdentifier(uri=URI),
                    range=types.Range(
                        start=types.Position(line=4, character=0), end=types.Position(line=4, character=0)
                    ),
                    context=types.CodeActionContext(diagnostics=[]),
                )
            )
            repair = [a for a in errors if a.title.startswith("Repair syntax error")]
            assert repair, [a.title for a in errors]

            # executeCommand → the server sends workspace/applyEdit back to us.
            fill = next(a for a in actions if a.title.startswith("Fill in here"))
            reply = await asyncio.wait_for(
                client.workspace_execute_command_async(
                    types.ExecuteCommandParams(command="dg-lsp.applyAction", arguments=[fill.data])
                ),
                60,
            )
            if reply["applied"]:
                (params,) = client.applied_edits
                (doc_edit,) = params.edit.document_changes
                assert doc_edit.text_document.uri == URI
                new_text = _apply(text, doc_edit.edits[0])
                assert new_text.startswith("def area(r):\n    ")
            else:
                assert "reason" in reply

            # A stale action (document changed since it was offered) applies nothing.
            _change(client, 2, 0, 0, "# edited\n")
            await asyncio.sleep(0.1)
            stale = await client.workspace_execute_command_async(
                types.ExecuteCommandParams(command="dg-lsp.applyAction", arguments=[fill.data])
            )
            assert stale["applied"] is False

    asyncio.run(scenario())


def test_missing_model_is_reported_once_and_server_keeps_serving(tmp_path):
    async def scenario():
        async with lsp_session(
            tmp_path, {"model": str(tmp_path / "no-such-model"), "debounceMs": 0}
        ) as client:
            open_doc(client, URI, SOURCE)
            await wait_loaded(client)
            for _ in range(3):
                result = await client.text_document_inline_completion_async(_inline(4, 11))
                assert len(result.items) == 0
            errors = [m for m in client.messages if m.type == types.MessageType.Error]
            assert len(errors) == 1, [m.message for m in client.messages]
            assert "no-such-model" in errors[0].message

    asyncio.run(scenario())


def test_unknown_language_and_bad_settings_do_not_break_the_server(tmp_path, tiny_model_dir):
    async def scenario():
        opts = _opts(tiny_model_dir, maxTokens="many")
        async with lsp_session(tmp_path, opts) as client:
            uri = "file:///tmp/notes.weird"
            open_doc(client, uri, "some text here\nmore ", language="weird-lang")
            await wait_loaded(client)
            result = await asyncio.wait_for(
                client.text_document_inline_completion_async(_inline(1, 5, uri=uri)), 60
            )
            assert isinstance(result, types.InlineCompletionList)
            assert any("maxTokens" in m.message or "max_tokens" in m.message for m in client.messages)
            # Positions past the end are clamped, not fatal.
            result = await asyncio.wait_for(client.text_document_inline_completion_async(_inline(99, 99)), 60)
            assert isinstance(result, types.InlineCompletionList)

    asyncio.run(scenario())
