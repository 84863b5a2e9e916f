"""A real LSP client (pygls's) driving a real `dg-lsp` process, for tests and benchmarks.

pygls's own `start_io` pipes the server's stderr without reading it, which deadlocks a chatty
server once the pipe fills; this harness sends stderr to a file instead and keeps it for failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.client import run_async
from pygls.lsp.client import LanguageClient


class HarnessClient(LanguageClient):
    def __init__(self) -> None:
        super().__init__("dg-lsp-tests", "0")
        self.messages: list[types.ShowMessageParams] = []
        self.progress: list[Any] = []
        self.applied_edits: list[types.ApplyWorkspaceEditParams] = []
        self.loaded = asyncio.Event()
        self.process: asyncio.subprocess.Process | None = None
        self.init_result: types.InitializeResult | None = None

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def show_message(params: types.ShowMessageParams) -> None:
            self.messages.append(params)

        @self.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def create_progress(params: types.WorkDoneProgressCreateParams) -> None:
            return None

        @self.feature(types.PROGRESS)
        def progress(params: types.ProgressParams) -> None:
            self.progress.append(params.value)
            kind = (
                params.value.get("kind")
                if isinstance(params.value, dict)
                else getattr(params.value, "kind", None)
            )
            if kind == "end":
                self.loaded.set()

        @self.feature(types.WORKSPACE_APPLY_EDIT)
        def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
            self.applied_edits.append(params)
            return types.ApplyWorkspaceEditResult(applied=True)

    async def start_logged(self, args: list[str], stderr_path: Path) -> None:
        stderr = open(stderr_path, "wb")
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "dg_lsp",
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
        stderr.close()
        self.protocol.set_writer(self.process.stdin)
        task = asyncio.create_task(
            run_async(
                stop_event=self._stop_event,
                reader=self.process.stdout,
                protocol=self.protocol,
                logger=logging.getLogger("lsp-harness"),
                error_handler=self.report_server_error,
            )
        )
        self._async_tasks.append(task)


CLIENT_CAPABILITIES = types.ClientCapabilities(
    window=types.WindowClientCapabilities(work_done_progress=True),
    text_document=types.TextDocumentClientCapabilities(
        code_action=types.CodeActionClientCapabilities(
            resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"])
        ),
    ),
    workspace=types.WorkspaceClientCapabilities(apply_edit=True),
)


@contextlib.asynccontextmanager
async def lsp_session(
    tmp_path: Path,
    init_options: dict[str, Any] | None = None,
    server_args: list[str] | None = None,
    capabilities: types.ClientCapabilities = CLIENT_CAPABILITIES,
) -> AsyncIterator[HarnessClient]:
    client = HarnessClient()
    log = tmp_path / "server.log"
    await client.start_logged(server_args or [], log)
    try:
        client.init_result = await asyncio.wait_for(
            client.initialize_async(
                types.InitializeParams(
                    capabilities=capabilities,
                    initialization_options=init_options or {},
                    process_id=None,
                )
            ),
            30,
        )
        client.initialized(types.InitializedParams())
        yield client
        assert await shutdown_and_exit(client, 30) == 0
    except BaseException:
        sys.stderr.write(f"--- server log {log} ---\n{log.read_text(errors='replace')[-8000:]}\n")
        raise
    finally:
        await reap(client)


async def shutdown_and_exit(client: HarnessClient, timeout: float = 60) -> int:
    """The LSP goodbye: `shutdown`, `exit`, then the server's exit code."""
    await asyncio.wait_for(client.shutdown_async(None), timeout)
    client.exit(None)
    return await asyncio.wait_for(client.process.wait(), 30)


async def reap(client: HarnessClient) -> None:
    """Whatever happened, leave no server process behind and close the client."""
    if client.process and client.process.returncode is None:
        client.process.kill()
        await client.process.wait()
    await client.stop()


def open_doc(client: LanguageClient, uri: str, text: str, language: str = "python", version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        )
    )


async def wait_loaded(client: HarnessClient, timeout: float = 120) -> None:
    await asyncio.wait_for(client.loaded.wait(), timeout)
