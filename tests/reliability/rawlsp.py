"""A raw JSON-RPC client for a real `dg-lsp` process: bytes in, parsed frames out.

pygls's client refuses to send malformed traffic, so the reliability tests frame messages by hand.
A reader thread parses the server's stdout strictly (a framing bug on the server side shows up as
a `FramingError`), answers server→client requests the way an editor would, and queues the rest.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any


class FramingError(AssertionError):
    """The server wrote something that is not a valid LSP frame."""


def frame(body: bytes | str) -> bytes:
    if isinstance(body, str):
        body = body.encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def encode(message: dict[str, Any]) -> bytes:
    return frame(json.dumps(message))


def vm_rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc (KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class RawServer:
    """`python -m dg_lsp [args]` with pipes, stderr to a file, and a frame-parsing reader thread."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dg_lsp", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=full_env,
        )
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.notifications: list[dict[str, Any]] = []
        self.server_requests: list[dict[str, Any]] = []
        self.framing_error: str | None = None
        self._ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="raw-lsp-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- writing -------------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        with self._write_lock:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(encode(message))

    def notify(self, method: str, params: Any = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def request_async(self, method: str, params: Any = None) -> int:
        msg_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return msg_id

    def request(self, method: str, params: Any = None, timeout: float = 60) -> dict[str, Any]:
        return self.wait_response(self.request_async(method, params), timeout)

    def cancel(self, msg_id: int) -> None:
        self.notify("$/cancelRequest", {"id": msg_id})

    # -- reading -------------------------------------------------------------------------------

    def wait_response(self, msg_id: Any, timeout: float = 60) -> dict[str, Any]:
        """The response with this id; other responses stay queued for their own waiters."""
        deadline = time.monotonic() + timeout
        stash = []
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no response to id {msg_id!r} within {timeout}s{self._why()}")
                try:
                    message = self.inbox.get(timeout=min(left, 0.5))
                except queue.Empty:
                    if self.framing_error:
                        raise FramingError(self.framing_error) from None
                    continue
                if message.get("id") == msg_id:
                    return message
                stash.append(message)
        finally:
            for message in stash:
                self.inbox.put(message)

    def responses(self, ids: list[Any], timeout: float = 60) -> dict[Any, dict[str, Any]]:
        wanted = set(ids)
        got: dict[Any, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while wanted - got.keys():
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(map(str, wanted - got.keys()))[:10]
                raise TimeoutError(f"no response to ids {missing} within {timeout}s{self._why()}")
            try:
                message = self.inbox.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.framing_error:
                    raise FramingError(self.framing_error) from None
                continue
            if message.get("id") in wanted:
                got[message["id"]] = message
        return got

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.inbox.get_nowait())
            except queue.Empty:
                return out

    def _why(self) -> str:
        code = self.proc.poll()
        return "" if code is None else f" (server exited with {code})"

    def _read_loop(self) -> None:
        out = self.proc.stdout
        try:
            while True:
                length = None
                while True:
                    line = out.readline()
                    if not line:
                        return
                    if line == b"\r\n":
                        break
                    if not line.endswith(b"\r\n"):
                        raise FramingError(f"header line without CRLF: {line[:80]!r}")
                    name, _, value = line.decode("ascii").partition(":")
                    if name.lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    raise FramingError("frame without Content-Length")
                body = out.read(length)
                if len(body) < length:
                    return
                message = json.loads(body)
                if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
                    raise FramingError(f"not a JSON-RPC 2.0 message: {body[:200]!r}")
                self._dispatch(message)
        except FramingError as exc:
            self.framing_error = str(exc)
        except Exception as exc:  # recorded for the test to fail on
            self.framing_error = f"{type(exc).__name__}: {exc}"

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "method" in message and "id" in message:  # a request from the server: answer like an editor
            self.server_requests.append(message)
            result: Any = {"applied": True} if message["method"] == "workspace/applyEdit" else None
            try:
                self.send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            except OSError:
                pass
        elif "method" in message:
            self.notifications.append(message)
        else:
            message["_received"] = time.monotonic()  # for latency figures; never sent anywhere
            self.inbox.put(message)

    # -- lifecycle -----------------------------------------------------------------------------

    def initialize(
        self,
        options: dict[str, Any] | None = None,
        capabilities: dict | None = None,
        process_id: int | None = None,
    ) -> dict:
        caps = capabilities if capabilities is not None else {"window": {"workDoneProgress": True}}
        params = {"processId": process_id, "rootUri": None, "capabilities": caps}
        reply = self.request("initialize", dict(params, initializationOptions=options or {}), timeout=60)
        self.notify("initialized", {})
        return reply

    def load_results(self) -> list[str]:
        """Messages of every model-load progress `end` so far ('ready' or 'failed: ...')."""
        out = []
        for note in list(self.notifications):
            value = (note.get("params") or {}).get("value") or {}
            if note.get("method") == "$/progress" and value.get("kind") == "end":
                out.append(value.get("message", ""))
        return out

    def wait_loaded(self, timeout: float = 120, count: int = 1) -> str:
        """Wait for the `count`-th model load to finish; return its message."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            results = self.load_results()
            if len(results) >= count:
                return results[count - 1]
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode} while loading")
            time.sleep(0.05)
        raise TimeoutError("model never finished loading")

    def messages(self, kind: int | None = None) -> list[str]:
        """`window/showMessage` texts (1 = error, 2 = warning)."""
        return [
            n["params"]["message"]
            for n in self.notifications
            if n.get("method") == "window/showMessage" and (kind is None or n["params"]["type"] == kind)
        ]

    def shutdown(self, timeout: float = 30) -> int:
        self.request("shutdown", None, timeout=timeout)
        self.notify("exit")
        return self.wait_exit(timeout)

    def wait_exit(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._log.close()


def open_params(uri: str, text: str, language: str = "python", version: int = 1) -> dict[str, Any]:
    return {"textDocument": {"uri": uri, "languageId": language, "version": version, "text": text}}


def change_params(uri: str, version: int, changes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}


def pos(line: int, character: int) -> dict[str, int]:
    return {"line": line, "character": character}


def rng(start: tuple[int, int], end: tuple[int, int]) -> dict[str, Any]:
    return {"start": pos(*start), "end": pos(*end)}


def inline_params(uri: str, line: int, character: int, automatic: bool = False) -> dict[str, Any]:
    return {
        "textDocument": {"uri": uri},
        "position": pos(line, character),
        "context": {"triggerKind": 2 if automatic else 1},
    }


def code_action_params(uri: str, start: tuple[int, int], end: tuple[int, int]) -> dict[str, Any]:
    return {"textDocument": {"uri": uri}, "range": rng(start, end), "context": {"diagnostics": []}}
