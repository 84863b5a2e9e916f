"""The model worker with a real tiny DiffusionGemma: newest job per document wins, cancels are honoured."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from dg_lsp.engine.loader import ModelLoadError, load_engine
from dg_lsp.engine.types import Cancelled, InfillRequest
from dg_lsp.server.worker import ModelWorker, NotReady, WorkerState
from dg_lsp.settings import Settings


def _ready_worker(model_dir) -> ModelWorker:
    worker = ModelWorker()
    done = threading.Event()
    worker.load(lambda: load_engine(Settings(model=str(model_dir))), lambda err: done.set())
    assert done.wait(120)
    assert worker.state is WorkerState.READY
    return worker


def test_submit_before_load_is_not_ready():
    worker = ModelWorker()
    with pytest.raises(NotReady):
        worker.submit("doc", lambda engine, cancel: None)
    worker.stop()


def test_failed_load_keeps_worker_alive(tmp_path):
    worker = ModelWorker()
    errors = []
    done = threading.Event()
    worker.load(
        lambda: load_engine(Settings(model=str(tmp_path / "absent"))),
        lambda e: (errors.append(e), done.set()),
    )
    assert done.wait(30)
    assert isinstance(errors[0], ModelLoadError)
    assert worker.state is WorkerState.FAILED
    with pytest.raises(NotReady):
        worker.submit("doc", lambda engine, cancel: None)
    worker.stop()


def test_newer_job_for_same_document_supersedes_older(tiny_model_dir):
    worker = _ready_worker(tiny_model_dir)
    started = threading.Event()
    release = threading.Event()

    def blocking(engine, should_cancel):
        started.set()
        release.wait(10)
        return "first"

    worker.submit("other", blocking)
    assert started.wait(10)
    old = worker.submit("doc", lambda engine, cancel: "old")
    new = worker.submit("doc", lambda engine, cancel: "new")
    assert old.future.cancelled()
    release.set()
    assert new.future.result(30) == "new"
    worker.stop()


def test_cancel_stops_denoising_between_steps(tiny_model_dir):
    worker = _ready_worker(tiny_model_dir)
    steps_seen = []

    def run(engine, should_cancel):
        def check():
            steps_seen.append(time.monotonic())
            return len(steps_seen) >= 2  # cancel after the second step

        return engine.infill(InfillRequest(prefix="x = ", suffix="\n", max_tokens=32, steps=50), check)

    job = worker.submit("doc", run)
    with pytest.raises(Cancelled):
        job.future.result(60)
    assert len(steps_seen) == 2
    worker.stop()


def test_model_exception_fails_only_that_request(tiny_model_dir):
    worker = _ready_worker(tiny_model_dir)

    def broken(engine, should_cancel):
        raise RuntimeError("boom")

    job = worker.submit("doc", broken)
    with pytest.raises(RuntimeError):
        job.future.result(30)
    ok = worker.submit(
        "doc", lambda engine, cancel: engine.infill(InfillRequest(prefix="a", suffix="", max_tokens=4))
    )
    assert ok.future.result(60).stats.forward_passes >= 1
    worker.stop()


def test_a_stalled_load_is_abandoned_for_a_newer_one(tiny_model_dir):
    """A load that never returns (here: blocked on an event nobody sets) must not wedge the worker."""
    worker = ModelWorker()
    stalled = threading.Event()
    never = threading.Event()
    outcomes: list = []

    def stalls():
        stalled.set()
        never.wait(60)
        raise AssertionError("the stalled load was not abandoned")

    worker.load(stalls, outcomes.append)
    assert stalled.wait(10)
    done = threading.Event()
    worker.load(
        lambda: load_engine(Settings(model=str(tiny_model_dir))), lambda e: (outcomes.append(e), done.set())
    )
    assert done.wait(120)
    assert type(outcomes[0]).__name__ == "LoadSuperseded" and outcomes[1] is None
    assert worker.state is WorkerState.READY
    job = worker.submit("doc", lambda engine, cancel: engine.name)
    assert job.future.result(30) == "diffusion-gemma"
    never.set()
    worker.stop()


def test_load_errors_always_have_text():
    worker = ModelWorker()
    done = threading.Event()
    errors: list = []

    def empty_error():
        raise MemoryError()

    worker.load(empty_error, lambda e: (errors.append(e), done.set()))
    assert done.wait(30)
    assert worker.state is WorkerState.FAILED and worker.error == "MemoryError"
    worker.stop()


def test_forget_drops_a_closed_documents_caches(tiny_model_dir):
    worker = _ready_worker(tiny_model_dir)
    engine = worker.engine
    request = InfillRequest("def f(x):\n    return ", "\n", max_tokens=4, steps=2)
    for key in ("a.py", "b.py"):
        job = worker.submit(key, lambda e, c, key=key: e.infill(dataclasses.replace(request, doc_key=key), c))
        job.future.result(60)
    assert engine.prompt_cache.get("a.py") is not None and engine.prompt_cache.get("b.py") is not None
    worker.forget("a.py")
    job = worker.submit("b.py", lambda e, c: None)  # runs after the forget: the queue is in order
    job.future.result(30)
    assert engine.prompt_cache.get("a.py") is None and engine.continuations.lookup("a.py", "x", "") is None
    assert engine.prompt_cache.get("b.py") is not None
    worker.stop()
