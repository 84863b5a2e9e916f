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
                while not self._stop and self._load_request is None and not self._pending:
                    self._cond.wait()
                if self._stop:
                    return
                if self._load_request is not None:
                    loader, on_done = self._load_request
                    self._load_request = None
                    job = None
                else:
                    _, job = self._pending.popitem(last=False)
                    self._running = job
            if job is None:
                self._do_load(loader, on_done)
            else:
                self._do_job(job)

    def _do_load(self, loader: Loader, on_done: Callable[[BaseException | None], None]) -> None:
        self._engine = None
        try:
            engine = loader()
            engine.warmup()
        except BaseException as exc:  # the server must survive any loading failure
            log.exception("model load failed")
            with self._cond:
                if self._load_request is None:
                    self.state = WorkerState.FAILED
                    self.error = str(exc)
            on_done(exc)
            return
        with self._cond:
            superseded = self._load_request is not None
            if not superseded:
                self._engine = engine
                self.state = WorkerState.READY
        on_done(None)

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
