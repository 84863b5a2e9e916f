"""Content-Length framing and JSON-RPC envelope checks that survive any byte stream.

pygls's reader drops a malformed message without answering (the editor then waits forever for a
response), allocates whatever `Content-Length` claims, loses the next frame after a short length and
dies on deep nesting. This loop reads headers leniently (any case, LF or CRLF, resynchronising on
the next `Content-Length`), bounds every read, and answers each broken request with the JSON-RPC
error the spec prescribes (-32700 parse error, -32600 invalid request, -32602 invalid params) so the
editor is never left waiting and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import sys
import threading
from typing import Any, BinaryIO, Protocol

from pygls.exceptions import JsonRpcException, JsonRpcInternalError, JsonRpcInvalidParams

log = logging.getLogger(__name__)


class _DropDeserializeTracebacks(logging.Filter):
    """pygls logs a full traceback at ERROR for every malformed message: a log-flooding vector.

    `dispatch` logs one concise warning per such message instead.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to deserialize message")


logging.getLogger("pygls.protocol.json_rpc").addFilter(_DropDeserializeTracebacks())

MAX_HEADER_LINE = 8 * 1024
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""A 10 MB file JSON-escaped as \\uXXXX is 60 MB; anything past this is refused, not allocated."""
CHUNK = 1024 * 1024

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\d{1,15})[ \t]*\r?\n?$", re.IGNORECASE)


class Source(Protocol):
    """What the frame loop needs from a byte stream; both return b'' at end of stream."""

    async def readline(self, limit: int) -> bytes: ...

    async def read(self, n: int) -> bytes: ...


class StdioSource:
    """Blocking reads of a binary file on one private daemon thread.

    One long-lived thread, not one per read: under memory pressure (an address-space limit, an
    allocation storm) starting a thread can fail, and the protocol must keep reading regardless.
    Being a daemon, a read still blocked at exit never holds the interpreter up.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _serve(self) -> None:
        while True:
            loop, future, fn, args = self._calls.get()
            try:
                data = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(_set_exception, future, exc)
            else:
                loop.call_soon_threadsafe(_set_result, future, data)

    async def _call(self, fn, *args) -> bytes:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="dg-lsp-stdin", daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return await future

    async def readline(self, limit: int) -> bytes:
        return await self._call(self._stream.readline, limit)

    async def read(self, n: int) -> bytes:
        return await self._call(self._stream.read, n)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class StreamSource:
    """An asyncio StreamReader (TCP); an over-long line is discarded instead of killing the connection."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def readline(self, limit: int) -> bytes:
        try:
            return await self._reader.readline()
        except ValueError:  # over the stream limit: asyncio already dropped the buffered bytes
            return b"\x00" * (limit + 1)
        except ConnectionError:
            return b""

    async def read(self, n: int) -> bytes:
        try:
            return await self._reader.read(n)
        except ConnectionError:
            return b""


async def read_frames(source: Source, protocol: Any, stop: threading.Event | None = None) -> None:
    """Read frames until end of stream (or `stop`), handing each body to `dispatch`."""
    while stop is None or not stop.is_set():
        length: int | None = None
        while True:
            line = await source.readline(MAX_HEADER_LINE)
            if not line:
                return
            if not line.endswith(b"\n"):
                continue  # a piece of an over-long line (a body read as headers after a bad length)
            if not line.strip():
                if length is not None:
                    break
                continue  # stray blank line (e.g. the tail of a frame whose length was too short)
            # `search`, not `match`: after a too-short frame the leftover body shares a line with
            # the next header, and the next frame must still be found.
            match = _CONTENT_LENGTH.search(line)
            if match:
                length = int(match.group(1))
        if length > MAX_MESSAGE_BYTES:
            # Most likely a corrupt header: answer, then resynchronise on the next header instead of
            # swallowing everything the client sends afterwards as one impossible body.
            log.warning("refusing a %d-byte message (limit %d)", length, MAX_MESSAGE_BYTES)
            send_error(protocol, None, INVALID_REQUEST, f"message of {length} bytes exceeds the limit")
            continue
        body = await _read_exactly(source, length)
        if body is None:
            return
        dispatch(protocol, body)


async def _read_exactly(source: Source, n: int) -> bytes | None:
    # Chunked, so a lying Content-Length costs only the bytes that actually arrive.
    parts = []
    left = n
    while left:
        data = await source.read(min(left, CHUNK))
        if not data:
            return None
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def _valid_id(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def dispatch(protocol: Any, body: bytes) -> None:
    """Validate one message body and hand it to pygls; answer any request pygls could not."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:  # includes UnicodeDecodeError
        log.warning("parse error: %s", str(exc)[:200])
        send_error(protocol, None, PARSE_ERROR, f"Parse error: {str(exc)[:200]}")
        return
    if not isinstance(data, dict):
        send_error(protocol, None, INVALID_REQUEST, "Invalid Request: a message must be a JSON object")
        return
    has_id = "id" in data
    msg_id = data.get("id")
    if has_id and not (_valid_id(msg_id) or (msg_id is None and "method" not in data)):
        send_error(protocol, None, INVALID_REQUEST, "Invalid Request: id must be an integer or a string")
        return
    reply_id = msg_id if has_id and "method" in data else None
    if data.get("jsonrpc") != "2.0":
        send_error(protocol, reply_id, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
        return
    method = data.get("method")
    if "method" in data and not isinstance(method, str):
        send_error(protocol, reply_id, INVALID_REQUEST, "Invalid Request: method must be a string")
        return
    if "method" not in data and not has_id:
        send_error(protocol, None, INVALID_REQUEST, "Invalid Request: neither a request nor a response")
        return
    if "params" in data and not isinstance(data["params"], dict | list | type(None)):
        if reply_id is not None:
            send_error(protocol, reply_id, INVALID_PARAMS, "Invalid params: must be an object or an array")
        return
    if method is not None and "params" not in data:
        data = dict(data, params=None)  # pygls's generic message types insist on a params field
    try:
        message = protocol.structure_message(data)
    except JsonRpcException as exc:
        cause = exc.__cause__
        code = INVALID_PARAMS if isinstance(exc, JsonRpcInvalidParams) else INTERNAL_ERROR
        detail = _describe(cause) if cause is not None else str(exc)
        log.warning("could not read %s: %s", method or "response", detail)
        if reply_id is not None:
            send_error(protocol, reply_id, code, f"Invalid params for {method}: {detail}")
        return
    except Exception as exc:  # whatever cattrs raised, the request gets an answer
        log.warning("could not read %s: %s", method or "response", exc)
        if reply_id is not None:
            send_error(protocol, reply_id, INVALID_PARAMS, f"Invalid params for {method}: {exc}")
        return
    if reply_id is not None and getattr(message, "id", None) is None:
        # A notification method sent with an id: pygls would drop the id and never answer.
        send_error(protocol, reply_id, INVALID_REQUEST, f"Invalid Request: {method} is a notification")
        return
    try:
        protocol.handle_message(message)
    except (SystemExit, KeyboardInterrupt):
        raise
    except JsonRpcException as exc:
        log.warning("%s failed: %s", method, exc)
        if reply_id is not None:
            send_error(protocol, reply_id, exc.code, str(exc))
    except Exception as exc:  # the server keeps serving
        log.exception("%s failed", method)
        if reply_id is not None:
            send_error(protocol, reply_id, JsonRpcInternalError.code, f"Internal error: {exc}")


def _describe(exc: BaseException) -> str:
    """A one-line summary of a cattrs validation error: which fields were missing or wrong."""
    try:
        from cattrs import transform_error

        return "; ".join(transform_error(exc))[:500]  # type: ignore[arg-type]
    except Exception:  # not a cattrs error
        return f"{type(exc).__name__}: {exc}"[:500]


def send_error(protocol: Any, msg_id: Any, code: int, message: str) -> None:
    """Write an error response directly (also for id null, which pygls's typed messages cannot)."""
    payload = {"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}
    try:
        protocol._send_data(_Raw(payload))
    except Exception:  # the client is gone; the read loop will see end of stream
        log.debug("could not send error response", exc_info=True)


class _Raw:
    """A plain dict payload that pygls's `_send_data` serialises via `__dict__`."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.__dict__.update(payload)


def exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
