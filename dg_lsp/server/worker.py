"""The one thread that owns the resident model.

Like a llama.cpp server slot: the event loop never touches the model, it hands jobs to this worker
and awaits their futures. One pending job per key (document): a newer job for the same document
cancels the older one, whether it is still queued or already denoising, because its answer could
only be shown at a cursor position that no longer exists.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dg_lsp.engine.loader import error_text
from dg_lsp.engine.types import Cancelled, InfillEngine

log = logging.getLogger(__name__)

JobFn = Callable[[InfillEngine, Callable[[], bool]], Any]
Loader = Callable[[], InfillEngine]


class WorkerState(enum.Enum):
    IDLE = "idle"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class NotReady(Exception):
    """The model is loading or failed to load; callers answer empty at once."""


class LoadSuperseded(Exception):
    """A load was abandoned for a newer one before it finished; nothing for the user to fix."""


@dataclass
class Job:
    key: str
    fn: JobFn
    future: Future = field(default_factory=Future)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        self.cancel_event.set()
        self.future.cancel()


class ModelWorker:
    """Loads the engine in its own thread, then runs jobs one at a time, newest per key."""

    def __init__(self, max_pending: int = 64):
        self._cond = threading.Condition()
        self._pending: OrderedDict[str, Job] = OrderedDict()
        self._running: Job | None = None
        self._engine: InfillEngine | None = None
        self._load_request: tuple[Loader, Callable[[BaseException | None], None]] | None = None
        self._stop = False
        self._forget: set[str] = set()
        self.state = WorkerState.IDLE
        self.error: str | None = None
        self.max_pending = max_pending
        self.completed = 0
        self.cancelled = 0
        self.failed = 0
        self.peak_pending = 0
        self._thread = threading.Thread(target=self._run, name="dg-lsp-model", daemon=True)
        self._thread.start()

    # -- control -------------------------------------------------------------------------------------

    def load(self, loader: Loader, on_done: Callable[[BaseException | None], None] = lambda e: None) -> None:
        """Ask the worker to (re)load its engine; jobs submitted meanwhile get `NotReady`."""
        with self._cond:
            self.state = WorkerState.LOADING
            self.error = None
            for job in self._pending.values():
                job.cancel()
            self._pending.clear()
            if self._running is not None:
                self._running.cancel()
            self._load_request = (loader, on_done)
            self._cond.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stop = True
            for job in self._pending.values():
                job.cancel()
            self._pending.clear()
            if self._running is not None:
                self._running.cancel()
            self._cond.notify_all()
        self._thread.join(timeout)
        self.state = WorkerState.STOPPED

    @property
    def engine(self) -> InfillEngine | None:
        return self._engine

    def submit(self, key: str, fn: JobFn) -> Job:
        """Queue `fn(engine, should_cancel)`; supersede any older job with the same key."""
        with self._cond:
            if self.state is not WorkerState.READY:
                raise NotReady(self.error or f"model is {self.state.value}")
            old = self._pending.pop(key, None)
            if old is not None:
                old.cancel()
            if self._running is not None and self._running.key == key:
                self._running.cancel()
            while len(self._pending) >= self.max_pending:
                _, oldest = self._pending.popitem(last=False)
                oldest.cancel()
            job = Job(key, fn)
            self._pending[key] = job
            self.peak_pending = max(self.peak_pending, len(self._pending))
            self._cond.notify_all()
            return job

    def forget(self, key: str) -> None:
        """Drop what the engine caches for a closed document, on the worker thread that uses the caches."""
        with self._cond:
            if len(self._forget) < 10_000:
                self._forget.add(key)
            self._cond.notify_all()

    def cancel_key(self, key: str) -> None:
        with self._cond:
            job = self._pending.pop(key, None)
            if job is not None:
                job.cancel()
            if self._running is not None and self._running.key == key:
                self._running.cancel()

    # -- thread --------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stop or self._load_request or self._pending or self._forget):
                    self._cond.wait()
                if self._stop:
                    return
                forget, self._forget = self._forget, set()
                load, job = None, None
                if forget:
                    pass  # first, so that a closed document's caches go before the next job runs
                elif self._load_request is not None:
                    load, self._load_request = self._load_request, None
                else:
                    _, job = self._pending.popitem(last=False)
                    self._running = job
            if forget:
                _forget_documents(self._engine, forget)
            elif load is not None:
                self._do_load(*load)
            elif job is not None:
                self._do_job(job)

    def _do_load(self, loader: Loader, on_done: Callable[[BaseException | None], None]) -> None:
        """Load on a helper thread and wait for it, or for a newer load request or `stop`.

        A load can stall where nothing can interrupt it (a network file system, a file that turned into
        a FIFO after the checks): the worker then abandons it, so a newer model still loads, and the
        stalled thread's engine, should it ever finish, is dropped.
        """
        self._engine = None
        outcome: list[InfillEngine | BaseException] = []

        def load() -> None:
            try:
                engine = loader()
                engine.warmup()
                result: InfillEngine | BaseException = engine
            except BaseException as exc:  # the server must survive any loading failure
                log.error("model load failed: %s", error_text(exc), exc_info=True)
                result = exc
            with self._cond:
                outcome.append(result)
                self._cond.notify_all()

        threading.Thread(target=load, name="dg-lsp-load", daemon=True).start()
        with self._cond:
            while not outcome and self._load_request is None and not self._stop:
                self._cond.wait()
            if not outcome:
                log.warning("abandoning a model load that has not finished, for a newer request")
                abandoned: BaseException | None = LoadSuperseded("superseded before it finished loading")
            elif isinstance(outcome[0], BaseException):
                abandoned = outcome[0]
                if self._load_request is None:
                    self.state = WorkerState.FAILED
                    self.error = error_text(abandoned)
            else:
                abandoned = None
                if self._load_request is None:
                    self._engine = outcome[0]
                    self.state = WorkerState.READY
        on_done(abandoned)

    def _do_job(self, job: Job) -> None:
        try:
            if job.cancel_event.is_set() or not job.future.set_running_or_notify_cancel():
                self.cancelled += 1
                return
            engine = self._engine
            if engine is None:
                job.future.set_exception(NotReady("model unloaded"))
                return
            try:
                result = job.fn(engine, job.cancel_event.is_set)
            except Cancelled:
                self.cancelled += 1
                job.future.set_exception(Cancelled())
            except BaseException as exc:  # a model exception fails this request, not the server
                log.exception("inference failed")
                self.failed += 1
                job.future.set_exception(exc)
            else:
                self.completed += 1
                job.future.set_result(result)
        finally:
            with self._cond:
                self._running = None


def _forget_documents(engine: InfillEngine | None, keys: set[str]) -> None:
    """Per-document caches are bounded LRUs, but a closed document's entries should not wait to age out."""
    for name in ("continuations", "prompt_cache"):
        cache = getattr(engine, name, None)
        drop = getattr(cache, "forget", None) or getattr(cache, "pop", None)
        if drop is None:
            continue
        for key in keys:
            drop(key)
