"""A typing storm against a real server: bursts of keystrokes, each followed by completion requests,
with cancels and pauses, like a fast typist in an editor that asks for ghost text on every key.

Shared by the CI test (a short storm, behaviour only) and benchmarks/reliability_storm.py (a full
minute, with figures). The client keeps its own copy of the text and checks the server's copy at the
end through code actions (see probes.py).
"""

from __future__ import annotations

import queue
import random
import statistics
import time
from dataclasses import dataclass, field

from tests.reliability.probes import offset_of, todo_line
from tests.reliability.rawlsp import (
    RawServer,
    change_params,
    inline_params,
    open_params,
    pos,
    rng,
    vm_rss_kib,
)

URI = "file:///storm/typing.py"
START = "import os\n\n\ndef work(a, b):\n    total = 0\n    # TODO storm\n"
SNIPPET = "for item in range(a):\n    total += item * b\nif total > 10:\n    return total\n"


@dataclass
class StormResult:
    seconds: float = 0.0
    edits: int = 0
    requests: int = 0
    cancels: int = 0
    answered: int = 0
    cancelled_answers: int = 0
    empty: int = 0
    superseded: int = 0
    superseded_empty: int = 0
    newest_latency_ms: list[float] = field(default_factory=list)
    max_outstanding: int = 0
    rss_kib: list[tuple[float, int]] = field(default_factory=list)
    final_text: str = ""

    def summary(self) -> dict:
        lat = sorted(self.newest_latency_ms)
        rss = [kib for _, kib in self.rss_kib]
        return {
            "seconds": round(self.seconds, 1),
            "edits": self.edits,
            "requests": self.requests,
            "cancels": self.cancels,
            "messages_per_s": round((self.edits + self.requests + self.cancels) / self.seconds, 1),
            "requests_answered_per_s": round(self.answered / self.seconds, 1),
            "empty_share": round(self.empty / max(1, self.answered), 3),
            "superseded": self.superseded,
            "superseded_answered_empty_share": round(self.superseded_empty / max(1, self.superseded), 3),
            "cancelled_answers": self.cancelled_answers,
            "newest_p50_ms": round(statistics.median(lat), 1) if lat else None,
            "newest_p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
            "newest_samples": len(lat),
            "max_outstanding_requests": self.max_outstanding,
            "rss_start_mib": round(rss[0] / 1024, 1) if rss else None,
            "rss_max_mib": round(max(rss) / 1024, 1) if rss else None,
            "rss_end_mib": round(rss[-1] / 1024, 1) if rss else None,
            "rss_growth_mib": round((rss[-1] - rss[0]) / 1024, 1) if rss else None,
        }


