"""Running requests on a loaded engine, batched: shared by each Ray replica and the in-process server.

`EngineRunner` turns a list of requests into outcomes with one batched forward per step when the backend
has a batched path (`dg_lsp/engine/batching.py`) and more than one request is waiting. A lone request,
and every request with batching off, takes the engine's own single-request path (`engine.infill`: its
fastest forward, per-document prompt cache and continuation cache), so batching is compared with the
best the engine does one request at a time, not with a batch of one.

`LocalBackend` is the queue in front of the model, in each Ray replica and in the server without Ray
(`dg-lsp serve-engine --no-ray`, and the tests of the HTTP layer): one thread owns the model. By default
whatever queued while it worked is its next batch (static batching). With `continuous`, as GPU LLM
servers batch (llama.cpp's slots, vLLM), whatever arrived joins the running decode at its next step and
each request is answered the step it ends; on a 2-core CPU that measured slower for the diffusion model
(benchmarks/results/team_serve/shipped/continuous/), because rows at different stages share canvas passes
as wide as the widest row's window.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

from dg_lsp.engine.batching import Outcome, batcher_for
from dg_lsp.engine.types import Cancelled, InfillEngine, InfillRequest, InfillResult

log = logging.getLogger(__name__)


DOCUMENTS = 64
"""Documents whose prompt KV and shown suggestion a replica keeps (the engines' default, 8, suits one
editor; 16 typists would evict each other's entries before they came back)."""


class EngineRunner:
    def __init__(self, engine: InfillEngine, batching: bool = True, documents: int = DOCUMENTS) -> None:
        self.engine = engine
        self.batching = batching
        self.batcher = batcher_for(engine)
        keep = getattr(engine, "keep_documents", None)
        if keep is not None:
            keep(documents)
        self.batches = 0
        """Batches run (`run`), or steps of the continuous decode (`LocalBackend`)."""
        self.requests = 0
        self.cancelled = 0
        """Requests stopped between steps (superseded, cancelled by the client, or past their limit)."""

    @property
    def max_batch(self) -> int:
        return 1 if not self.batching or self.batcher is None else 64

    def run(self, requests: Sequence[InfillRequest], cancels: Sequence[Callable[[], bool]]) -> list[Outcome]:
        """One outcome per request: a result, `Cancelled`, or the exception that request raised."""
        self.batches += 1
        self.requests += len(requests)
        out = self._run(requests, cancels)
        self.cancelled += sum(isinstance(o, Cancelled) for o in out)
        return out

    def _run(self, requests: Sequence[InfillRequest], cancels: Sequence[Callable[[], bool]]) -> list[Outcome]:
        if self.batcher is not None and self.batching and len(requests) > 1:
            # as alone: a user typing into the suggestion shown gets its rest with no pass
            out: list[Outcome | None] = [self.engine.continued(r) for r in requests]
            todo = [i for i, o in enumerate(out) if o is None]
            try:
                done = (
                    self.batcher.run([requests[i] for i in todo], [cancels[i] for i in todo]) if todo else []
                )
            except Exception as exc:  # one bad batch fails its requests, not the replica
                log.exception("team server: batch of %d failed", len(todo))
                done = [exc] * len(todo)
            for i, outcome in zip(todo, done, strict=True):
                out[i] = outcome
                if isinstance(outcome, InfillResult):
                    self.engine.shown(requests[i], outcome.candidates)
            return out  # type: ignore[return-value]
        out: list[Outcome] = []
        for request, cancel in zip(requests, cancels, strict=True):
            try:
                out.append(self.engine.infill(request, cancel))
            except Exception as exc:  # Cancelled included
                out.append(exc)
        return out


def hard_stop(request: InfillRequest, is_cancelled: Callable[[], bool]) -> Callable[[], bool]:
    """`should_cancel` for one request: cancelled, or past its deadline (which the engine also uses to
    cap its steps; this stops it between steps if the estimate was wrong)."""
    limit = None if request.deadline_ms is None else time.monotonic() + request.deadline_ms / 1000 + 0.5
    return lambda: is_cancelled() or (limit is not None and time.monotonic() > limit)


class LocalBackend:
    """`api.Backend` in this process: requests queue for one model thread, which decodes them together."""

    def __init__(
        self,
        engine: InfillEngine,
        batching: bool = True,
        max_batch: int = 16,
        batch_wait_s: float = 0.0,
        continuous: bool = False,
    ) -> None:
        self.runner = EngineRunner(engine, batching)
        self.continuous = continuous
        """Continuous batching (`_work_continuously`) instead of static batches."""
        self.max_batch = min(max_batch, self.runner.max_batch)
        self.batch_wait_s = batch_wait_s if self.max_batch > 1 else 0.0
        """How long an idle model, about to start, waits for more requests while fewer than `max_batch` are
        queued. What queued while it worked is its next batch (or, continuous, joins at its next step)
        however far apart it arrived; the wait only gathers requests that arrive together at an idle
        model."""
        self.batch_sizes: deque[int] = deque(maxlen=256)
        """Sizes of the last batches (continuous: requests decoding together in each of the last steps)."""
        self.size_counts: Counter[int] = Counter()
        """How many batches (continuous: steps) ran with each number of requests, since the start."""
        self._cv = threading.Condition()
        self._queue: list[tuple[str, InfillRequest, asyncio.Future, asyncio.AbstractEventLoop]] = []
        self._live: set[str] = set()
        self._cancelled: set[str] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="dg-lsp-team-model", daemon=True)
        self._thread.start()

    async def complete(self, rid: str, request: InfillRequest) -> InfillResult:
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        with self._cv:
            self._live.add(rid)
            self._queue.append((rid, request, future, loop))
            self._cv.notify()
        try:
            return await future
        except asyncio.CancelledError:
            await self.cancel(rid)
            raise

    async def cancel(self, rid: str) -> None:
        with self._cv:
            if rid in self._live:  # unknown ids are not kept: the set stays bounded
                self._cancelled.add(rid)

    async def describe(self) -> dict[str, str]:
        return dict(self.runner.engine.describe())

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _work(self) -> None:
        if self.continuous and self.max_batch > 1 and self.runner.batcher is not None:
            self._work_continuously()
        else:
            self._work_batches()

    def _take(self, room: int, running: bool) -> list[tuple[str, InfillRequest, asyncio.Future, Any]] | None:
        """Up to `room` queued requests, waiting for some while nothing runs; None once closed."""
        with self._cv:
            while not self._queue and not self._closed and not running:
                self._cv.wait()
            if self._closed:
                return None
            if self.batch_wait_s and not running:
                self._cv.wait_for(lambda: len(self._queue) >= room or self._closed, self.batch_wait_s)
            taken, self._queue = self._queue[:room], self._queue[room:]
            return taken

    def _work_batches(self) -> None:
        """Static batching: what queued while the model worked is its next batch (one request at a time
        with batching off)."""
        while (taken := self._take(self.max_batch, running=False)) is not None:
            self.batch_sizes.append(len(taken))
            self.size_counts[len(taken)] += 1
            cancels = [self._stop_for(rid, request) for rid, request, _, _ in taken]
            outcomes = self.runner.run([request for _, request, _, _ in taken], cancels)
            for item, outcome in zip(taken, outcomes, strict=True):
                self._settle_one(item, outcome)

    def _work_continuously(self) -> None:
        """Continuous batching: what queued while the model worked joins the running decode at its next
        step, and each request is answered the step it ends (`batching.MaskedDecoding`/`ARDecoding`)."""
        decoding = self.runner.batcher.decoding()
        waiting: dict[str, tuple[str, InfillRequest, asyncio.Future, Any]] = {}
        while (taken := self._take(self.max_batch - len(decoding), running=len(decoding) > 0)) is not None:
            joining = []
            for item in taken:
                try:
                    typed = self.runner.engine.continued(item[1])  # typing into the suggestion shown: no pass
                except Exception as exc:  # this request's failure, not the others'
                    self._settle_one(item, exc)
                    continue
                self.runner.requests += 1
                if typed is not None:
                    self._settle_one(item, typed)
                    continue
                waiting[item[0]] = item
                joining.append((item[0], item[1], self._stop_for(item[0], item[1])))
            self._join(decoding, joining, waiting)
            if not len(decoding):
                continue
            self.batch_sizes.append(len(decoding))
            self.size_counts[len(decoding)] += 1
            self.runner.batches += 1
            try:
                ended = decoding.step()
            except Exception as exc:  # a failed step fails the requests in it, not the replica
                log.exception("team server: a step of %d requests failed", len(decoding))
                ended = [(rid, exc) for rid in decoding.fail()]
            for rid, outcome in ended:
                item = waiting.pop(rid, None)
                if item is None:
                    continue
                if isinstance(outcome, InfillResult):
                    try:  # remembered for the next keystroke; a failure here costs only that
                        self.runner.engine.shown(item[1], outcome.candidates)
                    except Exception:
                        log.exception("team server: could not keep a suggestion for its document")
                self.runner.cancelled += isinstance(outcome, Cancelled)
                self._settle_one(item, outcome)
        for item in waiting.values():  # closed mid-decode
            self._settle_one(item, Cancelled())

    def _join(self, decoding, joining: list, waiting: dict) -> None:
        """`joining` into the running decode, together (one prefill); if that fails, one by one, so a
        request that cannot start fails alone."""
        if not joining:
            return
        try:
            decoding.add(joining)
            return
        except Exception as exc:
            if len(joining) == 1:
                log.exception("team server: a request could not start")
                self._settle_one(waiting.pop(joining[0][0]), exc)
                return
            log.warning("team server: %d requests could not start together; one by one", len(joining))
        for one in joining:
            try:
                decoding.add([one])
            except Exception as exc:
                log.exception("team server: a request could not start")
                self._settle_one(waiting.pop(one[0]), exc)

    def _stop_for(self, rid: str, request: InfillRequest) -> Callable[[], bool]:
        return hard_stop(request, lambda: rid in self._cancelled)

    def _settle_one(self, item: tuple[str, InfillRequest, asyncio.Future, Any], outcome: Outcome) -> None:
        rid, _, future, loop = item
        with self._cv:
            self._live.discard(rid)
            self._cancelled.discard(rid)
        loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(future: asyncio.Future, outcome: Outcome) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome if not isinstance(outcome, Cancelled) else Cancelled())
    else:
        future.set_result(outcome)


class InProcessServer:
    """The HTTP API on uvicorn in this process around a `LocalBackend`: `serve-engine --no-ray`, and the
    tests of the HTTP layer (a real server on a real socket, without starting Ray)."""

    def __init__(
        self,
        engine: InfillEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        request_timeout_s: float = 30.0,
        batching: bool = True,
        continuous: bool = False,
    ) -> None:
        import socket

        import uvicorn

        from dg_lsp.team.api import MAX_CONCURRENT, make_app

        self.backend = LocalBackend(engine, batching, continuous=continuous)
        app = make_app(lambda: self.backend, token=token, host=host, request_timeout_s=request_timeout_s)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host, self.port = host, self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            limit_concurrency=MAX_CONCURRENT + 8,
            timeout_keep_alive=5,
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        self.server.run(sockets=[self._sock])

    def start(self) -> InProcessServer:
        self._thread = threading.Thread(target=self.serve_forever, name="dg-lsp-team-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the in-process team server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self.backend.close()
        self._sock.close()
