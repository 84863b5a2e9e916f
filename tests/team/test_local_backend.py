"""The replica's queue (`LocalBackend`, which both `serve-engine` paths run): requests that arrive while the
model works become its next batch, however far apart they arrived, or with continuous batching join its
running decode at the next step and are answered as each ends; a lone request on an idle model waits at
most `batch_wait_s` for company. Real engine (the embedded 5M model), real threads, no Ray."""

from __future__ import annotations

import asyncio
import time

import pytest

from dg_lsp.engine.loader import EMBEDDED_TINY_DIR
from dg_lsp.engine.masked import MaskedDiffusionEngine
from dg_lsp.engine.types import InfillRequest, InfillResult
from dg_lsp.team.local import LocalBackend


def _requests(n: int) -> list[InfillRequest]:
    return [InfillRequest(f"def f{i}(x):\n    return ", "\n", 8, doc_key=f"d{i}") for i in range(n)]


def test_requests_that_queue_while_the_model_works_run_as_one_batch():
    """Ray Serve's `@serve.batch` (2.60) cut a batch 5 ms after its first request arrived, so under load
    requests spaced more widely than that ran one or two at a time behind a busy model. Here five requests
    sent 40 ms apart while a long one runs make one batch of five."""
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    backend = LocalBackend(engine, batching=True, max_batch=16, batch_wait_s=0.005)
    long = InfillRequest("def g(y):\n    return ", "\n", max_tokens=128, steps=128, doc_key="long")

    async def scenario() -> list:
        first = asyncio.ensure_future(backend.complete("long", long))
        await asyncio.sleep(0.05)  # the long request is running
        later = []
        for i, request in enumerate(_requests(5)):
            later.append(asyncio.ensure_future(backend.complete(f"r{i}", request)))
            await asyncio.sleep(0.04)
        return await asyncio.gather(first, *later)

    try:
        t0 = time.monotonic()
        results = asyncio.run(scenario())
        took = time.monotonic() - t0
    finally:
        backend.close()
    assert all(isinstance(r, InfillResult) for r in results)
    assert took > 0.25, "the long request ended before the others arrived: the test checks nothing"
    assert list(backend.batch_sizes) == [1, 5]


def test_requests_arriving_while_the_model_works_join_it_and_are_answered_as_they_end():
    """Continuous batching. Ray Serve's `@serve.batch` (2.60) cut a batch 5 ms after its first request
    arrived, so under load requests ran one or two at a time; a static batch then held every answer until
    its slowest member ended, and what arrived meanwhile waited for all of it. Here five short requests
    sent 40 ms apart while a long one runs each join the running decode and are answered long before it
    ends."""
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    backend = LocalBackend(engine, batching=True, max_batch=16, batch_wait_s=0.005, continuous=True)
    long = InfillRequest("def g(y):\n    return ", "\n", max_tokens=128, steps=128, doc_key="long")
    ended: dict[str, float] = {}

    async def timed(rid: str, request: InfillRequest):
        result = await backend.complete(rid, request)
        ended[rid] = time.monotonic()
        return result

    async def scenario() -> list:
        first = asyncio.ensure_future(timed("long", long))
        await asyncio.sleep(0.05)  # the long request is running
        later = []
        for i, request in enumerate(_requests(5)):
            later.append(asyncio.ensure_future(timed(f"r{i}", request)))
            await asyncio.sleep(0.04)
        return await asyncio.gather(first, *later)

    try:
        results = asyncio.run(scenario())
    finally:
        backend.close()
    assert all(isinstance(r, InfillResult) for r in results)
    assert results[0].stats.forward_passes > 20, "the long request was short: the test checks nothing"
    assert all(ended[f"r{i}"] < ended["long"] for i in range(5)), ended
    assert max(backend.batch_sizes) >= 2  # they ran in the long one's forwards
    assert backend.batch_sizes[0] == 1 and backend.batch_sizes[-1] == 1  # it ran alone before and after


@pytest.mark.parametrize("continuous", [False, True], ids=["static", "continuous"])
def test_an_idle_model_waits_for_company_only_as_long_as_asked(continuous):
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    backend = LocalBackend(engine, batching=True, max_batch=16, batch_wait_s=0.3, continuous=continuous)

    async def two_apart(gap: float) -> None:
        a = asyncio.ensure_future(backend.complete("a", _requests(1)[0]))
        await asyncio.sleep(gap)
        await asyncio.gather(a, backend.complete("b", _requests(2)[1]))

    try:
        asyncio.run(two_apart(0.05))  # inside the wait: they start together
        assert backend.batch_sizes[0] == 2
        before = len(backend.batch_sizes)
        asyncio.run(two_apart(0.6))  # past it: the first ran alone, and ended before the second came
        assert set(list(backend.batch_sizes)[before:]) == {1}
    finally:
        backend.close()


def test_a_request_that_cannot_start_fails_alone_and_the_model_keeps_serving(monkeypatch):
    """Continuous batching, fault injection into a real engine: one of three requests arriving together
    cannot be laid out. It fails with its own error; the two others decode, and so does a request sent
    afterwards (a static batch fails as a whole, as before)."""
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    real = engine.canvas

    def canvas(request, length):
        if "BOOM" in request.prefix:
            raise ValueError("this request cannot be laid out")
        return real(request, length)

    monkeypatch.setattr(engine, "canvas", canvas)
    backend = LocalBackend(engine, batching=True, max_batch=16, batch_wait_s=0.2, continuous=True)
    bad = InfillRequest("BOOM = ", "\n", 8, doc_key="bad")

    async def scenario() -> list:
        together = [backend.complete("a", _requests(1)[0]), backend.complete("bad", bad)]
        together.append(backend.complete("c", _requests(3)[2]))
        first = await asyncio.gather(*together, return_exceptions=True)
        return [*first, await backend.complete("d", _requests(4)[3])]

    try:
        a, failed, c, d = asyncio.run(scenario())
    finally:
        backend.close()
    assert isinstance(failed, ValueError) and "cannot be laid out" in str(failed)
    assert all(isinstance(r, InfillResult) for r in (a, c, d))
