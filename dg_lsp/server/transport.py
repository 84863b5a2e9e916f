"""Content-Length framing and JSON-RPC envelope checks that survive any byte stream.

pygls's reader drops a malformed message without answering (the editor then waits forever for a
response), allocates whatever `Content-Length` claims, loses the next frame after a short length and
dies on deep nesting. This loop bounds every read and answers each broken request with the JSON-RPC
error the spec prescribes (-32700 parse error, -32600 invalid request, -32602 invalid params) so the
editor is never left waiting and the server keeps serving.

Headers are strict where it matters for security: a web page can make a browser send an HTTP request
to a loopback port, and an HTTP body can carry a perfect LSP message. So only LSP's own header lines
(`Content-Length`, `Content-Type`; any case, LF or CRLF) are accepted, and a connection whose first
non-blank line is anything else (an HTTP request line, `Host:`, garbage) is closed before a single
byte of it reaches the dispatcher. Once a connection has sent one valid frame it has proven to be an
LSP client, and junk between frames (the tail of a frame whose length was too short) is skipped to
resynchronise on the next header, except HTTP request lines and HTTP headers, which still close it.
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

from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

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

FIRST_FRAME_TIMEOUT_S = 10.0
"""A TCP connection that sends no complete frame in this long is closed: it holds the one client slot."""

_CONTENT_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\d{1,15})[ \t]*\r?\n?$", re.IGNORECASE)
_LSP_LENGTH = re.compile(rb"content-length[ \t]*:[ \t]*(\d{1,15})[ \t]*\r?\n", re.IGNORECASE)
_LSP_TYPE = re.compile(rb"content-type[ \t]*:[^\r\n]*\r?\n", re.IGNORECASE)
_REQUEST_LINE = re.compile(rb"[A-Za-z][A-Za-z_-]*[ \t]+\S+[ \t]+HTTP/\d", re.IGNORECASE)
_HEADER_NAME = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:")
_HTTP_PREFIXES = (b"sec-", b"access-control-", b"proxy-", b"x-forwarded-")
HTTP_HEADERS = frozenset(
    b"host origin referer user-agent accept accept-encoding accept-language accept-charset connection "
    b"upgrade cookie authorization cache-control pragma te expect transfer-encoding content-encoding "
    b"content-language keep-alive dnt priority if-none-match if-modified-since range via forwarded "
    b"upgrade-insecure-requests".split()
)

END = "end"
"""`read_frames` outcomes: end of stream, a connection closed for speaking something else, `stop`."""
REJECTED = "rejected"
STOPPED = "stopped"


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


class Rejected(Exception):
    """The peer is not an LSP client; the connection is closed without dispatching anything."""


def _is_http(line: bytes) -> bool:
    """An HTTP request line or an HTTP header: never sent by an LSP client, always by a browser."""
    if _REQUEST_LINE.match(line):
        return True
    match = _HEADER_NAME.match(line)
    if match is None:
        return False
    name = match.group(1).lower()
    return name in HTTP_HEADERS or name.startswith(_HTTP_PREFIXES)


def _header(line: bytes, proven: bool) -> int | None:
    """The length a header line announces (None for other acceptable lines); raise `Rejected`.

    Before the first frame only LSP header lines pass; afterwards other junk is skipped, so the
    stream resynchronises on the next header (a `search`: after a too-short frame the leftover body
    shares a line with the next header).
    """
    if (match := _LSP_LENGTH.fullmatch(line)) is not None:
        return int(match.group(1))
    if _LSP_TYPE.fullmatch(line):
        return None
    if not proven or _is_http(line):
        raise Rejected(line)
    match = _CONTENT_LENGTH.search(line)
    return int(match.group(1)) if match else None


async def read_frames(
    source: Source,
    protocol: Any,
    stop: threading.Event | None = None,
    first_frame_timeout: float | None = None,
) -> str:
    """Read frames until end of stream, a non-LSP peer (`REJECTED`) or `stop`, dispatching each body.

    `first_frame_timeout` bounds the wait for the first complete frame (TCP: a silent connection
    would otherwise hold the only client slot forever).
    """
    proven = False
    while stop is None or not stop.is_set():
        try:
            if proven or first_frame_timeout is None:
                length, body = await _read_frame(source, proven)
            else:
                length, body = await asyncio.wait_for(_read_frame(source, proven), first_frame_timeout)
        except Rejected as exc:
            line = exc.args[0]
            log.warning("closing the connection: not an LSP header (%s): %r", _kind(line), line[:80])
            return REJECTED
        except TimeoutError:
            log.warning("closing the connection: no LSP frame within %.0f s", first_frame_timeout)
            return REJECTED
        if length is None:
            return END
        if body is None:
            # Most likely a corrupt header: answer, then resynchronise on the next header instead of
            # swallowing everything the client sends afterwards as one impossible body.
            log.warning("refusing a %d-byte message (limit %d)", length, MAX_MESSAGE_BYTES)
            send_error(protocol, None, INVALID_REQUEST, f"message of {length} bytes exceeds the limit")
            continue
        proven = True
        dispatch(protocol, body)
    return STOPPED


async def _read_frame(source: Source, proven: bool) -> tuple[int | None, bytes | None]:
    """(length, body) of the next frame; (None, None) at end of stream, (length, None) over the limit."""
    length = await _read_header(source, proven)
    if length is None:
        return None, None
    if length > MAX_MESSAGE_BYTES:
        return length, None
    body = await _read_exactly(source, length)
    return (length, body) if body is not None else (None, None)


async def _read_header(source: Source, proven: bool) -> int | None:
    """The Content-Length of the next frame, or None at end of stream."""
    length: int | None = None
    while True:
        line = await source.readline(MAX_HEADER_LINE)
        if not line:
            return None
        if not line.endswith(b"\n"):
            if not proven:
                raise Rejected(line)
            continue  # a piece of an over-long line (a body read as headers after a bad length)
        if not line.strip():
            if length is not None:
                return length
            continue  # stray blank line (e.g. the tail of a frame whose length was too short)
        announced = _header(line, proven)
        if announced is not None:
            length = announced


def _kind(line: bytes) -> str:
    if _REQUEST_LINE.match(line):
        return "an HTTP request line"
    if _is_http(line):
        return "an HTTP header"
    if not line.endswith(b"\n"):
        return "an over-long line"
    return "not a header"


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
    if getattr(protocol, "_shutdown", False) and method != "exit" and "method" in data:
        # The spec: after `shutdown` every request is an invalid request (pygls drops it unanswered).
        if reply_id is not None:
            send_error(protocol, reply_id, INVALID_REQUEST, f"Invalid Request: {method} after shutdown")
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
            # The reason is in the log; tracebacks and file paths stay on this machine.
            message = f"Internal error ({type(exc).__name__}); see the server log"
            send_error(protocol, reply_id, INTERNAL_ERROR, message)


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