class _Doc:
    """The client's copy of the text, edited exactly like the editor would."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.cursor = len(text)
        self.version = 1

    def position(self, offset: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, offset)
        start = self.text.rfind("\n", 0, offset) + 1
        return line, len(self.text[start:offset].encode("utf-16-le")) // 2

    def edit(self, start: int, end: int, new: str) -> dict:
        change = {"range": rng(self.position(start), self.position(end)), "text": new}
        self.text = self.text[:start] + new + self.text[end:]
        self.cursor = start + len(new)
        self.version += 1
        return change


def run_storm(
    server: RawServer,
    seconds: float,
    keys_per_s: float = 25.0,
    seed: int = 0,
    rss_every_s: float = 1.0,
) -> StormResult:
    """Type for `seconds` (bounded), then wait (bounded) for every answer and check the server's text."""
    rng_ = random.Random(seed)
    doc = _Doc(START)
    server.notify("textDocument/didOpen", open_params(URI, doc.text))
    result = StormResult()
    sent: dict[int, tuple[float, int]] = {}  # id -> (sent at, document version when sent)
    newest: set[int] = set()  # the last request of each burst: its latency is what the user feels
    last_version_sent_at: dict[int, float] = {}
    snippet_at = 0
    started = time.monotonic()
    next_rss = started
    pending_cancel: int | None = None

    def collect(block_s: float = 0.0) -> None:
        deadline = time.monotonic() + block_s
        while True:
            try:
                message = server.inbox.get(timeout=max(0.0, deadline - time.monotonic()) or 0.001)
            except queue.Empty:
                return
            msg_id = message.get("id")
            if msg_id not in sent:
                continue
            at, version = sent.pop(msg_id)
            result.answered += 1
            if "error" in message:
                assert message["error"]["code"] == -32800, message  # RequestCancelled, nothing else
                result.cancelled_answers += 1
                continue
            items = (message.get("result") or {}).get("items") or []
            result.empty += not items
            superseded = (
                version < doc.version and last_version_sent_at.get(version + 1, 1e18) < message["_received"]
            )
            if superseded:
                result.superseded += 1
                result.superseded_empty += not items
            if msg_id in newest:
                result.newest_latency_ms.append((message["_received"] - at) * 1000)

    while time.monotonic() - started < seconds:
        burst = rng_.randint(3, 15)
        last_id = None
        for _ in range(burst):
            if rng_.random() < 0.12 and doc.cursor > len(START):
                change = doc.edit(doc.cursor - 1, doc.cursor, "")  # backspace
            else:
                ch = SNIPPET[snippet_at % len(SNIPPET)]
                snippet_at += 1
                change = doc.edit(doc.cursor, doc.cursor, ch)
            server.notify("textDocument/didChange", change_params(URI, doc.version, [change]))
            last_version_sent_at[doc.version] = time.monotonic()
            result.edits += 1
            line, character = doc.position(doc.cursor)
            msg_id = server.request_async(
                "textDocument/inlineCompletion", inline_params(URI, line, character, True)
            )
            sent[msg_id] = (time.monotonic(), doc.version)
            result.requests += 1
            if rng_.random() < 0.25:
                cid = server.request_async(
                    "textDocument/completion",
                    {"textDocument": {"uri": URI}, "position": pos(line, character)},
                )
                sent[cid] = (time.monotonic(), doc.version)
                result.requests += 1
            if pending_cancel is not None and rng_.random() < 0.3:
                server.cancel(pending_cancel)  # the editor gives up on the previous request
                result.cancels += 1
            pending_cancel = msg_id
            last_id = msg_id
            result.max_outstanding = max(result.max_outstanding, len(sent))
            collect(block_s=1.0 / keys_per_s)
        if last_id is not None:
            newest.add(last_id)
            pending_cancel = None
        collect(block_s=rng_.uniform(0.2, 0.8))  # the typist pauses: ghost text should appear now
        if time.monotonic() >= next_rss:
            result.rss_kib.append((time.monotonic() - started, vm_rss_kib(server.pid)))
            next_rss += rss_every_s
    result.seconds = time.monotonic() - started
    deadline = time.monotonic() + 60
    while sent and time.monotonic() < deadline:
        collect(block_s=0.5)
    assert not sent, f"{len(sent)} requests never answered"
    result.rss_kib.append((time.monotonic() - started, vm_rss_kib(server.pid)))
    # Finally, one word into the TODO line, then compare the server's text with ours.
    todo = doc.text.index("# TODO storm") + len("# TODO storm")
    change = doc.edit(todo, todo, " done")
    server.notify("textDocument/didChange", change_params(URI, doc.version, [change]))
    result.final_text = doc.text
    check_text(server, doc.text)
    return result


def check_text(server: RawServer, text: str) -> None:
    """Every line's start and end offset, and the TODO line's content, as the server sees them."""
    lines = text.split("\n")
    offset = 0
    for number, line in enumerate(lines):
        assert offset_of(server, URI, number, 0) == offset, f"line {number} starts elsewhere"
        assert offset_of(server, URI, number, 10**6) == offset + len(line), f"line {number} length differs"
        offset += len(line) + 1
    todo_number = next(i for i, line in enumerate(lines) if "# TODO storm" in line)
    assert todo_line(server, URI, todo_number) == "# TODO storm done"
