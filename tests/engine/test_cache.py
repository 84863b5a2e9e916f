from __future__ import annotations

from dg_lsp.engine.base import budget_prompt
from dg_lsp.engine.cache import LRU, ContinuationCache, common_prefix_len


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2, 3]) == 2


def test_lru_evicts_oldest():
    lru: LRU[int] = LRU(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1
    lru.put("c", 3)
    assert lru.get("b") is None and lru.get("a") == 1 and lru.get("c") == 3
    lru.put(None, 5)
    assert len(lru) == 2


def test_continuation_serves_rest_only_when_typing_along():
    cc = ContinuationCache()
    cc.remember("doc", "x = ", "\n", ["foo(bar)", "fob"])
    assert cc.lookup("doc", "x = fo", "\n") == ["o(bar)", "b"]
    assert cc.lookup("doc", "x = foo(", "\n") == ["bar)"]
    assert cc.lookup("doc", "x = foo(bar)", "\n") is None  # fully typed: nothing left to show
    assert cc.lookup("doc", "x = q", "\n") is None  # diverged
    assert cc.lookup("doc", "x = fo", "\n\n") is None  # suffix changed
    assert cc.lookup("doc", "x = ", "\n") is None  # same position: recompute
    assert cc.lookup("other", "x = fo", "\n") is None
    cc.forget("doc")
    assert cc.lookup("doc", "x = fo", "\n") is None


def test_budget_prompt_cuts_prefix_head_in_stable_chunks():
    suf = list(range(1000, 1100))
    starts = set()
    for n in range(900, 960):
        pre, s = budget_prompt(list(range(n)), suf, budget=1024, chunk=64)
        assert len(pre) + len(s) <= 1024
        assert len(s) == 100 and pre[-1] == n - 1
        starts.add(pre[0])
    assert len(starts) <= 2  # typing 60 tokens moves the cut at most once
    pre, s = budget_prompt([1, 2], [3], budget=1024)
    assert (pre, s) == ([1, 2], [3])
