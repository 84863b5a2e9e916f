"""The pygls language server: protocol only.

Handlers translate LSP positions to text offsets, ask the worker for a `pipeline.complete` run and
translate the answer back. Everything slow runs on the model worker; everything here is cheap, so
the event loop keeps answering (cancels, document changes, stale requests) while the model works.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import uuid
from collections import OrderedDict
from typing import Any

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInternalError
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from dg_lsp import __version__, pipeline
from dg_lsp.engine.loader import ModelLoadError, error_text, load_engine
from dg_lsp.engine.types import Cancelled
from dg_lsp.server import actions, transport
from dg_lsp.server.documents import DocumentStore
from dg_lsp.server.worker import LoadSuperseded, ModelWorker, NotReady
from dg_lsp.settings import LocalPolicy, Settings

log = logging.getLogger(__name__)

APPLY_ACTION_COMMAND = "dg-lsp.applyAction"
CLIENT_POLL_S = 2.0
MAX_TOLD = 1024


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not count: its parent just has not reaped it yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class DgProtocol(LanguageServerProtocol):
    """pygls's protocol minus its text store: `DocumentStore` is the one copy of each document.

    pygls's own didChange raises on documents that were never opened, mis-clamps positions past the
    end of the last line, and would keep a second (stale) copy of every 10 MB file.
    """

    def _user(self, method: str, params: Any):
        if (handler := self.fm.features.get(method)) is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_CLOSE, params)

    def _send_response(self, msg_id: Any, result: Any = None, error: Any = None) -> None:
        """pygls puts a handler's traceback (file paths, source lines) and exception text into
        internal-error responses; they stay in the log."""
        if error is not None and error.code == transport.INTERNAL_ERROR:
            # pygls's message is the exception's own text, which can name files; the type name is enough.
            log.warning("internal error answered to the client: %s", error.message)
            kind = str(error.message).split(":", 1)[0].strip()[:60] or "error"
            error = types.ResponseError(
                code=error.code, message=f"Internal error ({kind}); see the server log"
            )
        elif error is not None and getattr(error, "data", None) is not None:
            log.debug("error data kept from the client: %s", error.data)
            error = types.ResponseError(code=error.code, message=error.message)
        super()._send_response(msg_id, result, error)


class DgLanguageServer(LanguageServer):
    def __init__(self, settings: Settings | None = None, policy: LocalPolicy | None = None) -> None:
        super().__init__("dg-lsp", __version__, protocol_cls=DgProtocol)
        self.settings = settings or Settings()
        self.policy = policy if policy is not None else LocalPolicy.load()
        self.docs = DocumentStore()
        self.worker = ModelWorker()
        self._told: OrderedDict[str, None] = OrderedDict()
        self._loaded_settings: Settings | None = None
        self._load_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self.session_started = False
        """Set by `initialize`: from then on the process serves that client (TCP stops waiting for one)."""

    # -- user messages ---------------------------------------------------------------------------

    def tell_once(self, key: str, message: str, kind: types.MessageType = types.MessageType.Error) -> None:
        """Show a message at most once per key: a broken model must not spam every keystroke."""
        log.log(logging.ERROR if kind == types.MessageType.Error else logging.WARNING, "%s", message)
        if key in self._told:
            self._told.move_to_end(key)
            return
        self._told[key] = None
        if len(self._told) > MAX_TOLD:  # a client sending ever new bad values must not grow this set
            self._told.popitem(last=False)
        try:
            self.window_show_message(types.ShowMessageParams(type=kind, message=f"dg-lsp: {message}"))
        except Exception:  # no client connected (tests, shutdown): the log line above is enough
            log.debug("could not send showMessage", exc_info=True)

    def report_server_error(self, error: Exception, source: Any) -> None:
        if isinstance(error, JsonRpcException) and not isinstance(error, JsonRpcInternalError):
            # The client sent something invalid and got a JSON-RPC error for it: not the user's concern.
            log.warning("protocol error (%s): %s", getattr(source, "__name__", source), error)
            return
        log.error("internal error (%s): %s", getattr(source, "__name__", source), error)
        name = type(error).__name__
        self.tell_once(f"internal:{name}", f"internal error ({name}), see the server log")

    # -- transports ------------------------------------------------------------------------------

    def start_io(self, stdin: Any = None, stdout: Any = None) -> int:  # type: ignore[override]
        """Serve over stdio until `exit` or end of input; return the process exit code."""
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        source = transport.StdioSource(stdin or sys.stdin.buffer)
        code = 0
        try:
            outcome = asyncio.run(transport.read_frames(source, self.protocol, self._stop_event))
            if outcome == transport.REJECTED:
                code = 1
            else:
                log.info("end of input: the client closed the connection")
        except SystemExit as exc:
            code = transport.exit_code(exc)
        except BrokenPipeError:
            log.error("connection to the client is lost; shutting down")
        except KeyboardInterrupt:
            code = 130
        finally:
            self._close()
        return code

    def start_tcp(self, host: str, port: int) -> int:  # type: ignore[override]
        """Serve one client at a time over TCP until the client that initialized leaves or sends `exit`.

        Until a client has initialized, a connection that closes, stays silent or speaks something other
        than LSP (a port probe, a browser's HTTP request) is dropped and the server keeps listening: the
        editor may still be on its way.
        """
        self._stop_event = stop = threading.Event()
        result = {"code": 0}

        async def serve() -> None:
            finished = asyncio.Event()
            busy = asyncio.Lock()

            async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                peer = writer.get_extra_info("peername")
                if not await self._claim(busy):  # a second client would hijack the first one's session
                    log.warning("refusing a second connection from %s", peer)
                    writer.close()
                    return
                try:
                    self.protocol.set_writer(writer)  # type: ignore[arg-type]
                    timeout = None if self.session_started else transport.FIRST_FRAME_TIMEOUT_S
                    source = transport.StreamSource(reader)
                    try:
                        outcome = await transport.read_frames(source, self.protocol, stop, timeout)
                    except SystemExit as exc:
                        result["code"] = transport.exit_code(exc)
                        finished.set()
                        return
                    if self.session_started:
                        finished.set()
                        return
                    log.info("connection from %s ended before initialize (%s); listening on", peer, outcome)
                    writer.close()
                finally:
                    busy.release()

            self._server = server = await asyncio.start_server(
                connection, host, port, limit=2 * transport.MAX_HEADER_LINE
            )
            log.info("serving on %s", ", ".join(str(s.getsockname()) for s in server.sockets))
            async with server:
                await finished.wait()

        try:
            asyncio.run(serve())
        except OSError as exc:  # port taken, address not available: say so instead of a traceback
            print(f"dg-lsp: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
            result["code"] = 1
        except KeyboardInterrupt:
            result["code"] = 130
        finally:
            self._server = None
            self._close()
        return result["code"]

    async def _claim(self, busy: asyncio.Lock) -> bool:
        """Take the one client slot. While no client has initialized, wait for it: the connection
        holding it may be a port probe that is about to close (a silent one times out)."""
        if not self.session_started:
            try:
                await asyncio.wait_for(busy.acquire(), transport.FIRST_FRAME_TIMEOUT_S + 5)
            except TimeoutError:
                return False
            if not self.session_started:
                return True
            busy.release()
            return False
        if busy.locked():
            return False
        await busy.acquire()
        return True

    def watch_client(self, pid: int | None) -> None:
        """Exit when the editor process dies, even if something else keeps our stdin open (LSP spec)."""
        if not pid or pid == os.getpid() or not process_alive(pid):
            return

        async def watch() -> None:
            while process_alive(pid):
                await asyncio.sleep(CLIENT_POLL_S)
            log.error("client process %d is gone; exiting", pid)
            self._close()
            logging.shutdown()
            os._exit(1)

        self._watch_task = asyncio.get_running_loop().create_task(watch())

    def _close(self) -> None:
        w = self.worker
        log.info(
            "model worker: %d completed, %d cancelled, %d failed, peak queue %d",
            w.completed,
            w.cancelled,
            w.failed,
            w.peak_pending,
        )
        w.stop(timeout=2.0)
        if self._stop_event is not None:
            self._stop_event.set()
        if self._thread_pool:
            self._thread_pool.shutdown(wait=False, cancel_futures=True)

    # -- settings and model loading --------------------------------------------------------------

    def apply_settings(self, data: Any) -> None:
        if data is None:
            return
        if not isinstance(data, dict):
            self.tell_once("settings-type", f"ignoring settings that are not an object: {str(data)[:80]}")
            return
        self.settings, errors = Settings.merge(data, self.settings)
        for error in errors:
            self.tell_once(f"settings:{error}", f"{error} (ignored)", types.MessageType.Warning)

    def start_loading(self) -> None:
        self._loaded_settings = self.settings
        settings, note, refusal = self.policy.apply(self.settings)
        if note:
            self.tell_once(f"policy:{note}", note, types.MessageType.Warning)
        loop = asyncio.get_running_loop()
        token = f"dg-lsp-load-{uuid.uuid4().hex[:8]}"
        progress = self._progress_supported()

        def finish(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(self._load_finished, token, progress, settings, error)

        async def begin_then_load() -> None:
            # `begin` must reach the client before the worker can possibly send `end`.
            if progress:
                try:
                    await self.work_done_progress.create_async(token)
                    self.work_done_progress.begin(
                        token,
                        types.WorkDoneProgressBegin(
                            title="dg-lsp: loading model", message=settings.model, cancellable=False
                        ),
                    )
                except Exception:
                    log.debug("client refused progress token", exc_info=True)
            self.worker.load(lambda: _load(settings, refusal), finish)

        self._load_task = loop.create_task(begin_then_load())

    def _load_finished(
        self, token: str, progress: bool, settings: Settings, error: BaseException | None
    ) -> None:
        if isinstance(error, LoadSuperseded):
            message = "superseded by a newer model"
        else:
            message = "ready" if error is None else f"failed: {error_text(error)}"
        if progress:
            try:
                self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
            except Exception:
                log.debug("progress end failed", exc_info=True)
        if error is not None and not isinstance(error, LoadSuperseded):
            text = error_text(error)
            self.tell_once(
                f"load:{settings.model}:{text}", f"could not load model {settings.model!r}: {text}"
            )
        else:
            engine = self.worker.engine
            log.info("model ready: %s", engine.describe() if engine else "?")

    def _progress_supported(self) -> bool:
        caps = self.client_capabilities
        return bool(caps and caps.window and caps.window.work_done_progress)

    # -- the shared request path -----------------------------------------------------------------

    async def infill(
        self,
        uri: str,
        start: int,
        end: int | None,
        version: int,
        key: str,
        debounce: bool,
        invoked: bool | None = None,
    ) -> pipeline.Completion | None:
        """Run the pipeline on the worker; None means 'answer empty' (stale, superseded, not ready).
        `invoked` (default: not debounced): the user asked and waits, so the budget does not cut steps."""
        invoked = not debounce if invoked is None else invoked
        if debounce and self.settings.debounce_ms:
            await asyncio.sleep(self.settings.debounce_ms / 1000)
            if self.docs.version(uri) != version:
                return None
        snapshot = self.docs.snapshot(uri)
        if snapshot is None:
            return None
        settings = self.settings
        try:
            job = self.worker.submit(
                key,
                lambda engine, should_cancel: pipeline.complete(
                    engine, snapshot, start, settings, end, should_cancel, doc_key=uri, invoked=invoked
                ),
            )
        except NotReady as exc:
            log.debug("answering empty: %s", exc)  # a load failure was already shown once
            return None
        try:
            result = await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.cancel()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the client cancelled: pygls answers RequestCancelled
            return None  # superseded by a newer request for the same document
        except Cancelled:
            return None
        except NotReady:
            return None
        except Exception as exc:
            if _out_of_memory(exc):
                self.tell_once(
                    "infer:oom",
                    f"out of memory during a completion ({type(exc).__name__}); lower numCandidates or "
                    f"maxTokens, or use a smaller model. Detail: {str(exc)[:300]}",
                )
            else:
                self.tell_once(
                    f"infer:{type(exc).__name__}", f"completion failed: {type(exc).__name__}: {exc}"
                )
            return None
        if self.docs.version(uri) != version:
            return None
        log.info(
            "%s v%d %s span=%s %s",
            key,
            version,
            "ok" if result.texts else f"empty ({result.skipped})",
            result.span_kind,
            result.stats.as_dict(),
        )
        return result


def _load(settings: Settings, refusal: str | None):
    if refusal:
        raise ModelLoadError(refusal)
    return load_engine(settings)


def create_server(settings: Settings | None = None, policy: LocalPolicy | None = None) -> DgLanguageServer:
    ls = DgLanguageServer(settings, policy)

    @ls.feature(types.INITIALIZE)
    def initialize(ls: DgLanguageServer, params: types.InitializeParams) -> None:
        encoding = ls.workspace.position_encoding
        ls.docs.encoding = str(getattr(encoding, "value", encoding) or "utf-16")
        ls.session_started = True
        for problem in ls.policy.problems:
            ls.tell_once(f"config:{problem}", f"config file ignored: {problem}", types.MessageType.Warning)
        ls.apply_settings(params.initialization_options)
        ls.watch_client(params.process_id)

    @ls.feature(types.INITIALIZED)
    def initialized(ls: DgLanguageServer, params: types.InitializedParams) -> None:
        ls.start_loading()

    @ls.feature(types.SHUTDOWN)
    def shutdown(ls: DgLanguageServer, params: Any) -> None:
        ls.worker.stop(timeout=0.5)  # answer promptly: a load in progress cannot be interrupted anyway

    @ls.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def did_change_configuration(ls: DgLanguageServer, params: types.DidChangeConfigurationParams) -> None:
        ls.apply_settings(params.settings)
        if ls._loaded_settings is not None and ls.settings.needs_reload(ls._loaded_settings):
            ls.start_loading()

    # -- text synchronisation --------------------------------------------------------------------

    @ls.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: DgLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        doc = params.text_document
        ls.docs.open(doc.uri, doc.language_id, doc.version, doc.text)

    @ls.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: DgLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        if not ls.docs.apply_changes(uri, params.text_document.version, params.content_changes):
            log.warning("didChange for a document that is not open: %s", uri)
            return
        ls.worker.cancel_key(uri)  # whatever it was computing is for text that no longer exists

    @ls.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: DgLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.worker.cancel_key(params.text_document.uri)
        ls.worker.forget(params.text_document.uri)
        ls.docs.close(params.text_document.uri)

    # -- completions -----------------------------------------------------------------------------

    def _offset(uri: str, position: types.Position) -> int | None:
        doc = ls.docs.get(uri)
        if doc is None:
            return None
        return doc.offset_at(position)

    def _enabled(uri: str) -> bool:
        doc = ls.docs.get(uri)
        return doc is not None and ls.settings.language_enabled(doc.language_id)

    @ls.feature(
        types.TEXT_DOCUMENT_INLINE_COMPLETION,
        types.InlineCompletionOptions(),
    )
    async def inline_completion(
        ls: DgLanguageServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        uri = params.text_document.uri
        if not _enabled(uri):
            return types.InlineCompletionList(items=[])
        offset = _offset(uri, params.position)
        if offset is None:
            return types.InlineCompletionList(items=[])
        version = ls.docs.version(uri)
        automatic = params.context.trigger_kind == types.InlineCompletionTriggerKind.Automatic
        result = await ls.infill(uri, offset, None, version, uri, debounce=automatic)
        if result is None or not result.texts:
            return types.InlineCompletionList(items=[])
        cursor = types.Range(start=params.position, end=params.position)
        return types.InlineCompletionList(
            items=[types.InlineCompletionItem(insert_text=text, range=cursor) for text in result.texts]
        )

    @ls.feature(
        types.TEXT_DOCUMENT_COMPLETION,
        types.CompletionOptions(trigger_characters=[".", "(", "[", "{", ",", " ", "=", ":"]),
    )
    async def completion(ls: DgLanguageServer, params: types.CompletionParams) -> types.CompletionList:
        uri = params.text_document.uri
        empty = types.CompletionList(is_incomplete=True, items=[])
        if not _enabled(uri):
            return empty
        offset = _offset(uri, params.position)
        if offset is None:
            return empty
        version = ls.docs.version(uri)
        ctx = params.context
        invoked = ctx is None or ctx.trigger_kind == types.CompletionTriggerKind.Invoked
        result = await ls.infill(uri, offset, None, version, uri, debounce=False, invoked=invoked)
        if result is None or not result.texts:
            return empty
        cursor = types.Range(start=params.position, end=params.position)
        items = []
        for rank, text in enumerate(result.texts):
            label = text.strip().splitlines()[0] if text.strip() else text
            items.append(
                types.CompletionItem(
                    label=label[:80] or "(whitespace)",
                    kind=types.CompletionItemKind.Snippet,
                    detail="dg-lsp infill",
                    documentation=types.MarkupContent(
                        kind=types.MarkupKind.Markdown, value=f"```\n{text}\n```"
                    ),
                    insert_text_format=types.InsertTextFormat.PlainText,
                    text_edit=types.TextEdit(range=cursor, new_text=text),
                    filter_text="",
                    sort_text=f"{rank:04d}",
                    preselect=rank == 0,
                )
            )
        return types.CompletionList(is_incomplete=True, items=items)

    # -- code actions ----------------------------------------------------------------------------

    @ls.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(
            code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite],
            resolve_provider=True,
        ),
    )
    def code_action(ls: DgLanguageServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        uri = params.text_document.uri
        doc = ls.docs.get(uri)
        if doc is None or not ls.settings.language_enabled(doc.language_id):
            return []
        start = doc.offset_at(params.range.start)
        end = doc.offset_at(params.range.end)
        snapshot = ls.docs.snapshot(uri)
        if snapshot is None:
            return []
        found = actions.available(snapshot, start, end)
        resolve = _client_resolves_edits(ls)
        out = []
        for spec in found:
            data = spec.to_data(uri, doc.version)
            action = types.CodeAction(title=spec.title, kind=spec.kind, data=data)
            if not resolve:
                action.command = types.Command(
                    title=spec.title, command=APPLY_ACTION_COMMAND, arguments=[data]
                )
            out.append(action)
        return out

    async def _action_edit(ls: DgLanguageServer, data: Any) -> types.WorkspaceEdit | None:
        spec = actions.ActionSpec.from_data(data)
        if spec is None:
            return None
        doc = ls.docs.get(spec.uri)
        if doc is None or doc.version != spec.version:
            return None  # stale: the document changed since the action was offered
        result = await ls.infill(spec.uri, spec.start, spec.end, spec.version, f"{spec.uri}#action", False)
        if result is None or not result.texts:
            return None
        new_text = actions.finish_text(spec, result.texts[0])
        edit_range = types.Range(start=doc.position_at(spec.start), end=doc.position_at(spec.end))
        return types.WorkspaceEdit(
            document_changes=[
                types.TextDocumentEdit(
                    text_document=types.OptionalVersionedTextDocumentIdentifier(
                        uri=spec.uri, version=spec.version
                    ),
                    edits=[types.TextEdit(range=edit_range, new_text=new_text)],
                )
            ]
        )

    @ls.feature(types.CODE_ACTION_RESOLVE)
    async def code_action_resolve(ls: DgLanguageServer, action: types.CodeAction) -> types.CodeAction:
        edit = await _action_edit(ls, action.data)
        if edit is not None:
            action.edit = edit
        return action

    @ls.command(APPLY_ACTION_COMMAND)
    async def apply_action(ls: DgLanguageServer, *args: Any) -> dict[str, Any]:
        data = args[0] if args else None
        if isinstance(data, list) and data:  # pygls may pass the arguments list as one value
            data = data[0]
        edit = await _action_edit(ls, data)
        if edit is None:
            return {"applied": False, "reason": "no infill (stale document, model not ready or no candidate)"}
        try:
            response = await ls.workspace_apply_edit_async(
                types.ApplyWorkspaceEditParams(edit=edit, label="dg-lsp")
            )
        except Exception as exc:  # the editor refused or failed the edit: a normal answer, not an error
            return {"applied": False, "reason": f"the editor did not apply the edit: {exc}"}
        reason = getattr(response, "failure_reason", None)
        applied = bool(response and response.applied)
        if applied:
            return {"applied": True}
        return {"applied": False, "reason": reason or "refused by the editor"}

    return ls


def _out_of_memory(exc: BaseException) -> bool:
    """Python's MemoryError, torch's OutOfMemoryError, or a CPU allocator failure (a RuntimeError)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _client_resolves_edits(ls: DgLanguageServer) -> bool:
    caps = ls.client_capabilities
    try:
        props = caps.text_document.code_action.resolve_support.properties  # type: ignore[union-attr]
    except AttributeError:
        return False
    return "edit" in (props or [])


__all__ = ["APPLY_ACTION_COMMAND", "DgLanguageServer", "create_server"]
