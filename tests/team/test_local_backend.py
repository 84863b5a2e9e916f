"""The replica's queue (`LocalBackend`, which both `serve-engine` paths run): requests that arrive while the
model works become its next batch, however far apart they arrived; a lone request on an idle model waits
at most `batch_wait_s` for company. Real engine (the embedded 5M model), real threads, no Ray."""

from __future__ import annotations

import asyncio
import time

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


def test_an_idle_model_waits_for_company_only_as_long_as_asked():
    engine = MaskedDiffusionEngine(EMBEDDED_TINY_DIR, use_continuation_cache=False)
    backend = LocalBackend(engine, batching=True, max_batch=16, batch_wait_s=0.3)

    async def two_apart(gap: float) -> None:
        a = asyncio.ensure_future(backend.complete("a", _requests(1)[0]))
        await asyncio.sleep(gap)
        await asyncio.gather(a, backend.complete("b", _requests(2)[1]))

    try:
        asyncio.run(two_apart(0.05))  # inside the wait: one batch of two
        assert list(backend.batch_sizes) == [2]
        asyncio.run(two_apart(0.6))  # past it: the first ran alone
        assert list(backend.batch_sizes) == [2, 1, 1]
    finally:
        backend.close()
